#!/usr/bin/env python3
"""Host time against device time of one layer's int4_kivi attention, outside CUDA graphs.

    python3 tools/gpu/host_overhead.py [--context 8192] [--decodes 32,31,31] [--chunks 0,512,2048]
                                       [--chunk-offset 0] [--kv int4_kivi,auto] [--cprofile N] [--json OUT]

vLLM captures int4_kivi in full CUDA graphs only for batches of single-token decodes
(s4kv.backend.metadata); a step with a prefill chunk in it (chunked prefill, continuous batching)
runs attention eagerly, between the graph's pieces, and every kernel launch is paid on the host.
For each batch (`decodes` decode rows of `context` tokens, plus one chunk row of `chunk` queries
after `context` // 256 * 256 + `chunk-offset` cached tokens when chunk > 0), this times
s4kv.backend.triton_ops.forward (the whole layer: rows, store, decode, chunk, window append)
eagerly:

- host: microseconds to issue one call (the GPU idle at the start, so the launch queue never
  blocks), with the step's chunk plan kept from the first call, as every layer after the first
  finds it;
- device: the call's kernels' device time (PyTorch's profiler);
- wall: calls back to back, synchronized at the end, per call.

With a context that is a multiple of 256 (the default) every decode row's new token completes its
unit, so each call also stores a unit per decode row: the block store's device time is in the
records (a serving decode row does that one step in 256). A chunk offset of 1..255 starts the chunk
inside a unit, with that many rows in its window: its store then reads the old window from the pages
it writes (s4kv.kernels.store), as chunks do when decode rows share the step's token budget.

A layer whose host time exceeds its device time leaves the GPU idle in eager steps. Next to it, the
same for bf16 (`auto`): vLLM's reshape_and_cache_flash + FlashAttention on a 16-bit paged cache of
the same batch, when vLLM is importable.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch

from s4kv import format as fmt
from s4kv.kernels import num_sms
from s4kv.kernels.batch import S4KVMetadata, plan_launch
from s4kv.kernels.bench import _fill_windows, _random_pages, device_us_by_kernel


def mixed_inputs(context: int, decodes: int, chunk: int, hq=28, hkv=4, d=128, dtype=torch.bfloat16,
                 device="cuda", chunk_offset: int = 0):
    """(q, k, v, regions, md, out): `decodes` rows at position context - 1 with their windows, and,
    when chunk > 0, one row of `chunk` queries after context // 256 * 256 + chunk_offset cached
    tokens (its window holding chunk_offset rows)."""
    gen = torch.Generator(device=device).manual_seed(0)
    ctx_chunk = context // fmt.UNIT * fmt.UNIT + chunk_offset
    lens = [context] * decodes + ([ctx_chunk + chunk] if chunk else [])
    qlens = [1] * decodes + ([chunk] if chunk else [])
    held = [fmt.blocks_held(n, d, dtype.itemsize) for n in lens]
    regions = _random_pages(sum(held), hkv, d, gen, device)
    perm = torch.randperm(sum(held), device=device, generator=gen).to(torch.int32)
    bt = torch.zeros(len(lens), max(held), dtype=torch.int32, device=device)
    at = 0
    for i, h in enumerate(held):
        bt[i, :h] = perm[at:at + h]
        at += h
    if decodes:
        _fill_windows(regions, bt[:decodes], (context - 1) // fmt.UNIT * fmt.UNIT_BLOCKS, d, dtype, gen)
    if chunk and chunk_offset:
        _fill_windows(regions, bt[decodes:], ctx_chunk // fmt.UNIT * fmt.UNIT_BLOCKS, d, dtype, gen)
    n = sum(qlens)
    q = torch.randn(n, hq, d, dtype=dtype, device=device, generator=gen)
    k = torch.randn(n, hkv, d, dtype=dtype, device=device, generator=gen)
    v = torch.randn(n, hkv, d, dtype=dtype, device=device, generator=gen)
    qsl = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32)
    seq = torch.tensor(lens, dtype=torch.int32)
    md = S4KVMetadata(len(lens), n, max(qlens), max(lens), qsl.to(device), seq.to(device), bt, qsl, seq)
    plan_launch(md, hkv, num_sms(torch.device(device)), uniform_decode=not chunk)
    out = torch.empty(n, hq, d, dtype=dtype, device=device)
    return q, k, v, regions, md, out


def time_call(fn, calls: int = 10, rounds: int = 5) -> dict:
    """host: issue time per call with the GPU idle at the start; wall: per call, synchronized at the
    end (medians over rounds); device: the kernels' device time per call (profiler)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    hosts, walls = [], []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        hosts.append((t1 - t0) / calls * 1e6)
        walls.append((t2 - t0) / calls * 1e6)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = {name: us / calls for name, us in device_us_by_kernel(prof).items()}
    return {"host_us": statistics.median(hosts), "wall_us": statistics.median(walls),
            "device_us": sum(kernels.values()), "launches": len(kernels), "kernels_us": kernels}


