#!/usr/bin/env python3
"""Static facts of the decode, reduce (its split reduction), stage (chunk attention), store, rows and append (window) kernels for a GPU architecture, compiled on a machine without a GPU.

    python tools/kernel_static.py [--kernel decode,stage,store] [--arch 80,86,89,90] [--shape qwen2.5-7b,smollm2]
                                  [--dtype bf16,fp16] [--options '{"SUB": 64}' ...] [--json OUT]
                                  [--source CHECKOUT]

Triton compiles the kernels for the target (its bundled ptxas), through a stand-in driver that
never launches; cuobjdump gives registers, spills and SASS. Per kernel variant it reports:
registers, spills and shared memory per program; how many programs fit on one SM (registers,
shared memory and threads of the architecture); how many buffers the software pipeline gives
the page's code tiles (2: the next page loads while one is computed); and the instruction mix of
the page loop (the loop with the most tensor-core instructions), per warp and per program, and the
counts of every loop with tensor-core instructions (mma_loops: a kernel with a fallback loop has two). These are compile-time
facts, not timings: what they predict about speed needs the GPU (tools/gpu/tune_kernels.py).
Each --json record also carries the SHA-1 of the kernel's SASS listing (sass_sha1): a change meant to
leave the compiled code alone is checked by running this tool on both trees (--source) and
comparing those.
Run with the Triton of the GPU machine (nox -s kernels-static pins it).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import hashlib
import json
import linecache
import os
import re
import subprocess
import sys
import tempfile
from unittest import mock

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import compiler as triton_compiler
from triton.runtime.driver import driver
from triton.runtime.errors import OutOfResources

_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")

# Per-SM limits (CUDA programming guide, compute capabilities): shared memory usable by blocks,
# registers, threads, resident blocks; each block also reserves 1 KiB of shared memory.
ARCH = {
    80: {"name": "A100", "smem": 167936, "regs": 65536, "threads": 2048, "blocks": 32},
    86: {"name": "A10G", "smem": 102400, "regs": 65536, "threads": 1536, "blocks": 16},
    89: {"name": "L4/L40S", "smem": 102400, "regs": 65536, "threads": 1536, "blocks": 24},
    90: {"name": "H100/H200", "smem": 233472, "regs": 65536, "threads": 2048, "blocks": 32},
}
SHAPES = {"qwen2.5-7b": (28, 4, 128), "smollm2": (9, 3, 64)}  # query heads, kv heads, head_dim
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}  # fp32: no engine serves it


def _cuobjdump(cubin: bytes, *flags: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([os.path.join(_BIN, "cuobjdump"), *flags, f.name], capture_output=True,
                              text=True, check=True).stdout


def resource_usage(cubin: bytes) -> tuple[int, int]:
    """(registers per thread, spill stack bytes) from cuobjdump -res-usage."""
    out = _cuobjdump(cubin, "-res-usage")
    stack = re.search(r"STACK:(\d+)", out)
    return int(re.search(r"REG:(\d+)", out).group(1)), int(stack.group(1)) if stack else 0


class CompileOnlyDriver:
    """Triton's active driver for a target GPU that is not there: kernels compile, launches do nothing."""

    def __init__(self, cc: int):
        self.target = GPUTarget("cuda", cc, 32)
        limits = ARCH[cc]

        class Utils:
            def get_device_properties(self, device):
                return {"max_shared_mem": limits["smem"] - 1024, "multiprocessor_count": 132,
                        "max_num_regs": limits["regs"], "warpSize": 32}

            def load_binary(self, name, cubin, shared, device):
                regs, spills = resource_usage(cubin)
                return None, None, regs, spills, 1024

        self.utils = Utils()

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("cpu")

    def launcher_cls(self, src, metadata):
        return lambda *args, **kwargs: None

    def is_active(self):
        return True


_INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LINE = re.compile(r'\s*//## File "(.*)", line (\d+)')
_PRED = re.compile(r"^@!?U?P[T0-9]+\s+")


def opcode(text: str) -> str:
    """An instruction's opcode with its modifiers, predicate dropped (`@!P0 HMMA.16816.F32 ...;`)."""
    return _PRED.sub("", text.strip().rstrip(";")).split()[0]


