#!/usr/bin/env python3
"""Diagnosis and tuning of the Triton kernels on a CUDA GPU (a device aid, not a test).

    python3 tools/gpu/tune_kernels.py rot d64 decode pdl stage [--json OUT]

rot:    rotate_halves alone (the in-kernel rotation) against torch for every tile shape the kernels
        use, with the first-row extraction the store kernel does, under several num_warps.
d64:    the head_dim-64 store and chunk-attention checks of debug_kernels.py under several
        num_warps for the store and stage kernels.
decode: split-KV decode time over (warps, page pipeline depth, register cap, programs per SM),
        then the exact tail's tiles, then the split reduction's launch, on the benchmark shapes
        (Qwen2.5-7B: 28/4 heads, head_dim 128; two of them with exact tails), each variant's
        output checked against the default launch's, with registers/spills/shared memory per
        variant and each kernel's own time at the default launch.
pdl:    programmatic dependent launch against stream order (sm90+), default options otherwise,
        on the decode sweep's shapes: both times and how far the outputs are apart.
stage:  chunk attention's stage kernel over (warps, pipeline stages) for a 2048-query chunk after
        0, 8k and 30k cached tokens, each variant checked against the default launch's output,
        next to bf16 FlashAttention.
window: the decode window's programs per (row, kv head) x its tiles (rows per tile, pipeline
        depth), on points with windows of 0, 63, 191 and 254 rows (8-bit, 0..255 in serving): the
        whole call and each kernel's time, each variant's output checked against the default's.
"""

import argparse
import itertools
import json
import math
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, "tests")
sys.path.insert(0, "tools/gpu")

from s4kv import format as fmt  # noqa: E402
from s4kv import kernels  # noqa: E402
from s4kv.kernels import decode as dec  # noqa: E402
from s4kv.kernels.quant import rotate_halves  # noqa: E402


@triton.jit
def _rot_probe(x_ptr, r_ptr, y_ptr, row0_ptr, M: tl.constexpr, HALF: tl.constexpr, OP: tl.constexpr,
               INV: tl.constexpr, TRANSPOSE: tl.constexpr, TF32: tl.constexpr):
    m = tl.arange(0, M)
    c = tl.arange(0, HALF)
    x_lo = tl.load(x_ptr + m[:, None] * 2 * HALF + c[None, :])
    x_hi = tl.load(x_ptr + m[:, None] * 2 * HALF + HALF + c[None, :])
    y_lo, y_hi = rotate_halves(x_lo, x_hi, r_ptr, HALF, OP, INV, TRANSPOSE, TF32)
    tl.store(y_ptr + m[:, None] * 2 * HALF + c[None, :], y_lo)
    tl.store(y_ptr + m[:, None] * 2 * HALF + HALF + c[None, :], y_hi)
    first = m[:, None] == 0
    tl.store(row0_ptr + c, tl.sum(tl.where(first, y_lo, 0.0), axis=0))
    tl.store(row0_ptr + HALF + c, tl.sum(tl.where(first, y_hi, 0.0), axis=0))


