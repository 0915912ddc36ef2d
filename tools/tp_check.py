#!/usr/bin/env python3
"""Tensor parallel against one rank: teacher-forced prompt logprobs of the same token sequences at
tensor_parallel_size N and at 1, per KV dtype, in vLLM engines (CPU or GPU).

    python3 tools/tp_check.py --model smollm2 --tp 3                     # CPU: SmolLM2 has 3 kv heads
    python3 tools/tp_check.py --model random:qwen2.5-7b --layers 4 --tp 2  # GPU, Qwen2.5-7B shape

For each dtype it reports how far the TP-N logprobs of the actual tokens are from the TP-1 ones
(mean and largest |difference|, share of positions whose top-1 token agrees), next to the same for
bf16 (`auto`): the noise floor, since a different all-reduce order already moves bf16's logits. It
also reports int4_kivi against bf16 at TP 1, the quantization's own effect, for scale.

Models:
* a real checkpoint (`smollm2` or a path): real weights;
* ``random:NAME`` (``qwen2.5-7b``, ``llama-3.1-8b``): the real config with ``--layers`` layers and
  random weights written once to disk (s4kv.models.random_model). vLLM's ``load_format=dummy``
  cannot be used: it draws each rank's *shard* from the same seed, so a TP-2 model is not the TP-1
  model split in two, and its ±1e-3 uniform weights make every attention nearly uniform.

Each engine runs in its own subprocess, one after the other, so each starts on a free device.
Sequences: windows of the evaluation text for a model with a tokenizer, else random token ids
(seeded); long enough that most attended tokens are quantized.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
EVAL_TEXT = ROOT / "s4kv" / "data" / "eval_text.txt"


def child(args) -> None:
    """One engine: score every sequence, write {"logprobs": [[...]], "top1": [[...]]} to args.out."""
    import torch

    from s4kv.bench import worker

    on_cpu = not torch.cuda.is_available()
    mem = {"kv_cache_bytes": 1 << 30} if on_cpu else {"gpu_memory_utilization": args.gpu_memory_utilization}
    spec = {"model": args.model, "kv_cache_dtype": args.kv, "params": {"seed": 0, **mem}}
    extra = {"max_model_len": args.context + 1, "enforce_eager": True, "enable_chunked_prefill": True,
             "max_num_batched_tokens": args.chunk, "long_prefill_token_threshold": args.chunk, "max_num_seqs": 1,
             "tensor_parallel_size": args.tp, "skip_tokenizer_init": True}
    if args.tp > 1:
        extra["distributed_executor_backend"] = "mp"
        if on_cpu:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = worker.cpu_rank_binding(args.tp)
    llm, _ = worker.start_engine(spec, **extra)
    seqs = json.loads(Path(args.sequences).read_text())
    out = {"logprobs": [], "top1": []}
    for ids in seqs:
        s = worker.score_text(llm, ids)
        out["logprobs"].append(s["logprobs"])
        out["top1"].append(s["top1"])
    Path(args.out).write_text(json.dumps(out))
    # the engine core and, at TP > 1, its rank workers are processes of their own: stop them before
    # this one ends, or they outlive it holding the device
    worker.shutdown_engine(llm)


def sequences(model: str, context: int, n: int, seed: int) -> tuple[list[list[int]], str]:
    """n token sequences of `context` tokens: consecutive windows of the evaluation text where the model
    has a tokenizer and the text is long enough (real weights: real predictions), else random ids."""
    conf = json.loads((Path(model) / "config.json").read_text())
    if (Path(model) / "tokenizer_config.json").exists():
        from transformers import AutoTokenizer

        ids = AutoTokenizer.from_pretrained(model).encode(EVAL_TEXT.read_text())
        if len(ids) >= n * context:
            return [ids[i * context:(i + 1) * context] for i in range(n)], f"{EVAL_TEXT.name}, {n} windows"
    import random

    rng = random.Random(seed)
    return [[rng.randrange(conf["vocab_size"]) for _ in range(context)] for _ in range(n)], f"random ids (seed {seed})"


def compare(a: dict, b: dict) -> dict:
    """|logprob difference| of the actual tokens and top-1 agreement, over every scored position."""
    from s4kv.bench import metrics

    def flat(runs: list[list]) -> list:
        return [x for run in runs for x in run]

    diffs = sorted(abs(x - y) for x, y in zip(flat(a["logprobs"]), flat(b["logprobs"]), strict=True))
    return {"mean_abs": sum(diffs) / len(diffs), "p99_abs": diffs[int(0.99 * (len(diffs) - 1))],
            "max_abs": diffs[-1], "top1_agreement": metrics.top1_agreement(flat(a["top1"]), flat(b["top1"])),
            "positions": len(diffs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--sequences", help=argparse.SUPPRESS)
    ap.add_argument("--model", required=True, help="`smollm2`, a checkpoint path, or random:NAME")
    ap.add_argument("--layers", type=int, default=4, help="random:NAME: layers of the random checkpoint (default 4)")
    ap.add_argument("--kv", default="auto,int4_kivi", help="KV dtypes (default auto,int4_kivi; auto is the noise floor)")
    ap.add_argument("--tp", type=int, required=True, help="tensor_parallel_size compared with 1")
    ap.add_argument("--context", type=int, default=4096, help="tokens per sequence (default 4096)")
    ap.add_argument("--num-sequences", type=int, default=4, help="sequences (default 4)")
    ap.add_argument("--chunk", type=int, default=512, help="chunked-prefill tokens per step (default 512)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the comparison here")
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0

    from s4kv import models

    if args.model.startswith("random:"):
        model = str(models.random_model(args.model.split(":", 1)[1], args.layers, seed=args.seed))
    else:
        model = models.resolve(args.model)
    seqs, source = sequences(model, args.context, args.num_sequences, args.seed)
    kvs = args.kv.split(",")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        seq_file = Path(tmp) / "sequences.json"
        seq_file.write_text(json.dumps(seqs))
        for kv in kvs:
            for tp in (1, args.tp):
                out = Path(tmp) / f"{kv}-tp{tp}.json"
                cmd = [sys.executable, __file__, "--child", "--model", model, "--kv", kv, "--tp", str(tp),
                       "--context", str(args.context), "--chunk", str(args.chunk), "--sequences", str(seq_file),
                       "--gpu-memory-utilization", str(args.gpu_memory_utilization), "--out", str(out)]
                t0 = time.time()
                # its own session: whatever of the engine outlives it (workers of a failed start) is
                # killed with the session, so the next engine finds the device free
                proc = subprocess.Popen(cmd, start_new_session=True)
                rc = proc.wait()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                print(f"[tp_check] {kv} at TP {tp}: exit {rc} after {time.time() - t0:.0f} s", flush=True)
                if rc or not out.exists():
                    return 1
                results[(kv, tp)] = json.loads(out.read_text())
    report = {"model": args.model, "layers": args.layers if args.model.startswith("random:") else None,
              "tp": args.tp, "context": args.context, "sequences": args.num_sequences, "tokens": source,
              "chunk": args.chunk, "tp_vs_1": {kv: compare(results[(kv, args.tp)], results[(kv, 1)]) for kv in kvs}}
    if "auto" in kvs:  # the quantization's own effect at each TP size: a rank that mixed up heads or
        # pages would move it far beyond the TP-1 figure
        report["vs_auto"] = {f"{kv} at TP {tp}": compare(results[(kv, tp)], results[("auto", tp)])
                             for kv in kvs if kv != "auto" for tp in (1, args.tp)}
    print(f"{args.model}, {args.num_sequences} x {args.context} tokens ({source}), chunked prefill {args.chunk}")
    print(f"  {'':<26} {'mean |dlp|':>11} {'p99 |dlp|':>10} {'max |dlp|':>10} {'top-1 agree':>12}")
    rows = [(f"{kv} TP {args.tp} vs TP 1", c) for kv, c in report["tp_vs_1"].items()]
    rows += [(f"{name} vs auto", c) for name, c in report.get("vs_auto", {}).items()]
    for name, c in rows:
        print(f"  {name:<26} {c['mean_abs']:11.5f} {c['p99_abs']:10.5f} {c['max_abs']:10.5f} {c['top1_agreement']:12.4%}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