def parse_sass(sass: str) -> list[tuple[int, str]]:
    """(address, opcode with modifiers) of every instruction, predicates dropped."""
    return [(int(m.group(1), 16), opcode(m.group(2))) for m in map(_INSTR.match, sass.splitlines()) if m]


@functools.lru_cache(maxsize=8)  # a kernel's page loop and its mma_loops both read them
def loop_bodies(sass: str) -> list[tuple[int, int, collections.Counter]]:
    """(first, last offset, instruction counts) of every loop body (a backward branch and the code
    it jumps over). Cached: callers only read them."""
    ins = parse_sass(sass)
    bodies = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", line)
        if m and m.group(2) and int(m.group(2), 16) < int(m.group(1), 16):
            lo, hi = int(m.group(2), 16), int(m.group(1), 16)
            bodies.append((lo, hi, collections.Counter(op for a, op in ins if lo <= a <= hi)))
    return bodies


def loops(sass: str) -> list[collections.Counter]:
    """Instruction counts of every loop body."""
    return [counts for _, _, counts in loop_bodies(sass)]


def _count(counter: collections.Counter, *prefixes: str) -> int:
    """Instructions in `counter` whose opcode starts with one of `prefixes`."""
    return sum(n for op, n in counter.items() if op.startswith(prefixes))


def _mma(counter: collections.Counter) -> int:
    return _count(counter, "HMMA", "HGMMA", "IMMA")


def _int_to_float(counter: collections.Counter) -> int:
    return _count(counter, "I2F")


def page_loop(sass: str) -> tuple[int, int, collections.Counter] | None:
    """A decode or stage kernel's page loop: of the loops with tensor-core instructions, the one with
    the fewest integer-to-float conversions (pages' 4-bit codes become dot operands by bit operations,
    s4kv.kernels.code_ptx; the decode kernel's window loop converts 8-bit codes with I2F and, in
    64-row tiles, has as many MMAs as the page loop, or more where the page loop's are int8 m16n8k32),
    then the most tensor-core instructions, then the innermost (a loop around the page loop holds its MMAs
    too), then the most instructions; None without a loop."""
    bodies = loop_bodies(sass)
    if not bodies:
        return None
    def rank(b):
        return _mma(b[2]) > 0, -_int_to_float(b[2]), _mma(b[2])

    best = max(map(rank, bodies))
    tied = [b for b in bodies if rank(b) == best]
    inner = [b for b in tied if not any(o is not b and b[0] <= o[0] and o[1] <= b[1] for o in tied)]
    return max(inner, key=lambda b: sum(b[2].values()))


