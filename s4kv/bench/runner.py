"""Runs the plan: one worker process per (kv dtype, measurement), a progress bar over the runs and
one live line per finished result; every record is appended to results.jsonl as it arrives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from s4kv.bench import records


@dataclass
class Run:
    """One worker invocation."""

    measurement: str  # capacity | speed | quality | preflight
    kv_cache_dtype: str
    params: dict
    repeat: int = 1
    refused: str | None = None  # set when refused before starting (preflight / platform)
    check: dict | None = None  # the preflight's verdict on this dtype ({status, reason, backend})
    id: str = field(default="")

    def __post_init__(self) -> None:
        if not self.id:
            self.id = records.run_id(self.measurement, self.kv_cache_dtype, self.repeat)


def worker_command() -> list[str]:
    return [sys.executable, "-m", "s4kv.bench.worker"]


def run_worker(spec: dict, workdir: Path, name: str, timeout: float | None,
               command: list[str] | None = None, env: dict | None = None) -> tuple[dict, Path]:
    """Run one worker process; its stdout+stderr go to logs/<name>.log. Returns (result, log path).

    The worker runs in its own session, so a timeout or Ctrl-C ends it and the engine processes it
    started (its process group), nothing else."""
    specs, logs = workdir / "specs", workdir / "logs"
    specs.mkdir(parents=True, exist_ok=True)
    logs.mkdir(parents=True, exist_ok=True)
    spec_path, result_path, log_path = specs / f"{name}.json", specs / f"{name}.result.json", logs / f"{name}.log"
    spec_path.write_text(json.dumps(spec, indent=1))
    result_path.unlink(missing_ok=True)
    cmd = (command or worker_command()) + [str(spec_path), str(result_path)]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env=env)
        try:
            rc = proc.wait(timeout=timeout)
            reason = None
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc, reason = proc.returncode, f"timed out after {timeout:.0f} s"
        except KeyboardInterrupt:
            _kill_group(proc)
            raise
    if result_path.is_file():
        result = json.loads(result_path.read_text())
        result_path.unlink()  # it goes into results.jsonl; the spec stays (re-run it by hand)
    else:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        result = {"status": "failed",
                  "reason": reason or f"worker exited with code {rc} without a result; log tail:\n{tail}"}
    return result, log_path


def _kill_group(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def make_record(run: Run, result: dict, *, model: dict, command: str, argv: list[str], started: str,
                env: dict | None, log: str | None) -> dict:
    rec = {
        "schema": records.SCHEMA,
        "id": run.id,
        "measurement": run.measurement,
        "kv_cache_dtype": run.kv_cache_dtype,
        "repeat": run.repeat,
        "status": result.get("status", "failed"),
        "reason": result.get("reason"),
        "model": model,
        "params": run.params,
        "metrics": result.get("metrics") or {},
        "vs_auto": None,
        "raw": result.get("raw") or {},
        "engine": result.get("engine") or {},
        "env": result.get("env") or env or {},
        "command": command,
        "argv": argv,
        "started": started,
        "duration_s": result.get("duration_s", 0.0),
        "log": log,
        "preflight": run.check,
    }
    if rec["status"] != "ok" and not rec["reason"]:
        rec["reason"] = "no reason given"
    if result.get("capacity"):
        rec["metrics"].setdefault("capacity", result["capacity"])
    return rec


def fill_capacity_from_log(rec: dict, log_path: Path | None) -> None:
    """Capacity records: add the numbers vLLM logged; fill in what the engine objects lacked."""
    if rec["measurement"] != "capacity" or rec["status"] != "ok" or not log_path or not log_path.is_file():
        return
    parsed = records.parse_capacity_log(log_path.read_text(errors="replace"))
    m = rec["metrics"]
    m["log_kv_cache_tokens"] = parsed["kv_cache_tokens"]
    m["log_max_concurrency"] = parsed["max_concurrency"]
    if m.get("kv_cache_tokens") is None and parsed["kv_cache_tokens"] is not None:
        m["kv_cache_tokens"], m["source"] = parsed["kv_cache_tokens"], "log"
    if m.get("max_concurrency") is None and parsed["max_concurrency"] is not None:
        m["max_concurrency"] = parsed["max_concurrency"]


def flag_jit_compiles(rec: dict, log_path: Path | None) -> None:
    """Speed points whose timed region held a Triton compile (from the worker's log) carry the
    kernels' names under `jit_compiles_while_timing`; the report notes them."""
    if rec["measurement"] != "speed" or rec["status"] != "ok" or not log_path or not log_path.is_file():
        return
    compiles = records.jit_compiles_while_timing(log_path.read_text(errors="replace"))
    for point, names in zip(rec["metrics"].get("points", []), compiles):
        if names:
            point["jit_compiles_while_timing"] = names


def add_root_cause(rec: dict, log_path: Path | None) -> None:
    """A failed engine says "see root cause above": put the root cause from the log in the reason."""
    if rec["status"] != "failed" or not log_path or not log_path.is_file():
        return
    cause = records.root_cause(log_path.read_text(errors="replace"))
    if cause and cause not in (rec["reason"] or ""):
        rec["reason"] = f"{cause} (root cause, from the log; raised as: {rec['reason']})"


def summary_line(rec: dict) -> str:
    """The live line printed when a record arrives."""
    head = f"{rec['measurement']:<8} {records.label(rec):<22}"
    if rec["status"] != "ok":
        reason = (rec["reason"] or "").splitlines()[0][:160]
        return f"{head} {rec['status'].upper()}: {reason}"
    m, vs = rec["metrics"], rec.get("vs_auto") or {}
    dur = f"({rec['duration_s']:.0f} s)"
    if rec["measurement"] == "capacity":
        r = vs.get("kv_cache_tokens_ratio")
        conc = m.get("max_concurrency")
        return (f"{head} {m.get('kv_cache_tokens') or 0:>10,} KV tokens"
                + (f"  x{r:.2f} vs auto" if r else "")
                + (f"  max concurrency {conc:.2f} @ {m.get('max_model_len')}" if conc else "") + f"  {dur}")
    if rec["measurement"] == "quality":
        parts = []
        if m.get("perplexity") is not None:
            parts.append(f"ppl {m['perplexity']:.4f}")
        if "perplexity_delta_pct" in vs:
            parts.append(f"({vs['perplexity_delta_pct']:+.2f}%)")
        if "top1_agreement" in vs:
            parts.append(f"top-1 {100 * vs['top1_agreement']:.2f}%")
        g = vs.get("greedy")
        if g:
            parts.append(f"greedy identical {g['identical_sequences']}/{g['num_sequences']}, "
                         f"tokens {100 * g['token_agreement']:.1f}%, median 1st div {g['median_first_divergence']}")
        return f"{head} {' '.join(parts)}  {dur}"
    if rec["measurement"] == "speed":
        pts = [f"{p['context']}x{p['batch']}{'*' if p['mode'] == 'saturated' else ''}: "
               f"decode {p.get('decode_tok_s') or 0:,.0f} tok/s" for p in m.get("points", [])]
        return f"{head} {'; '.join(pts)}  {dur}"
    return head


def execute(runs: list[Run], *, out: Path, model: dict, command: str, argv: list[str],
            timeout: float | None, env: dict | None, spec_extra: dict | None = None,
            worker_cmd: list[str] | None = None, progress: bool = True) -> list[dict]:
    """Run every Run in order, append each record to out/results.jsonl, return the records."""
    from tqdm import tqdm

    jsonl = out / "results.jsonl"
    done: list[dict] = []
    bar = tqdm(total=len(runs), desc="s4kv bench", unit="run", disable=not progress, file=sys.stderr)
    try:
        for run in runs:
            bar.set_postfix_str(run.id)
            started, t = now(), time.perf_counter()
            log_path = None
            if run.refused:
                result = {"status": "refused", "reason": run.refused, "duration_s": 0.0}
            else:
                spec = {"kind": run.measurement, "kv_cache_dtype": run.kv_cache_dtype, "params": run.params,
                        "model": model["path"], "dummy": model["dummy"], **(spec_extra or {})}
                result, log_path = run_worker(spec, out, run.id, timeout, worker_cmd)
                result.setdefault("duration_s", round(time.perf_counter() - t, 2))
            rec = make_record(run, result, model=model, command=command, argv=argv, started=started,
                              env=env, log=str(log_path.relative_to(out)) if log_path else None)
            fill_capacity_from_log(rec, log_path)
            flag_jit_compiles(rec, log_path)
            add_root_cause(rec, log_path)
            rec["vs_auto"] = records.compare(rec, records.reference(done + [rec], run.measurement))
            done.append(rec)
            records.append_jsonl(jsonl, rec)
            bar.write(summary_line(rec), file=sys.stdout)
            sys.stdout.flush()
            bar.update(1)
    finally:
        bar.close()
    return done
