#!/usr/bin/env python3
"""Where an engine's decode step spends its time, kernel by kernel, for each KV dtype.

    python3 tools/gpu/profile_decode.py [--kv auto,int4_kivi] [--context 8192] [--batch 32]
                                        [--steps 32] [--model dummy:qwen2.5-7b] [--bench-like] [--json OUT]

`s4kv bench speed` gives a decode step's wall time; s4kv.kernels.bench gives the attention
kernels alone. This splits the rest: per dtype, in a process of its own (the GPU's memory is
free again when it exits), an engine running in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0, so
that PyTorch's profiler sees the model runner's kernels), CUDA graphs on, prefix caching on,
`batch` random prompts of `context` tokens. The prompts are prefilled once; then, under the
profiler, generate(max_tokens=1) (the prefix-cache hit: a block of prefill) and
generate(max_tokens=1 + steps). The difference of the two, over `steps`, is one decode step:
wall time, each kernel's device time (by name), and the GPU's idle time (between the union of the
kernels' intervals).

`--bench-like` turns prefix caching off, as `s4kv bench speed` runs: both windows then prefill
every prompt, and their difference also holds the steps where the first requests decode while
later prompts still prefill (what the speed bench's decode time counts).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _kernel_times(prof, cuda: bool) -> dict[str, float]:
    """Device microseconds per kernel name over a profiled window (CPU microseconds per op without a GPU)."""
    if cuda:
        from s4kv.kernels.bench import device_us_by_kernel

        return device_us_by_kernel(prof)
    out: dict[str, float] = {}
    for ev in prof.key_averages():
        if ev.self_cpu_time_total:
            out[ev.key] = out.get(ev.key, 0.0) + ev.self_cpu_time_total
    return out


def _busy(prof, cuda: bool) -> dict:
    """The GPU's busy time (the union of kernel intervals), its idle time between the first and the
    last kernel, and how many idle gaps were over 1 ms (a host that cannot keep the GPU fed)."""
    if not cuda:
        return {"busy_us": None, "idle_us": None, "gaps_over_1ms": None}
    spans = sorted((ev.time_range.start, ev.time_range.end) for ev in prof.events()
                   if ev.device_type.name == "CUDA" and ev.time_range.end > ev.time_range.start)
    busy, idle, gaps, end = 0.0, 0.0, 0, None
    for a, b in spans:
        if end is None or a > end:
            if end is not None:
                idle += a - end
                gaps += (a - end) > 1000
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    return {"busy_us": busy, "idle_us": idle, "gaps_over_1ms": gaps}


def profile_one(args) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import random

    import torch
    from torch.profiler import ProfilerActivity, profile
    from vllm import LLM, SamplingParams

    from s4kv.models import resolve

    model = resolve(args.model)
    kw = {"model": model, "kv_cache_dtype": args.one, "enable_prefix_caching": not args.bench_like, "seed": 0,
          "max_model_len": args.context + args.steps + 8, "max_num_seqs": max(64, args.batch)}
    if args.model.startswith("dummy:"):
        kw.update(load_format="dummy", skip_tokenizer_init=True)
    llm = LLM(**kw)
    rng = random.Random(0)
    prompts = [{"prompt_token_ids": [rng.randrange(100, 30000) for _ in range(args.context)]}
               for _ in range(args.batch)]

    cuda = torch.cuda.is_available()  # off a GPU (a plumbing check on the CPU) the profile is of CPU ops
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def gen(n):
        sp = SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True, detokenize=False)
        sync()
        t = time.perf_counter()
        llm.generate(prompts, sp, use_tqdm=False)
        sync()
        return time.perf_counter() - t

    gen(1)  # prefill: the prompts' blocks enter the prefix cache
    gen(1 + args.steps)  # warm-up of the decode graphs at this batch size
    windows = {}
    for name, n in (("short", 1), ("long", 1 + args.steps)):
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            wall = gen(n)
        windows[name] = {"wall_s": wall, "kernels_us": _kernel_times(prof, cuda), **_busy(prof, cuda)}
    # the same two windows without the profiler, three times: kernels launched programmatically may
    # overlap, which the profiler's tracing can change, so options of that kind are compared on these
    unprofiled = [(gen(1 + args.steps) - gen(1)) / args.steps * 1e6 for _ in range(3)]
    s, lg = windows["short"], windows["long"]
    per_step = {k: (lg["kernels_us"].get(k, 0.0) - s["kernels_us"].get(k, 0.0)) / args.steps
                for k in set(lg["kernels_us"]) | set(s["kernels_us"])}
    per_step = {k: v for k, v in sorted(per_step.items(), key=lambda kv: -kv[1]) if abs(v) >= 0.05}
    step_us = (lg["wall_s"] - s["wall_s"]) / args.steps * 1e6
    return {"kv_cache_dtype": args.one, "model": args.model, "context": args.context, "batch": args.batch,
            "steps": args.steps, "step_wall_us": step_us, "step_wall_unprofiled_us": unprofiled, "kernels_us_per_step": per_step,
            "kernel_sum_us": sum(per_step.values()), "torch": torch.__version__,
            "gpu_idle_us": (lg["idle_us"] - s["idle_us"]) / args.steps if cuda else None,
            "windows": {k: {x: w[x] for x in ("wall_s", "busy_us", "idle_us", "gaps_over_1ms")} for k, w in windows.items()}
            if cuda else None,
            "device": torch.cuda.get_device_name() if cuda else "cpu", "vllm": __import__("vllm").__version__}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kv", default="auto,int4_kivi")
    ap.add_argument("--model", default="dummy:qwen2.5-7b")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--top", type=int, default=14)
    ap.add_argument("--bench-like", action="store_true",
                    help="prefix caching off, as `s4kv bench speed` runs: both windows prefill the prompts, "
                         "so their difference holds the steps where decode rows share a step with a prefill")
    ap.add_argument("--json")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: profile this dtype in this process
    args = ap.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(profile_one(args)), flush=True)
        return 0
    results = []
    for kv in args.kv.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--one", kv, "--model", args.model,
               "--context", str(args.context), "--batch", str(args.batch), "--steps", str(args.steps)]
        cmd += ["--bench-like"] if args.bench_like else []
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(f"{kv}: failed (exit {proc.returncode})\n{proc.stderr[-3000:]}", flush=True)
            continue
        r = json.loads(lines[-1][len("RESULT "):])
        results.append(r)
        print(f"\n{kv}: decode step {r['step_wall_us']:.0f} us wall, kernels {r['kernel_sum_us']:.0f} us, "
              f"GPU idle {r['gpu_idle_us'] or 0:.0f} us, unprofiled "
              f"{' / '.join(f'{x:.0f}' for x in r['step_wall_unprofiled_us'])} us ({args.batch} x {args.context}, "
              f"{time.perf_counter() - t:.0f} s); windows {json.dumps(r['windows'])}", flush=True)
        for k, us in list(r["kernels_us_per_step"].items())[:args.top]:
            print(f"  {us:8.1f} us  {k[:110]}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