def occupancy(cc: int, regs: int, shared: int, num_warps: int) -> int:
    """Programs resident per SM: registers are allocated per warp in units of 256."""
    lim = ARCH[cc]
    warp_regs = -(-regs * 32 // 256) * 256
    return min(lim["regs"] // (warp_regs * num_warps), lim["smem"] // (shared + 1024),
               lim["threads"] // (32 * num_warps), lim["blocks"])


def device_defaults(cc: int, kernel: str, head_size: int) -> dict:
    """The launch options a GPU of this architecture starts from (s4kv.kernels.launch_options on the
    device; here the tensors are on the CPU, so the architecture's shared memory is passed)."""
    from s4kv import kernels

    return kernels.launch_options_for(kernel, head_size, ARCH[cc]["smem"] - 1024)


def _metadata(rows: int, qlen: int, seq_len: int):
    """Metadata of `rows` requests, each `qlen` new tokens ending at `seq_len`."""
    from s4kv.kernels.batch import S4KVMetadata

    i32 = lambda x: torch.tensor(x, dtype=torch.int32)
    qsl = i32([i * qlen for i in range(rows + 1)])
    return S4KVMetadata(rows, rows * qlen, qlen, seq_len, qsl, i32([seq_len] * rows),
                        torch.zeros(rows, 16, dtype=torch.int32), qsl.clone(), i32([seq_len] * rows))


def _compiled(cc: int, kernel: str, d: int, options: dict, jit_fn, launch):
    """(compiled kernel, its launch options): `launch` run under the compile-only driver with the
    architecture's defaults overridden by `options` (kernels.LAUNCH restored afterwards)."""
    from s4kv import kernels

    opts = {**device_defaults(cc, kernel, d), **options}
    saved = dict(kernels.LAUNCH)
    kernels.LAUNCH[(kernel, d)] = opts
    jit_fn.device_caches.clear()
    # and every other kernel the launch runs: Triton caches a kernel's target with its device, and the
    # decode call's rotation and reduction differ between architectures (griddepcontrol on sm90+)
    from s4kv.kernels import decode
    for fn in vars(decode).values():
        if isinstance(fn, triton.runtime.jit.JITFunction):
            fn.device_caches.clear()
    # the page kernel compiles with the environment the product gives it on a GPU of this
    # architecture (decode_attention's tensors are on the CPU here, so it cannot tell)
    # (a checkout from before 2026-12-04, --source, has no such rule)
    env = kernels.mma_sync_env(cc // 10) if kernel == "decode" and hasattr(kernels, "mma_sync_env") else {}
    # and with the launch that architecture gets: programmatic dependent launch on sm90+ (its kernels
    # then hold griddepcontrol instructions, so a GPU's profile matches only a build that has them)
    target = mock.patch.object(decode, "capability_major", lambda device: cc // 10) \
        if hasattr(decode, "capability_major") else contextlib.nullcontext()
    try:
        with mock.patch.dict(os.environ, env), target:
            _compile(launch)
    finally:
        kernels.LAUNCH.clear()
        kernels.LAUNCH.update(saved)
    (kern,) = jit_fn.device_caches[0][0].values()
    return kern, opts


def _cache_tensors(rows: int, hkv: int, d: int, dt):
    """Zero pages for `rows` requests, windows included (compiling reads only their shapes)."""
    from s4kv import format as fmt

    return torch.zeros(64, hkv, fmt.PageLayout(d).region_bytes, dtype=torch.uint8)


def decode_batch(shape: str, dtype: str, rows: int = 8):
    """(q, metadata, pages) of `rows` single-token decode rows at position 999, as a captured decode
    step plans them."""
    from s4kv.kernels.batch import plan_launch

    hq, hkv, d = SHAPES[shape]
    dt = DTYPES[dtype]
    md = plan_launch(_metadata(rows, 1, 1000), hkv, num_sms=132, uniform_decode=True)
    return torch.zeros(rows, hq, d, dtype=dt), md, _cache_tensors(rows, hkv, d, dt)


def compiled_decode(cc: int, shape: str, dtype: str, options: dict, kernel: str = "decode"):
    """(compiled decode kernel, its launch options) for one architecture, shape, dtype and launch
    configuration (under the compile-only driver of `cc`); kernel "decode-reduce": the split
    reduction that the same call launches after it."""
    from s4kv.kernels import decode

    _, hkv, d = SHAPES[shape]
    q, md, regions = decode_batch(shape, dtype)
    rows = md.num_reqs
    jit_fn = decode._reduce_kernel if kernel == "decode-reduce" else decode._decode_kernel
    return _compiled(cc, kernel, d, options, jit_fn, lambda: decode.decode_attention(
        q, _step_rows(rows, hkv, d), regions, md, rows, d ** -0.5, torch.zeros_like(q), md.decode_splits))


def _step_rows(tokens: int, hkv: int, d: int):
    """A step's window rows as the kernels take them (s4kv.kernels.store.StepRows), built without a
    launch (the compile-only driver launches nothing)."""
    codes = torch.zeros(tokens, hkv, d, dtype=torch.uint8)
    return codes, codes.clone(), torch.zeros(tokens, hkv, 2, dtype=torch.float16)


def _page_body(kern) -> tuple[int, int, collections.Counter] | None:
    return page_loop(_sass(kern))


def decode_variant(cc: int, shape: str, dtype: str, options: dict) -> dict:
    """Compile the decode kernel (and its helpers) for one launch configuration; static facts."""
    kern, opts = compiled_decode(cc, shape, dtype, options)
    return _facts(cc, shape, dtype, opts, kern, _page_body(kern))


def reduce_variant(cc: int, shape: str, dtype: str, options: dict) -> dict:
    """Compile the split reduction (merges a decode row's partials, rotates their sum back)."""
    kern, opts = compiled_decode(cc, shape, dtype, options, "decode-reduce")
    return _facts(cc, shape, dtype, opts, kern, _page_body(kern))


def stage_variant(cc: int, shape: str, dtype: str, options: dict, window: bool = False) -> dict:
    """Compile the chunk path's stage kernel (int4 pages -> 16-bit scratch pages for FlashAttention)
    for one launch configuration; loop facts of its largest loop, if any. window: its other
    specialization, which stages blocks from their 8-bit window rows (KIND = WINDOW)."""
    from s4kv.kernels import chunk
    from s4kv.kernels.chunk_plan import PAGE, WINDOW, plan_chunks, to_device

    _, hkv, d = SHAPES[shape]
    dt = DTYPES[dtype]
    rows, qlen = 2, 256
    md = _metadata(rows, qlen, 1000)
    regions = _cache_tensors(rows, hkv, d, dt)
    (wave,) = to_device(plan_chunks(md.query_start_loc_cpu.numpy(), md.seq_lens_cpu.numpy(), 0, None), "cpu")
    kp = torch.zeros(len(wave.jobs), 128, hkv, d, dtype=chunk.STAGE_DTYPE)
    kern, opts = _compiled(cc, "stage", d, options, chunk._stage_kernel,
                           lambda: chunk.stage_pages(wave, _step_rows(rows * qlen, hkv, d), regions, md, dt, kp,
                                                     kp.clone(), WINDOW if window else PAGE))
    return _facts(cc, shape, dtype, opts, kern, _page_body(kern))


def stage_window_variant(cc: int, shape: str, dtype: str, options: dict) -> dict:
    """The stage kernel's window specialization (the chunk's own blocks and the old window, from rows)."""
    return stage_variant(cc, shape, dtype, options, window=True)


def store_variant(cc: int, shape: str, dtype: str, options: dict) -> dict:
    """Compile the block-store kernel (quantizes completed blocks into pages); loop facts of its
    largest loop, if any."""
    from s4kv import format as fmt
    from s4kv.kernels import store

    _, hkv, d = SHAPES[shape]
    dt = DTYPES[dtype]
    rows, qlen = 2, fmt.UNIT
    md = _metadata(rows, qlen, qlen)
    regions = _cache_tensors(rows, hkv, d, dt)
    kern, opts = _compiled(cc, "store", d, options, store._store_blocks_kernel,
                           lambda: store.store_blocks(_step_rows(rows * qlen, hkv, d), regions, md, 1, dt))
    body = max(loop_bodies(_sass(kern)), key=lambda b: sum(b[2].values()), default=None)
    return _facts(cc, shape, dtype, opts, kern, body)


def rows_variant(cc: int, shape: str, dtype: str, options: dict, stage: bool = False) -> dict:
    """Compile the kernel that quantizes a step's tokens into 8-bit window rows, as the backend
    launches it (with the decode rows' queries and window rows; no loop). stage: as a mixed step
    launches it, also staging the chunk rows' queries in fp16 for FlashAttention (STAGE_QUERIES)."""
    from s4kv.kernels import store

    _, hkv, d = SHAPES[shape]
    q, md, regions = decode_batch(shape, dtype)
    k = torch.zeros(md.num_reqs, hkv, d, dtype=q.dtype)
    decodes = (q, regions, md, d ** -0.5)
    staged = (q, torch.zeros(q.shape, dtype=torch.float16), 1) if stage else None
    kern, opts = _compiled(cc, "rows", d, options, store._quantize_rows_kernel,
                           lambda: store.quantize_rows(k, k.clone(), decodes=decodes, stage=staged))
    return _facts(cc, shape, dtype, opts, kern, None)


def rows_stage_variant(cc: int, shape: str, dtype: str, options: dict) -> dict:
    """The row kernel's mixed-step specialization (the chunk rows' queries staged)."""
    return rows_variant(cc, shape, dtype, options, stage=True)


def append_variant(cc: int, shape: str, dtype: str, options: dict) -> dict:
    """Compile the kernel that writes a step's rows into the windows (no loop)."""
    from s4kv import format as fmt
    from s4kv.kernels import store

    _, hkv, d = SHAPES[shape]
    rows, qlen = 2, 100
    md = _metadata(rows, qlen, fmt.UNIT + qlen)
    kern, opts = _compiled(cc, "append", d, options, store._append_window_kernel,
                           lambda: store.append_window(_step_rows(rows * qlen, hkv, d),
                                                       _cache_tensors(rows, hkv, d, DTYPES[dtype]), md))
    return _facts(cc, shape, dtype, opts, kern, None)


VARIANTS = {"decode": decode_variant, "reduce": reduce_variant, "stage": stage_variant, "stage-window": stage_window_variant,
            "store": store_variant, "rows": rows_variant, "rows-stage": rows_stage_variant,
            "append": append_variant}


def _sass(kern) -> str:
    return _sass_of(kern.kernel)


@functools.lru_cache(maxsize=8)
def _sass_of(cubin: bytes) -> str:  # a kernel's page loop and its facts both read it
    return _cuobjdump(cubin, "-sass")


def _compile(launch) -> None:
    """Run a kernel wrapper under the compile-only driver. A kernel that needs more shared memory
    than the architecture has compiles, then raises at its (stand-in) launch: its facts still count
    (programs per SM 0: it cannot run there)."""
    try:
        launch()
    except OutOfResources as e:
        print(f"    does not launch: {e}", flush=True)


def line_table(cubin: bytes) -> tuple[dict[int, tuple[str, int] | None], dict[int, str]]:
    """(offset -> (file, line), offset -> instruction text) from nvdisasm's line-annotated listing
    (Triton compiles with line information)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        listing = subprocess.run([os.path.join(_BIN, "nvdisasm"), "-g", "-c", f.name], capture_output=True,
                                 text=True, check=True).stdout
    lines, text, cur = {}, {}, None
    for row in listing.splitlines():
        m = _LINE.match(row)
        if m:
            cur = (m.group(1), int(m.group(2)))
            continue
        m = _INSTR.match(row)
        if m:
            a = int(m.group(1), 16)
            lines[a], text[a] = cur, m.group(2)
    return lines, text


def loop_lines(cubin: bytes, lo: int, hi: int) -> list[dict]:
    """The instructions of the loop body lo..hi (cuobjdump offsets, which are nvdisasm's) per Triton
    source line, most first: where a loop's instructions come from, e.g. a layout conversion's
    shared-memory round trip or a per-page sum, before and after a change."""
    lines, text = line_table(cubin)
    by_line: dict = collections.defaultdict(collections.Counter)
    for off, where in lines.items():
        if lo <= off <= hi:
            by_line[where][opcode(text[off])] += 1
    rows = [{"file": w[0] if w else "?", "line": w[1] if w else 0, "instructions": sum(c.values()),
             "source": linecache.getline(w[0], w[1]).strip() if w else "", "top": dict(c.most_common(5)),
             "barriers": _count(c, "BAR"), "shuffles": _count(c, "SHFL"), "local": _count(c, "LDL", "STL")}
            for w, c in by_line.items()]
    return sorted(rows, key=lambda r: -r["instructions"])


def _facts(cc: int, shape: str, dtype: str, options: dict, kern,
           body: tuple[int, int, collections.Counter] | None) -> dict:
    page = body[2] if body else collections.Counter()
    nw = kern.metadata.num_warps
    regs, spills = resource_usage(kern.kernel)
    per_warp = sum(page.values())
    # the software pipeline's buffers of the page's code tiles (uint8): 2 = the next page is in flight
    # while one is computed; 1 = its copy is issued only after the compute
    buffers = [int(n) for n in re.findall(r"ttg\.local_alloc : \(\) -> !ttg\.memdesc<(\d+)x\d+x\d+xi8",
                                           kern.asm["ttgir"])]
    top = {op: n for op, n in page.most_common(12)}
    # the whole kernel's static instructions and local-memory (spill) traffic: kernels without a page
    # loop (stage) are compared by these
    sass = _sass(kern)
    ops = [op for _, op in parse_sass(sass)]
    # the instructions with their operands and addresses: two trees whose records agree here compile
    # to the same code (a refactor's check: --source, then compare the --json records)
    listing = "\n".join(line.strip() for line in sass.splitlines() if _INSTR.match(line))
    return {
        "arch": f"sm{cc}", "gpu": ARCH[cc]["name"], "shape": shape, "dtype": dtype, "options": options,
        "num_warps": nw, "registers": regs, "spill_bytes": spills, "shared_bytes": kern.metadata.shared,
        "programs_per_sm": occupancy(cc, regs, kern.metadata.shared, nw),
        "code_tile_buffers": max(buffers, default=0),
        "instructions": len(ops), "local_loads": sum(op.startswith("LDL") for op in ops),
        # tensor-core products that round fp32 operands to tf32 (s4kv.kernels.quant.dot_precision)
        "tf32_mma": sum("TF32" in op for op in ops),
        "local_stores": sum(op.startswith("STL") for op in ops),
        # built for programmatic dependent launch (griddepcontrol), as sm90+ GPUs launch the decode kernels
        "programmatic": "griddepcontrol" in kern.asm["ptx"],
        "page_loop": {"instructions_per_warp": per_warp, "instructions_per_program": per_warp * nw,
                      "mma_per_warp": _mma(page),
                      "wgmma_per_warp": _count(page, "HGMMA"),
                      "int_to_float_per_warp": _int_to_float(page),
                      "barriers_per_warp": _count(page, "BAR"),
                      "top": top,
                      "by_line": loop_lines(kern.kernel, body[0], body[1]) if body else []},
        # every loop with tensor-core instructions, in code order: a kernel with two page loops (one
        # a fallback) shows both here, while page_loop is the longer one
        "mma_loops": [{"offset": lo, "instructions_per_warp": sum(c.values()), "mma_per_warp": _mma(c),
                       "barriers_per_warp": _count(c, "BAR"), "shuffles_per_warp": _count(c, "SHFL")}
                      for lo, _hi, c in loop_bodies(sass) if _mma(c)],
        "sass_sha1": hashlib.sha1(listing.encode()).hexdigest(),
        "triton": triton.__version__,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel", default="decode", help="decode, reduce, stage, stage-window, store, rows, rows-stage, append (comma-separated)")
    ap.add_argument("--arch", default="80,86,89,90")
    ap.add_argument("--shape", default="qwen2.5-7b,smollm2")
    ap.add_argument("--dtype", default="bf16,fp16")
    ap.add_argument("--options", action="append", default=None,
                    help="launch options as JSON over the architecture's defaults (repeatable); default: "
                         "the defaults")
    ap.add_argument("--json", help="write the records here")
    ap.add_argument("--lines", type=int, default=0, metavar="N",
                    help="also the N source lines with the most page-loop instructions, per variant")
    ap.add_argument("--source", help="import s4kv from this checkout (e.g. a git worktree of an older commit)")
    args = ap.parse_args(argv)
    if args.source:
        sys.path.insert(0, os.path.abspath(args.source))
    variants = [json.loads(o) for o in (args.options or ["{}"])]
    rows = []
    import s4kv

    print(f"triton {triton.__version__}; s4kv from {os.path.dirname(s4kv.__file__)}", flush=True)
    print(f"{'kernel':>12} {'arch':>5} {'shape':>11} {'dtype':>5} {'options':<40} {'regs':>4} {'spill':>5} {'smem':>6} "
          f"{'prog/SM':>7} {'bufs':>4} {'loop/warp':>9} {'loop/prog':>9} {'mma':>4} {'i2f':>4} {'bar':>4}")
    for cc in map(int, args.arch.split(",")):
        driver.set_active(CompileOnlyDriver(cc))
        triton_compiler.max_shared_mem.cache_clear()  # cached per device index, not per driver
        for shape in args.shape.split(","):
            for dtype in args.dtype.split(","):
                for kernel, opts in ((kn, o) for kn in args.kernel.split(",") for o in variants):
                    variant = VARIANTS[kernel]
                    r = {**variant(cc, shape, dtype, opts), "kernel": kernel}
                    rows.append(r)
                    lp = r["page_loop"]
                    print(f"{kernel:>12} {r['arch']:>5} {shape:>11} {dtype:>5} {json.dumps(r['options']):<40} {r['registers']:4d} "
                          f"{r['spill_bytes']:5d} {r['shared_bytes']:6d} {r['programs_per_sm']:7d} "
                          f"{r['code_tile_buffers']:4d} "
                          f"{lp['instructions_per_warp']:9d} {lp['instructions_per_program']:9d} "
                          f"{lp['mma_per_warp']:4d} {lp['int_to_float_per_warp']:4d} {lp['barriers_per_warp']:4d}",
                          flush=True)
                    for ln in lp["by_line"][:args.lines]:
                        ops = " ".join(f"{op} {n}" for op, n in ln["top"].items())
                        print(f"    {ln['instructions']:4d}  {os.path.basename(ln['file'])}:{ln['line']:<4d} "
                              f"{ln['source'][:64]:<64}  {ops}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
