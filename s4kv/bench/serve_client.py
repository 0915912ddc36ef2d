"""The client side of `s4kv bench serve` for one server: every load point's `vllm bench serve` in one
process, so vLLM is imported once per server instead of once per point (10-20 s each on a small
machine, minutes of a GPU lease over a sweep).

    python -m s4kv.bench.serve_client PLAN.json

PLAN: {"metrics_url": "http://127.0.0.1:P/metrics", "metrics_interval": seconds, "points": [{"id", "argv", "log",
"result", "done"}]}.
Each point runs through vLLM's own CLI entry point (`vllm.entrypoints.cli.main.main`, what the `vllm`
script runs) with sys.argv = ["vllm", *argv], its output (file descriptors 1 and 2) in the point's log,
/metrics sampled around it (s4kv.bench.prom). Then the point's `done` file gets {status, reason, kv,
started, duration_s}; the orchestrator (s4kv.bench.online.run_points) waits for those files in order.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

from s4kv.bench import prom


@contextlib.contextmanager
def output_to(path: str):
    """File descriptors 1 and 2 into `path` (vLLM's logging handlers hold the original sys.stdout and
    sys.stderr objects, so replacing those would not catch everything)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "w") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def run_one(point: dict, metrics_url: str, metrics_interval: float) -> dict:
    from vllm.entrypoints.cli.main import main as vllm_main

    t = time.perf_counter()
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    status, reason, kv = "ok", None, {}
    with output_to(point["log"]):
        print(shlex.join(["vllm", *point["argv"]]), flush=True)
        try:
            sampler = prom.Sampler(metrics_url, metrics_interval).start()
        except OSError as e:
            return {"status": "failed", "reason": f"the server's /metrics does not answer: {e}", "kv": {},
                    "started": started, "duration_s": round(time.perf_counter() - t, 2)}
        sys.argv = ["vllm", *point["argv"]]
        try:
            vllm_main()
        except SystemExit as e:  # argparse errors, vLLM's own exits
            if e.code not in (0, None):
                status, reason = "failed", f"vllm bench serve exited {e.code}"
        except Exception as e:  # noqa: BLE001 - the point's record carries it; the next point still runs
            traceback.print_exc()
            status, reason = "failed", f"vllm bench serve: {type(e).__name__}: {e}"
        try:
            kv = sampler.stop()
        except OSError as e:
            print(f"[s4kv.bench.serve_client] /metrics after the point: {e}", flush=True)
    if status == "ok" and not Path(point["result"]).is_file():
        status, reason = "failed", f"vllm bench serve wrote no {point['result']}"
    return {"status": status, "reason": reason, "kv": kv, "started": started,
            "duration_s": round(time.perf_counter() - t, 2)}


def main(argv: list[str]) -> int:
    plan = json.loads(Path(argv[0]).read_text())
    for point in plan["points"]:
        result = run_one(point, plan["metrics_url"], plan["metrics_interval"])
        done = Path(point["done"])
        tmp = done.with_name(done.name + ".tmp")
        tmp.write_text(json.dumps(result))
        tmp.rename(done)
        print(f"[s4kv.bench.serve_client] {point['id']}: {result['status']} ({result['duration_s']} s)", flush=True)
    sys.stdout.flush()
    # vLLM's bench leaves background threads (tokenizer pools); the results are on disk: leave now
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
