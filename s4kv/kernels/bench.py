"""Kernel-level benchmark of int4_kivi decode attention on a CUDA GPU.

    python -m s4kv.kernels.bench [--contexts 1024,8192,32768] [--batches 64,32,8] [--breakdown]
                                 [--prefill-contexts 0,8192,30720 --chunk 2048] [--alias-blocks N] [--json OUT]

For each (context, batch): fills a paged cache with random int4 pages (Qwen2.5-7B shape by default:
28 query heads, 4 kv heads, head_dim 128), times one layer's decode attention (split-KV kernel +
reduction) with CUDA-graph replay, and reports the bytes it must read (pages of every complete
unit, the window's 8-bit rows, queries) over the time, next to a device-to-device copy measured in
the same run (the bandwidth ceiling) and bf16 FlashAttention decode on the same shape when vLLM's
flash-attn is importable. "step us": the layer's whole decode step as the backend runs it (the
step's row kernel, which also rotates the queries and writes the window rows, then pages and
reduction); "unfused": the same with the query rotation and the window append as launches of
their own (as before 2026-12-04, fourth session). Every row's window holds the context's last context % 256 tokens
(serving's rows have 0..255; 32768 has none but its own token, 32704 has 192). With --breakdown, also each kernel's own
device time (the profiler's, over eager calls) and what the graph replay spends beside them. With --prefill-contexts, also chunk (prefill) attention: one chunk of
queries after a cached context (the stage kernel + FlashAttention over the staged pages), attention
TFLOP/s, next to bf16 FlashAttention on a bf16 cache of the same shape. With --alias-blocks, the
decode points' complete pages are a small pool that stays in L2 (decode_inputs): the kernels'
time where DRAM does not bound them.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import torch

from s4kv import format as fmt
from s4kv.kernels import num_sms
from s4kv.kernels.batch import S4KVMetadata, plan_launch


def copy_bandwidth(nbytes: int = 4 << 30) -> float:
    """Bytes read + written per second by a large device-to-device copy."""
    import triton.testing

    a = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = triton.testing.do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    return 2 * a.numel() / (ms * 1e-3)


def _graph_time(*fns) -> float:
    """Median ms per call of fns, captured one after the other in one CUDA graph and replayed.

    triton.testing.do_bench times each replay on its own, right after zero-filling a 256 MB
    buffer (to empty the L2), so every replay also pays the graph's launch and starts with an L2
    full of that buffer's freshly written lines. A model's decode step pays its graph's launch
    once for all layers and follows its own kernels: several layers' calls per graph (each on its
    own cache, so that none finds another's data in the L2) share those costs as the layers of a
    step do (H100, 8 calls per graph: about 10 us less per decode call than one call per graph,
    docs/results/gpu-h100-2026-12-05-layers-per-graph/)."""
    import triton.testing

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for fn in fns:
            fn()
    return triton.testing.do_bench(g.replay, warmup=25, rep=200, return_mode="median") / len(fns)


def kernel_breakdown(fn, calls: int = 20) -> dict[str, float]:
    """Mean device ms per call of each kernel that fn launches (by kernel name), from the PyTorch
    profiler over `calls` eager calls. Kernels run the same inside a CUDA graph; only the gaps between
    them differ, which the graph replay's total minus these shows."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return {name: us / 1e3 / calls for name, us in device_us_by_kernel(prof).items()}


def device_us_by_kernel(prof) -> dict[str, float]:
    """Device microseconds per kernel name over a PyTorch profiler window (CUDA activity)."""
    times: dict[str, float] = {}
    for ev in prof.key_averages():
        dev_us = getattr(ev, "device_time_total", None)
        if dev_us is None:  # older torch
            dev_us = ev.cuda_time_total
        if dev_us and ev.device_type.name == "CUDA":
            times[ev.key] = times.get(ev.key, 0.0) + dev_us
    return times


def _random_pages(num_blocks: int, hkv: int, d: int, gen, device="cuda") -> torch.Tensor:
    """A paged cache of random int4 codes with valid fp16 scales, mins and first keys (random
    bytes there would be NaN/inf)."""
    lay = fmt.PageLayout(d)
    regions = torch.randint(0, 256, (num_blocks, hkv, lay.region_bytes), dtype=torch.uint8, device=device,
                            generator=gen)
    sc = regions[..., lay.v_scale:].view(torch.float16)
    sc.copy_(torch.rand(sc.shape, device=device, generator=gen).half() * 0.1)
    return regions