def probe_rotation(results):
    tl_of = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}
    # the shapes the kernels use: store and stage (128 rows), 64-row tiles, decode (16)
    uses = ((128, None, False), (64, None, False), (64, torch.float32, True), (16, None, False),
            (16, torch.float32, True))
    for d, (m, op, transpose), dtype, nw in itertools.product((64, 128), uses, (torch.bfloat16, torch.float16),
                                                           (2, 4, 8)):
        if op is not None:
            if dtype == torch.float16:
                continue
            dtype = op
        g = torch.Generator(device="cuda").manual_seed(d + m)
        x = torch.randn(m, d, device="cuda", generator=g).to(dtype)
        r = fmt.rotation_pm1(d, device="cuda", dtype=dtype).contiguous()
        y = torch.empty(m, d, device="cuda", dtype=torch.float32)
        row0 = torch.empty(d, device="cuda", dtype=torch.float32)
        try:
            _rot_probe[(1,)](x, r, y, row0, M=m, HALF=d // 2, OP=tl_of[dtype], INV=1 / math.sqrt(d),
                             TRANSPOSE=transpose, TF32=transpose, num_warps=nw)  # tf32: the reduction's
            torch.cuda.synchronize()
        except Exception as e:  # a compile failure is an answer too
            print(f"rot d={d} m={m} {dtype} T={transpose} nw={nw}: {type(e).__name__} {e}"[:300], flush=True)
            continue
        rf = r.float() / math.sqrt(d)
        ref = x.float() @ (rf.T if transpose else rf)
        err = (y - ref).abs().max().item() / ref.abs().max().item()
        err0 = (row0 - ref[0]).abs().max().item() / ref.abs().max().item()
        bad = err > 2e-2 or err0 > 2e-2
        results.append(dict(probe="rot", d=d, m=m, dtype=str(dtype), transpose=transpose, num_warps=nw,
                            err=err, err_row0=err0))
        print(f"rot d={d} m={m:3d} {str(dtype):15s} T={transpose!s:5} nw={nw}: rel err {err:.1e} row0 {err0:.1e}"
              f"{'   <-- WRONG' if bad else ''}", flush=True)


def probe_d64(results, opts):
    """One launch configuration per process: an illegal address poisons the CUDA context."""
    import debug_kernels as dk

    for kernel, value in opts.items():
        if value:
            kernels.LAUNCH[(kernel, 64)] = value
    print(f"=== d=64 launch options {kernels.LAUNCH}", flush=True)
    for dtype in (torch.bfloat16, torch.float16):
        dk.check_store(64, dtype)
        first_key_mismatch(dtype)
    for hq, hkv in ((9, 3), (7, 1), (4, 4)):
        print(f"steps hq={hq} hkv={hkv} d=64", flush=True)
        dk.check_steps(hq, hkv, 64, torch.bfloat16)
    kernels.LAUNCH.clear()


def first_key_mismatch(dtype, d=64, hkv=3):
    """Where the stored first keys differ from s4kv.format's (rotated basis, as stored)."""
    from s4kv.kernels.batch import S4KVMetadata, plan_launch
    from s4kv.kernels.store import quantize_rows, store_blocks

    g = torch.Generator().manual_seed(0)
    n, bs = 2 * 128 + 5, 128
    k = torch.randn(n, hkv, d, generator=g).to(dtype)
    v = torch.randn(n, hkv, d, generator=g).to(dtype)
    lay = fmt.PageLayout(d)
    regions = torch.zeros(8, hkv, lay.region_bytes, dtype=torch.uint8, device="cuda")

    def i32(x, dev="cuda"):
        return torch.tensor(x, dtype=torch.int32, device=dev)

    md = S4KVMetadata(1, n, n, n, i32([0, n]), i32([n]), i32([[5, 2, 7, 0, 0, 0]]),
                      i32([0, n], "cpu"), i32([n], "cpu"))
    plan_launch(md, hkv, num_sms=132)
    store_blocks(quantize_rows(k.cuda(), v.cuda()), regions, md, md.max_new_blocks, dtype)
    torch.cuda.synchronize()
    fk_dtype = fmt.first_key_dtype(dtype)
    got = regions[[5, 2]].cpu()[..., lay.first_key:].contiguous().view(fk_dtype).float()  # [2, Hkv, D]
    blocks = k[:256].reshape(2, bs, hkv, d)
    want = fmt.window_round_trip(blocks[:, 0]).to(fk_dtype).float()  # [2, Hkv, D]: its 8-bit row
    bad = (got - want).abs() > 1e-6 + (want.abs() / 64)
    idx = bad.nonzero().tolist()
    print(f"  first keys {dtype}: {len(idx)} of {bad.numel()} differ", flush=True)
    for b, h, c in idx[:12]:
        print(f"    block {b} head {h} channel {c}: got {got[b, h, c].item():+.4f} want {want[b, h, c].item():+.4f}"
              f" (row-0 rotated fp32 {fmt.rotate(blocks[b, 0, h]).tolist()[c]:+.4f})", flush=True)