def int4_layer(context: int, decodes: int, chunk: int, hkv: int = 4, d: int = 128, chunk_offset: int = 0):
    """One eager int4_kivi layer call on mixed_inputs (the workspaces reserved for the batch), and
    the batch's metadata. The call writes the pages and windows (store=True): every call sees the
    same batch again, which is what a layer after the first sees (same metadata, its own cache)."""
    from s4kv.backend import triton_ops
    from s4kv.kernels.chunk import ChunkWorkspace
    from s4kv.kernels.decode import DecodeWorkspace
    from s4kv.kernels.store import StepRows

    q, k, v, regions, md, out = mixed_inputs(context, decodes, chunk, hkv=hkv, d=d, chunk_offset=chunk_offset)
    dev = q.device
    DecodeWorkspace.reserve(max(decodes, 1), q.shape[1], d, hkv, num_sms(dev), dev)
    StepRows.reserve(max(q.shape[0], 1), hkv, d, dev)
    if chunk:
        from s4kv.kernels.chunk_plan import scratch_pages

        ChunkWorkspace.reserve(scratch_pages(context + chunk_offset + chunk, chunk), hkv, d, dev)
    return (lambda: triton_ops.forward(q, k, v, regions, md, d ** -0.5, out)), md


def int4_case(context: int, decodes: int, chunk: int, hkv: int = 4, d: int = 128, chunk_offset: int = 0) -> dict:
    layer, md = int4_layer(context, decodes, chunk, hkv, d, chunk_offset)
    r = time_call(layer)
    if chunk:  # the step's chunk plan, made once per step by its first layer (kept by time_call's calls)
        from s4kv.kernels.chunk import step_waves

        t0 = time.perf_counter()
        for _ in range(20):
            md.chunk_waves = None
            step_waves(md, md.num_decodes, hkv, d, torch.device("cuda"))
        r["plan_us"] = (time.perf_counter() - t0) / 20 * 1e6
    return r