def _fill_windows(regions, bt, first_block: int, d: int, dtype, gen) -> None:
    """Windows of quantized random tokens (every row a window can hold, in the pages from first_block)."""
    pages = bt[:, first_block:first_block + fmt.WINDOW_PAGES].long()
    pos = torch.arange(fmt.UNIT - 1, device=bt.device)[None, :].expand(bt.shape[0], -1)
    x = torch.randn(bt.shape[0], fmt.UNIT - 1, regions.shape[1], d, device=bt.device, generator=gen).to(dtype)
    codes, scale = fmt.quantize_window(x)
    fmt.write_window(regions, pages, pos, codes, scale, codes, scale)


def decode_inputs(context: int, batch: int, hq: int = 28, hkv: int = 4, d: int = 128, dtype=torch.bfloat16,
                  device="cuda", alias_blocks: int | None = None):
    """(q, k, v, regions, md) of `batch` decode rows at position context - 1: random int4 pages in a
    shuffled block table, windows of quantized tokens, launch shapes planned as for a captured
    decode batch; the same tensors on every call (one seeded generator draws all of them).

    alias_blocks: the rows' complete pages all point into a pool of this many blocks (a row's window
    pages stay its own), so that the same grid and the same instructions read a few MB that stay in
    L2 instead of the whole KV from DRAM: what the page loop takes where memory is not what bounds it
    (the H200 reads pages at 66% of its copy bandwidth where the H100 reads them at 83%, 2026-12-05)."""
    held = fmt.blocks_held(context, d, dtype.itemsize)
    first_window = (context - 1) // fmt.UNIT * fmt.UNIT_BLOCKS  # the row's first window page
    num_blocks = batch * held if not alias_blocks else alias_blocks + batch * (held - first_window)
    gen = torch.Generator(device=device).manual_seed(0)
    regions = _random_pages(num_blocks, hkv, d, gen, device)
    q = torch.randn(batch, hq, d, dtype=dtype, device=device, generator=gen)
    k = torch.randn(batch, hkv, d, dtype=dtype, device=device, generator=gen)
    # from the seeded generator too: the new token's value is read at every point with a window
    v = torch.randn(k.shape, dtype=dtype, device=device, generator=gen)
    perm = torch.randperm(num_blocks, device=device, generator=gen).to(torch.int32)
    if alias_blocks:
        pool, windows = perm[:alias_blocks], perm[alias_blocks:].view(batch, held - first_window)
        pages = pool[torch.arange(batch * first_window, device=device) % alias_blocks].view(batch, first_window)
        bt = torch.cat([pages, windows], dim=1).contiguous()
    else:
        bt = perm[: batch * held].view(batch, held).contiguous()
    _fill_windows(regions, bt, first_window, d, dtype, gen)
    seq = torch.full((batch,), context, dtype=torch.int32, device=device)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=device)
    md = S4KVMetadata(batch, batch, 1, context, qsl, seq, bt, qsl.cpu(), seq.cpu())
    plan_launch(md, hkv, num_sms(torch.device(device)), uniform_decode=True)
    return q, k, v, regions, md