def kernel_facts(fn) -> list[str]:
    out = []
    try:
        for cache in fn.device_caches.values():
            for k in cache[0].values():
                out.append(f"regs {k.n_regs} spills {k.n_spills} shared {k.metadata.shared}")
    except Exception as e:  # Triton internals differ between versions
        out.append(f"(no kernel facts: {type(e).__name__})")
    return out


# The sweep's points: the README's three (contexts multiples of 128: no exact tail) and two whose
# rows carry a 63-token exact tail, as serving's rows do (0..127 tokens, one short program per
# (row, kv head) launched after the page programs)
DECODE_SHAPES = ((1024, 64), (8192, 32), (32768, 8), (8192 + 64, 32), (32768 - 64, 8))
# the decode kernel's knobs (s4kv.kernels.decode.DECODE_DEFAULTS): warps per program, tokens per page
# step, page pipeline depth (5: double-buffered pages, 3: one buffer), register cap (None: the
# compiler's choice), then page programs per SM for the split count. The page loop is latency-bound
# at four 4-warp programs per SM (docs/results/gpu-h200-2026-12-02-decode/): 96 registers fit a fifth
# on sm90 without spills, 80 a sixth with 24 bytes spilled (tools/kernel_static.py). Two warps per
# program measured 25% slower, eight slower still (docs/results/gpu-h200-2026-12-02-decode-fused/).
# Each with the programs per SM to plan splits for: what fits (spills: 80 registers 24-96 bytes,
# 64 registers 160) and one more.
KERNEL_VARIANTS = (((4, 128, 5, 128), (4,)), ((4, 128, 5, 96), (4, 5)), ((4, 128, 3, 96), (5,)),
                   ((4, 128, 5, 80), (5, 6)), ((4, 128, 3, 80), (6,)), ((4, 128, 3, 64), (8,)))
# then the exact tail's tiles (tokens per tile, pipeline depth), then the split reduction's
TAIL_VARIANTS = ((32, 1), (32, 2), (64, 2))
# (pipeline stages, warps, programs per (row, kv head), partial rows per tile: 0 = the pipelined loop)
REDUCE_VARIANTS = ((3, 4, 1, 0), (6, 4, 1, 0), (3, 2, 1, 0), (6, 2, 1, 0), (3, 4, 2, 0), (3, 4, 4, 0),
                   (3, 2, 4, 0), (3, 4, 1, 32), (3, 4, 4, 32), (3, 4, 1, 64))


def _geomean(times):
    return math.prod(times) ** (1 / len(times))


def time_launch(label, shapes, expected, copy, results, breakdown=False, **record):
    """{(context, batch): ms} of the decode call at the launch options kernels.LAUNCH holds now, on
    `shapes`; None when a shape does not compile or launch, or its output differs from
    expected[shape] beyond the engine's self-check tolerance (a miscompile is reported, not ranked).
    A shape missing from `expected` takes this launch's output as the reference. Each point's record
    (with `record` added) goes to `results`."""
    from s4kv.backend.selfcheck import TOLERANCE
    from s4kv.kernels.bench import bench_case

    times = {}
    for ctx, b in shapes:
        try:
            got = []
            r = bench_case(ctx, b, output=got, breakdown=breakdown, flash=False)
            want = expected.setdefault((ctx, b), got[0])
            err = ((got[0] - want).norm() / want.norm()).item()
        except Exception as e:  # noqa: BLE001 - a variant that does not compile or launch is skipped
            print(f"{label} {ctx}x{b}: {type(e).__name__} {e}"[:300], flush=True)
            return None
        # another split count rounds differently (bf16 probabilities, ~0.2-0.35% at 6-12 programs
        # per SM, 2026-12-02): the engine's own self-check bound tells that from a miscompile
        if not err < TOLERANCE[torch.bfloat16]:
            print(f"{label} {ctx}x{b}: output differs from the reference launch's (rel. L2 {err:.3g})", flush=True)
            return None
        frac = r["bandwidth"] / copy
        r.update(record, fraction_of_copy=frac, rel_err_vs_default=err)
        results.append(r)
        times[(ctx, b)] = r["ms"]
        parts = "; ".join(f"{n} {t * 1e3:.1f}" for n, t in r.get("kernels_ms", {}).items())
        print(f"{label} {ctx:6d}x{b:<3d} splits {r['splits']:3d}: {r['ms'] * 1e3:7.1f} us {frac:6.1%}"
              + (f" ({parts} us)" if parts else ""), flush=True)
    return times