def bf16_case(context: int, decodes: int, chunk: int, hq=28, hkv=4, d=128, dtype=torch.bfloat16,
              chunk_offset: int = 0) -> dict | None:
    """What `auto` runs per layer outside a graph: reshape_and_cache_flash + FlashAttention."""
    try:
        from vllm import _custom_ops as ops
        from vllm.vllm_flash_attn import flash_attn_varlen_func
    except Exception as e:  # noqa: BLE001 - the baseline is optional
        print(f"bf16 baseline unavailable: {e!r}", file=sys.stderr)
        return None
    block = 16
    lens = [context] * decodes + ([context // fmt.UNIT * fmt.UNIT + chunk_offset + chunk] if chunk else [])
    qlens = [1] * decodes + ([chunk] if chunk else [])
    per_row = max(math.ceil(n / block) for n in lens)
    nb = len(lens) * per_row
    kc = torch.randn(nb, block, hkv, d, dtype=dtype, device="cuda")
    vc = torch.randn_like(kc)
    n = sum(qlens)
    q = torch.randn(n, hq, d, dtype=dtype, device="cuda")
    k = torch.randn(n, hkv, d, dtype=dtype, device="cuda")
    v = torch.randn_like(k)
    out = torch.empty_like(q)
    bt = torch.arange(nb, dtype=torch.int32, device="cuda").view(len(lens), -1)
    seq = torch.tensor(lens, dtype=torch.int32, device="cuda")
    cu_q = torch.tensor([0] + list(torch.tensor(qlens).cumsum(0)), dtype=torch.int32, device="cuda")
    # each new token's slot: row i's pages are i * per_row .. (bt above), its new tokens the last qlen positions
    slots = torch.cat([i * per_row * block + torch.arange(ln - ql, ln, device="cuda")
                       for i, (ln, ql) in enumerate(zip(lens, qlens))]).long()
    one = torch.ones((), dtype=torch.float32, device="cuda")

    def run():
        ops.reshape_and_cache_flash(k, v, kc, vc, slots, "auto", one, one)
        flash_attn_varlen_func(q=q, k=kc, v=vc, out=out, cu_seqlens_q=cu_q, max_seqlen_q=max(qlens),
                               seqused_k=seq, max_seqlen_k=max(lens), softmax_scale=d ** -0.5, causal=True,
                               block_table=bt)

    return time_call(run)


def _cprofile(args, top: int) -> None:
    """cProfile over 50 eager int4_kivi calls per batch (after a warm-up), by own time."""
    import cProfile
    import io
    import pstats

    for dec, ch in zip(map(int, args.decodes.split(",")), map(int, args.chunks.split(","))):
        layer, _ = int4_layer(args.context, dec, ch, chunk_offset=args.chunk_offset)
        for _ in range(3):  # compiles, and plans the step's chunks once
            layer()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(50):
            layer()
        prof.disable()
        torch.cuda.synchronize()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
        print(f"--- cProfile, {dec} decodes + chunk {ch}, 50 calls (us = s * 20000 per call)")
        print("\n".join(buf.getvalue().splitlines()[:top + 12]), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--decodes", default="32,31,31", help="decode rows per batch (one per --chunks entry)")
    ap.add_argument("--chunks", default="0,512,2048", help="the chunk row's queries per batch (0: none)")
    ap.add_argument("--chunk-offset", type=int, default=0,
                    help="the chunk row's cached tokens past a unit boundary (0..255: its window's rows)")
    ap.add_argument("--kv", default="int4_kivi,auto", help="int4_kivi and/or auto (bf16's FlashAttention)")
    ap.add_argument("--cprofile", type=int, default=0,
                    help="also where the host time of int4_kivi's calls goes: cProfile's N costliest functions")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not 0 <= args.chunk_offset < fmt.UNIT:
        ap.error(f"--chunk-offset must be 0..{fmt.UNIT - 1}")
    rows = []
    if args.cprofile:
        _cprofile(args, args.cprofile)
    print(f"device {torch.cuda.get_device_name()}; one layer, Qwen2.5-7B shape, bf16, eager, context {args.context}"
          f", chunk offset {args.chunk_offset}")
    print(f"{'decodes':>7} {'chunk':>6} {'kv':>10} {'host us':>8} {'device us':>9} {'wall us':>8} {'launches':>8}")
    for dec, ch in zip(map(int, args.decodes.split(",")), map(int, args.chunks.split(","))):
        for kv, fn in (("int4_kivi", int4_case), ("auto", bf16_case)):
            if kv not in args.kv.split(","):
                continue
            r = fn(args.context, dec, ch, chunk_offset=args.chunk_offset)
            if r is None:
                continue
            r.update(kv=kv, decodes=dec, chunk=ch, context=args.context, chunk_offset=args.chunk_offset)
            rows.append(r)
            print(f"{dec:7d} {ch:6d} {kv:>10} {r['host_us']:8.1f} {r['device_us']:9.1f} {r['wall_us']:8.1f} "
                  f"{r['launches']:8d}", flush=True)
            print("        " + "; ".join(f"{name[:40]} {us:.1f}" for name, us in r["kernels_us"].items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