def bench_case(context: int, batch: int, hq: int = 28, hkv: int = 4, d: int = 128,
               dtype=torch.bfloat16, output: list | None = None, breakdown: bool = False,
               flash: bool = True, layers: int = 1, alias_blocks: int | None = None) -> dict:
    """One (context, batch) point; `output`, when given, receives the attention output (fp32);
    `breakdown`: also each kernel's device time (row["kernels_ms"]); `flash`: also bf16
    FlashAttention on the same shape, when vLLM's is importable; `layers` > 1: also both per call
    with `layers` calls in one graph, each layer on its own cache (row["layers_ms"],
    row["layers_step_ms"], row["flash_attn_bf16_layers_ms"]; _graph_time says why).
    `alias_blocks`: decode_inputs' pool of complete pages, which the layers then share (to stay in
    L2); "bandwidth" is then what the kernel would read from DRAM over its time, not what it did."""
    from s4kv.kernels.decode import decode_attention
    from s4kv.kernels.store import append_window, quantize_rows

    bs = fmt.BLOCK_SIZE
    lay = fmt.PageLayout(d)
    q, k, v, regions, md = decode_inputs(context, batch, hq, hkv, d, dtype, alias_blocks=alias_blocks)
    out = torch.empty(batch, hq, d, dtype=torch.float32, device="cuda")
    scale = d ** -0.5
    # this step's rows, quantized once per layer outside the attention call (as reshape_and_cache
    # is outside a 16-bit cache's)
    rows = quantize_rows(k, v)

    def run(cache=regions):
        decode_attention(q, rows, cache, md, batch, scale, out, md.decode_splits)

    def step(cache=regions):  # the layer's decode step as s4kv.backend.triton_ops runs it (no unit completes)
        r = quantize_rows(k, v, decodes=(q, cache, md, scale))
        decode_attention(q, r, cache, md, batch, scale, out, md.decode_splits, queries_rotated=True)
        append_window(r, cache, md, first_row=md.num_decodes)  # nothing left: no launch

    def step_unfused():  # the same before 2026-12-04 (fourth session): rotation and window append apart
        r = quantize_rows(k, v)
        decode_attention(q, r, regions, md, batch, scale, out, md.decode_splits)
        append_window(r, regions, md)

    ms = _graph_time(run)
    if layers > 1:
        caches = [regions] + [regions if alias_blocks else regions.clone() for _ in range(layers - 1)]
        layers_ms = _graph_time(*(lambda c=c: run(c) for c in caches))
        layers_step_ms = _graph_time(*(lambda c=c: step(c) for c in caches))
        del caches
    if output is not None:
        output.append(out.clone())
    pages = fmt.pages_boundary(context - 1) // bs
    window = context - pages * bs  # window rows, the token's own included
    read = batch * hkv * (pages * lay.region_bytes + window * (2 * d + 4)) + q.numel() * q.element_size()
    row = {"context": context, "batch": batch, "hq": hq, "hkv": hkv, "d": d, "splits": md.decode_splits,
           "alias_blocks": alias_blocks,
           "ms": ms, "bytes_read": read, "bandwidth": read / (ms * 1e-3),
           "step_ms": _graph_time(step), "step_unfused_ms": _graph_time(step_unfused)}
    if layers > 1:
        row.update(layers=layers, layers_ms=layers_ms, layers_bandwidth=read / (layers_ms * 1e-3),
                   layers_step_ms=layers_step_ms)
    if breakdown:
        row["kernels_ms"] = kernel_breakdown(run)
        row["step_kernels_ms"] = kernel_breakdown(step)
    fa = _flash_ms(batch, 1, context, hq, hkv, d, dtype, graph=True) if flash else None
    if fa is not None:
        row["flash_attn_bf16_ms"] = fa
        row["flash_attn_bf16_bytes"] = batch * context * hkv * 2 * d * 2
        if layers > 1:
            row["flash_attn_bf16_layers_ms"] = _flash_ms(batch, 1, context, hq, hkv, d, dtype, graph=True,
                                                         layers=layers)
    return row


def _flash_ms(batch: int, qlen: int, kv_len: int, hq, hkv, d, dtype, graph: bool, layers: int = 1) -> float | None:
    """bf16 paged attention through vLLM's FlashAttention (what `auto` runs; FA3 on Hopper): `batch`
    rows of `qlen` queries over `kv_len` keys each, causal, 16-token blocks (vLLM's default for
    it), FlashAttention's own split heuristics; timed from a CUDA graph when `graph`, per call of
    `layers` in one graph, each layer on its own cache."""
    import triton.testing

    try:
        from vllm.vllm_flash_attn import flash_attn_varlen_func
    except Exception as e:  # noqa: BLE001 - no vLLM or a build without it: the baseline is optional
        print(f"flash-attn unavailable: {e!r}", file=sys.stderr)
        return None
    block = 16
    nb = batch * math.ceil(kv_len / block)
    kcs = [torch.randn(nb, block, hkv, d, dtype=dtype, device="cuda") for _ in range(layers)]
    vcs = [torch.randn_like(kc) for kc in kcs]
    q = torch.randn(batch * qlen, hq, d, dtype=dtype, device="cuda")
    out = torch.empty_like(q)
    bt = torch.arange(nb, dtype=torch.int32, device="cuda").view(batch, -1)
    seq = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")
    cu_q = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * qlen

    def run(kc=kcs[0], vc=vcs[0]):
        flash_attn_varlen_func(q=q, k=kc, v=vc, out=out, cu_seqlens_q=cu_q, max_seqlen_q=qlen, seqused_k=seq,
                               max_seqlen_k=kv_len, softmax_scale=d ** -0.5, causal=True, block_table=bt)

    try:
        if graph:
            return _graph_time(*(lambda kc=kc, vc=vc: run(kc, vc) for kc, vc in zip(kcs, vcs)))
        return triton.testing.do_bench(run, warmup=10, rep=100, return_mode="median")
    except Exception as e:  # noqa: BLE001 - report, do not fail the int4 numbers
        print(f"flash-attn unavailable: {e!r}", file=sys.stderr)
        return None