def sweep_decode(results, config_out=None):
    """Sweep decode launch options in three rounds, each keeping the best of the round before
    (geometric mean of time over DECODE_SHAPES): page-kernel options x programs per SM, then the
    window's tiles, then the split reduction's. Each variant's output must match the default
    launch's within the engine's self-check tolerance (a miscompile is reported, not ranked), and
    the default launch's is checked against the PyTorch path (s4kv.backend.torch_ops) where the
    points have windows; the
    best is written as an S4KV_KERNEL_CONFIG file when config_out is given."""
    from diag_tail import pytorch_path, rel

    from s4kv.kernels.bench import bench_case, copy_bandwidth, decode_inputs

    copy = copy_bandwidth()
    print(f"copy bandwidth {copy / 1e12:.2f} TB/s", flush=True)
    expected = {}
    for ctx, b in DECODE_SHAPES:
        got = []
        r = bench_case(ctx, b, output=got, breakdown=True, flash=False)
        expected[(ctx, b)] = got[0]
        check = ""
        if ctx % fmt.UNIT:  # with a window: the PyTorch path (fp64) on the same inputs
            # (at a multiple of 256 the bench's last pages stand for a unit the store just wrote,
            # which the PyTorch path, not storing, reads as a window of random rows)
            check = f", rel. L2 vs the PyTorch path {rel(got[0], pytorch_path(*decode_inputs(ctx, b))):.2e}"
        parts = "; ".join(f"{n} {t * 1e3:.1f}" for n, t in r["kernels_ms"].items())
        print(f"default launch {ctx:6d}x{b:<3d} splits {r['splits']:3d}: {r['ms'] * 1e3:7.1f} us "
              f"{r['bandwidth'] / copy:6.1%}  ({parts} us){check}", flush=True)

    # programmatic dependent launch as the product uses it (s4kv.kernels.decode.programmatic_launch:
    # on by default on sm90+), so that the variants are timed with it; stream order is timed at the end
    pdl_default = torch.cuda.get_device_capability()[0] >= 9

    def measure(label, decode_opts, pps, reduce_opts, pdl=pdl_default):
        """Geometric-mean ms of one launch configuration over the shapes, None if it fails or differs."""
        kernels.LAUNCH[("decode", 128)] = decode_opts
        kernels.LAUNCH[("decode-grid", 0)] = {"programs_per_sm": pps, "max_splits": 64, "pdl": pdl}
        kernels.LAUNCH[("decode-reduce", 128)] = reduce_opts
        times = time_launch(label, DECODE_SHAPES, expected, copy, results, probe="decode", options=decode_opts,
                            programs_per_sm=pps, reduce_options=reduce_opts)
        return None if times is None else _geomean(list(times.values()))

    def best_of(name, ranked):
        for (label, gm, *_rest) in sorted(ranked, key=lambda x: x[1])[:6]:
            print(f"  {name}: geomean {gm * 1e3:6.1f} us  {label}", flush=True)
        return min(ranked, key=lambda x: x[1])

    base = dict(dec.DECODE_DEFAULTS)
    reduce_base = dict(dec.REDUCE_DEFAULTS)
    ranked = []
    for (nw, sub, stages, nreg), pps_list in KERNEL_VARIANTS:
        opts = {**base, "num_warps": nw, "SUB": sub, "PAGE_STAGES": stages, "maxnreg": nreg}  # None: no cap
        for pps in pps_list:
            label = f"warps={nw} SUB={sub} stages={stages} maxnreg={nreg} pps={pps}"
            gm = measure(label, opts, pps, reduce_base)
            if gm is not None:
                ranked.append((label, gm, opts, pps))
        print("   ", "; ".join(kernel_facts(dec._decode_kernel)[-1:]), flush=True)
    _, _, best, pps = best_of("page kernel", ranked)
    ranked = []
    for tail_sub, tail_stages in TAIL_VARIANTS:
        opts = {**best, "TAIL_SUB": tail_sub, "TAIL_STAGES": tail_stages}
        label = f"TAIL_SUB={tail_sub} TAIL_STAGES={tail_stages}"
        gm = measure(label, opts, pps, reduce_base)
        if gm is not None:
            ranked.append((label, gm, opts))
        print("   ", "; ".join(kernel_facts(dec._decode_kernel)[-1:]), flush=True)
    _, _, best = best_of("exact tail", ranked)
    ranked = []
    for stages, nw, head_splits, part_rows in REDUCE_VARIANTS:
        ropts = {**reduce_base, "STAGES": stages, "num_warps": nw, "HEAD_SPLITS": head_splits, "PART_ROWS": part_rows}
        label = f"reduce STAGES={stages} num_warps={nw} HEAD_SPLITS={head_splits} PART_ROWS={part_rows}"
        gm = measure(label, best, pps, ropts)
        if gm is not None:
            ranked.append((label, gm, ropts))
    _, gm, best_reduce = best_of("reduction", ranked)
    # stream order against programmatic dependent launch (sm90+, where it is the default)
    pdl = pdl_default
    if pdl_default:
        gm_so = measure("pdl=False", best, pps, best_reduce, pdl=False)
        stream = "failed" if gm_so is None else f"{gm_so * 1e3:.1f} us"
        print(f"  stream order: geomean {stream}, programmatic dependent launch {gm * 1e3:.1f} us", flush=True)
        if gm_so is not None and gm_so < gm:
            pdl, gm = False, gm_so
    print(f"best: {best} programs/SM={pps} reduce {best_reduce} pdl={pdl} (geomean {gm * 1e3:.1f} us)", flush=True)
    kernels.LAUNCH.clear()
    if config_out:
        with open(config_out, "w") as f:
            json.dump([{"kernel": "decode", "head_size": d, "options": best} for d in (64, 128)]
                      + [{"kernel": "decode-reduce", "head_size": d, "options": best_reduce} for d in (64, 128)]
                      + [{"kernel": "decode-grid", "head_size": 0, "options": {"programs_per_sm": pps, "max_splits": 64, "pdl": pdl}}],
                      f, indent=1)
        print(f"wrote {config_out}", flush=True)


def probe_pdl(results):
    """Programmatic dependent launch against stream order, default launch options otherwise, on
    DECODE_SHAPES (the quick first measurement of a lease): time of each, and the output with it
    against the output without (same inputs)."""
    from s4kv.backend.selfcheck import TOLERANCE
    from s4kv.kernels.bench import bench_case, copy_bandwidth

    copy = copy_bandwidth()
    print(f"copy bandwidth {copy / 1e12:.2f} TB/s", flush=True)
    for ctx, b in DECODE_SHAPES:
        rows = {}
        for pdl in (False, True):
            kernels.LAUNCH[("decode-grid", 0)] = {"pdl": pdl}
            got = []
            rows[pdl] = (bench_case(ctx, b, output=got, flash=False), got[0])
        kernels.LAUNCH.pop(("decode-grid", 0), None)
        (off, o_off), (on, o_on) = rows[False], rows[True]
        err = ((o_on - o_off).norm() / o_off.norm()).item()
        for pdl, (r, _) in rows.items():
            r.update(probe="pdl", pdl=pdl, fraction_of_copy=r["bandwidth"] / copy, rel_err_vs_stream_order=err)
            results.append(r)
        print(f"{ctx:6d}x{b:<3d} splits {off['splits']:3d}: stream order {off['ms'] * 1e3:6.1f} us "
              f"({off['bandwidth'] / copy:5.1%}), programmatic launch {on['ms'] * 1e3:6.1f} us "
              f"({on['bandwidth'] / copy:5.1%}), {off['ms'] / on['ms']:.3f}x; outputs rel. L2 {err:.1e}"
              f"{'' if err < TOLERANCE[torch.bfloat16] else '   <-- DIFFER'}", flush=True)