def prefill_inputs(context: int, chunk: int, hq: int, hkv: int, d: int, dtype, device="cuda"):
    """(q, k, v, regions, md, out) of one request: `chunk` new tokens after `context` cached
    ones (rounded down to complete units, where a prefix hit or a chunk of a unit's size ends),
    pages in a shuffled block table."""
    context = context // fmt.UNIT * fmt.UNIT
    total = context + chunk
    num_blocks = fmt.blocks_held(total, d, dtype.itemsize)
    gen = torch.Generator(device=device).manual_seed(1)
    regions = _random_pages(num_blocks, hkv, d, gen, device)
    q = torch.randn(chunk, hq, d, dtype=dtype, device=device, generator=gen)
    k = torch.randn(chunk, hkv, d, dtype=dtype, device=device, generator=gen)
    v = torch.randn(chunk, hkv, d, dtype=dtype, device=device, generator=gen)
    out = torch.empty(chunk, hq, d, dtype=dtype, device=device)
    i32 = lambda x, dev=device: torch.tensor(x, dtype=torch.int32, device=dev)
    bt = torch.randperm(num_blocks, device=device, generator=gen).to(torch.int32).view(1, -1)
    md = S4KVMetadata(1, chunk, chunk, total, i32([0, chunk]), i32([total]), bt,
                      i32([0, chunk], "cpu"), i32([total], "cpu"))
    return q, k, v, regions, md, out


def time_prefill(inputs, d: int) -> dict:
    """Chunk attention on prefill_inputs(...): median ms of one layer (stage + FlashAttention; the
    step's plan is made once for all layers and kept, as in serving), of the stage kernel alone, and
    the host time of planning the step (us). The store of the blocks the chunk completes is left
    out (store=False): it is not attention, and the numbers stay comparable with earlier runs. So is
    the queries' fp16 cast for a bf16 model, which the step's row kernel does in serving since
    2026-12-05 (quantize_rows(stage=...)); runs before then included it (two PyTorch kernels, 29 us
    at 2,048 tokens on the H200)."""
    import time

    import triton.testing

    from s4kv.kernels.chunk import ChunkWorkspace, chunk_attention, stage_pages, staged_queries, step_waves
    from s4kv.kernels.chunk_plan import PAGE, WINDOW
    from s4kv.kernels.store import quantize_rows

    q, k, v, regions, md, out = inputs
    staged_q = staged_queries(q, md)
    rows = quantize_rows(k, v, stage=None if staged_q is None else (q, staged_q, md.num_decodes))
    hkv = k.shape[1]
    t0 = time.perf_counter()
    for _ in range(20):
        md.chunk_waves = None
        step_waves(md, 0, hkv, d, k.device)
    plan_us = (time.perf_counter() - t0) / 20 * 1e6
    ms = triton.testing.do_bench(lambda: chunk_attention(q, rows, regions, md, 0, d ** -0.5, out, store=False,
                                                         staged_q=staged_q),
                                 warmup=10, rep=100, return_mode="median")
    (wave,) = step_waves(md, 0, hkv, d, k.device)
    kp, vp = ChunkWorkspace.get(len(wave.jobs), hkv, d, k.device)
    stage_ms = triton.testing.do_bench(lambda: (stage_pages(wave, rows, regions, md, q.dtype, kp, vp, WINDOW),
                                                stage_pages(wave, rows, regions, md, q.dtype, kp, vp, PAGE)),
                                       warmup=10, rep=100, return_mode="median")
    return {"ms": ms, "stage_ms": stage_ms, "plan_us": plan_us}