# window: (context, batch) points, the window's rows in brackets: none (the README's two), 63, 191 and
# the longest a window holds, 254 (+ this step's token)
WINDOW_SHAPES = ((8192, 32), (8192 + 64, 32), (8192 + 255, 32), (32768, 8), (32768 - 64, 8), (32768 + 255, 8))
WINDOW_VARIANTS = tuple(itertools.product((1, 2, 4), ((32, 1), (32, 2), (64, 1), (64, 2))))


def sweep_window(results, config_out=None):
    """The window programs' launch options: window_splits (programs sharing a row's window) x the
    tile (TAIL_SUB rows, TAIL_STAGES). Each variant's output must match the first variant's (one
    program, 32-row tiles: the launch until 2026-12-04) within the engine's self-check tolerance;
    each point's time, variant by variant, then a table
    of every variant's time per point (us) and its geometric means over the points with a window and
    over all (serving's windows are 0..255 rows). The best over all is written as an
    S4KV_KERNEL_CONFIG file when config_out is given."""
    from s4kv.kernels.bench import copy_bandwidth

    copy = copy_bandwidth()
    print(f"copy bandwidth {copy / 1e12:.2f} TB/s", flush=True)
    expected = {}  # the first variant's outputs (the default launch's)
    table = {}
    for ws, (tail_sub, tail_stages) in WINDOW_VARIANTS:
        label = f"window_splits={ws} TAIL_SUB={tail_sub} TAIL_STAGES={tail_stages}"
        opts = {"TAIL_SUB": tail_sub, "TAIL_STAGES": tail_stages}
        kernels.LAUNCH[("decode", 128)] = opts
        kernels.LAUNCH[("decode-grid", 0)] = {"window_splits": ws}
        row = time_launch(label, WINDOW_SHAPES, expected, copy, results, breakdown=True, probe="window",
                          window_splits=ws, options=opts)
        if row is not None:
            table[label] = (row, ws, opts)
        print("   ", "; ".join(kernel_facts(dec._decode_kernel)[-1:]), flush=True)
    kernels.LAUNCH.pop(("decode", 128), None)
    kernels.LAUNCH.pop(("decode-grid", 0), None)
    windowed = [shape for shape in WINDOW_SHAPES if shape[0] % fmt.UNIT]

    def overall(item):
        return _geomean(list(item[1][0].values()))
    print("\n| variant | " + " | ".join(f"{c}x{b}" for c, b in WINDOW_SHAPES) + " | geomean (windows) | geomean (all) |")
    print("|---|" + "---|" * (len(WINDOW_SHAPES) + 2))
    for label, (row, _ws, _opts) in sorted(table.items(), key=overall):
        print(f"| {label} | " + " | ".join(f"{row[s] * 1e3:.1f}" for s in WINDOW_SHAPES)
              + f" | {_geomean([row[s] for s in windowed]) * 1e3:.1f} | {_geomean(list(row.values())) * 1e3:.1f} |",
              flush=True)
    if config_out and table:
        label, (_row, ws, opts) = min(table.items(), key=overall)
        with open(config_out, "w") as f:
            json.dump([{"kernel": "decode", "head_size": d, "options": opts} for d in (64, 128)]
                      + [{"kernel": "decode-grid", "head_size": 0, "options": {"window_splits": ws}}], f, indent=1)
        print(f"best: {label}; wrote {config_out}", flush=True)


def sweep_stage(results):
    """Stage-kernel launch options (warps, pipeline stages) of chunk attention on chunks after 0, 8k
    and 30k cached tokens, head_dim 128. Each variant's output must equal the default launch's (the
    GPU-tested one) before its time counts: a miscompile is reported, not ranked. bf16
    FlashAttention on a bf16 cache of the same shape is timed once per shape."""
    from s4kv.kernels.bench import bench_prefill_case, prefill_inputs, time_prefill
    from s4kv.kernels.chunk import _stage_kernel, chunk_attention
    from s4kv.kernels.store import quantize_rows

    shapes = (0, 8192, 30720)
    inputs = {c: prefill_inputs(c, 2048, 28, 4, 128, torch.bfloat16) for c in shapes}
    expected, default = {}, {}
    rows = {c: quantize_rows(k, v) for c, (q, k, v, regions, md, out) in inputs.items()}
    for c, (q, k, v, regions, md, out) in inputs.items():
        chunk_attention(q, rows[c], regions, md, 0, 128 ** -0.5, out, store=False)
        expected[c] = out.float().clone()
        default[c] = r = bench_prefill_case(c, 2048)
        r.update(probe="stage", options="default")
        results.append(r)
        fa = r.get("flash_attn_bf16_ms")
        print(f"default launch context {c:6d}: {r['ms'] * 1e3:8.1f} us (stage {r['stage_ms'] * 1e3:6.1f} us)"
              + (f"  FA bf16 {fa * 1e3:8.1f} us" if fa else ""), flush=True)
    variants = {}
    for nw, stages in itertools.product((2, 4, 8), (1, 2, 3)):
        opts = {"num_warps": nw, "num_stages": stages}
        kernels.LAUNCH[("stage", 128)] = opts
        times = []
        for c, (q, k, v, regions, md, out) in inputs.items():
            try:
                out.zero_()
                chunk_attention(q, rows[c], regions, md, 0, 128 ** -0.5, out, store=False)
                err = ((out.float() - expected[c]).norm() / expected[c].norm()).item()
                if not err < 1e-3:
                    print(f"{opts} context {c}: output differs from the default launch's (rel. L2 {err:.3g})",
                          flush=True)
                    break
                t = time_prefill(inputs[c], 128)
            except Exception as e:  # noqa: BLE001 - a variant that does not compile or launch is skipped
                print(f"{opts} context {c}: {type(e).__name__} {e}"[:300], flush=True)
                break
            results.append({**default[c], **t, "options": opts, "rel_err_vs_default": err})
            times.append(t["stage_ms"])
            print(f"{opts} context {c:6d}: {t['ms'] * 1e3:8.1f} us, stage {t['stage_ms'] * 1e3:6.1f} us", flush=True)
        else:
            variants[(nw, stages)] = math.prod(times) ** (1 / len(times))
        print("   ", "; ".join(kernel_facts(_stage_kernel)[-1:]), flush=True)
    kernels.LAUNCH.pop(("stage", 128), None)
    if variants:
        (nw, stages), gm = min(variants.items(), key=lambda kv: kv[1])
        print(f"best stage launch: num_warps={nw} num_stages={stages} (geomean {gm * 1e3:.1f} us)", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("probes", nargs="+", choices=["rot", "d64", "decode", "pdl", "stage", "window"])
    ap.add_argument("--json")
    ap.add_argument("--config-out", help="decode, window: write the best launch options here (S4KV_KERNEL_CONFIG)")
    ap.add_argument("--store", default="", help="d64: store launch options, e.g. num_warps=8")
    ap.add_argument("--stage", default="", help="d64: stage launch options, e.g. num_warps=2,num_stages=1")
    args = ap.parse_args()

    def opts(text):
        return {k: int(v) for k, v in (kv.split("=") for kv in text.split(",") if kv)}
    print(torch.cuda.get_device_name(), "triton", triton.__version__, "torch", torch.__version__, flush=True)
    results = []
    for p in args.probes:
        if p == "d64":
            probe_d64(results, {"store": opts(args.store), "stage": opts(args.stage)})
        else:
            if p == "decode":
                sweep_decode(results, args.config_out)
            elif p == "pdl":
                probe_pdl(results)
            elif p == "stage":
                sweep_stage(results)
            elif p == "window":
                sweep_window(results, args.config_out)
            else:
                probe_rotation(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)


if __name__ == "__main__":
    main()