def bench_prefill_case(context: int, chunk: int, hq: int = 28, hkv: int = 4, d: int = 128,
                       dtype=torch.bfloat16) -> dict:
    """One layer's chunk attention: `chunk` new queries of one request after `context` cached tokens
    (complete blocks, quantized), as chunked prefill runs it. Next to bf16 FlashAttention on the
    same shape (vLLM's paged cache of 16-token blocks)."""
    inputs = prefill_inputs(context, chunk, hq, hkv, d, dtype)
    total = int(inputs[4].seq_lens_cpu[0])
    context = total - chunk
    t = time_prefill(inputs, d)
    flops = 4 * chunk * (context + (chunk + 1) / 2) * d * hq  # QK and PV over the causal keys
    row = {"kind": "prefill", "context": context, "chunk": chunk, "hq": hq, "hkv": hkv, "d": d, **t,
           "tflops": flops / (t["ms"] * 1e-3) / 1e12}
    fa = _flash_ms(1, chunk, total, hq, hkv, d, dtype, graph=False)
    if fa is not None:
        row["flash_attn_bf16_ms"] = fa
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="1024,8192,32768")
    ap.add_argument("--batches", default="64,32,8")
    ap.add_argument("--prefill-contexts", default="",
                    help="also time the chunk (prefill) kernel: a chunk of --chunk queries after each of "
                         "these cached contexts, e.g. 0,8192,30720")
    ap.add_argument("--chunk", type=int, default=2048, help="queries per prefill chunk (default 2048)")
    ap.add_argument("--breakdown", action="store_true",
                    help="also each decode kernel's own device time and the graph's time beside them")
    ap.add_argument("--layers", type=int, default=8,
                    help="also time the decode call and FlashAttention per call of this many layers' "
                         "calls in one CUDA graph, each layer on its own cache, as a model's step runs "
                         "them (default 8; 1: only the one-call graph)")
    ap.add_argument("--alias-blocks", type=int, default=None,
                    help="the rows' complete pages point into a pool of this many blocks, shared by the "
                         "layers: the same kernels on data that stays in L2 (decode_inputs); "
                         "FlashAttention is then left out")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    copy = copy_bandwidth()
    rows = []
    print(f"device {torch.cuda.get_device_name()}; copy bandwidth {copy / 1e12:.2f} TB/s"
          + (f"; complete pages in a pool of {args.alias_blocks} blocks (L2): 'of copy' is what they would"
             " read from DRAM over the time" if args.alias_blocks else ""))
    print(f"{'context':>8} {'batch':>6} {'splits':>6} {'us':>9} {'GB/s':>8} {'of copy':>8} {'FA bf16 us':>11} "
          f"{'step us':>8} {'unfused':>8}"
          + (f" | {args.layers} layers per graph: {'us':>6} {'of copy':>8} {'FA bf16 us':>11} {'step us':>8}"
             if args.layers > 1 else ""))
    for ctx, b in zip(map(int, args.contexts.split(",")), map(int, args.batches.split(","))):
        r = bench_case(ctx, b, breakdown=args.breakdown, layers=args.layers, alias_blocks=args.alias_blocks,
                       flash=not args.alias_blocks)
        r["copy_bandwidth"] = copy
        r["fraction_of_copy"] = r["bandwidth"] / copy
        if args.layers > 1:
            r["layers_fraction_of_copy"] = r["layers_bandwidth"] / copy
        rows.append(r)
        fa = f"{r['flash_attn_bf16_ms'] * 1e3:11.1f}" if "flash_attn_bf16_ms" in r else f"{'n/a':>11}"
        print(f"{ctx:8d} {b:6d} {r['splits']:6d} {r['ms'] * 1e3:9.1f} {r['bandwidth'] / 1e9:8.0f} "
              f"{r['fraction_of_copy']:8.1%} {fa} {r['step_ms'] * 1e3:8.1f} {r['step_unfused_ms'] * 1e3:8.1f}"
              + (f" | {'':>20} {r['layers_ms'] * 1e3:6.1f} {r['layers_fraction_of_copy']:8.1%} "
                 + (f"{r['flash_attn_bf16_layers_ms'] * 1e3:11.1f}" if r.get("flash_attn_bf16_layers_ms")
                    else f"{'n/a':>11}") + f" {r['layers_step_ms'] * 1e3:8.1f}" if args.layers > 1 else ""),
              flush=True)
        if args.breakdown:
            for total, parts in ((r["ms"], r["kernels_ms"]), (r["step_ms"], r["step_kernels_ms"])):
                print("         " + "; ".join(f"{name} {t * 1e3:.1f} us" for name, t in parts.items())
                      + f"; beside them in the graph {(total - sum(parts.values())) * 1e3:.1f} us", flush=True)
    if args.prefill_contexts:
        print(f"{'context':>8} {'chunk':>6} {'us':>9} {'stage us':>9} {'plan us':>8} {'TFLOP/s':>8} "
              f"{'FA bf16 us':>11} {'FA / ours':>9}")
    for ctx in (int(c) for c in args.prefill_contexts.split(",") if c):
        r = bench_prefill_case(ctx, args.chunk)
        rows.append(r)
        fa = r.get("flash_attn_bf16_ms")
        print(f"{r['context']:8d} {r['chunk']:6d} {r['ms'] * 1e3:9.1f} {r['stage_ms'] * 1e3:9.1f} "
              f"{r['plan_us']:8.0f} {r['tflops']:8.1f} "
              + (f"{fa * 1e3:11.1f} {fa / r['ms']:9.2f}" if fa else f"{'n/a':>11} {'':>9}"), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
