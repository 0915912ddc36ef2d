"""`s4kv validate` tells "this model cannot be served" (exit 1) from "the hub cannot be asked now"
(exit 75), each in one line: the real validator against a local stand-in for the Hugging Face
Hub, run directly and through the deploy launcher (which retries on 75 and refuses on anything
but 0). A model id `org/status-<code>` makes the stand-in answer every request with <code>."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from deploy_helpers import LAUNCHER, FakeInstance, write_exe

ROOT = Path(__file__).resolve().parents[1]


class _Hub(http.server.BaseHTTPRequestHandler):
    def _answer(self):
        part = next((p for p in self.path.split("/") if p.startswith("status-")), "status-404")
        self.send_response(int(part.removeprefix("status-")))
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(b'{"error": "stand-in hub"}')

    do_GET = do_HEAD = _answer

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def hub():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def _env(tmp: Path, endpoint: str, **extra) -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "S4KV_"))}
    env.update(HF_HOME=str(tmp / "hf"), HF_ENDPOINT=endpoint, **extra)  # an empty cache: every fetch asks the hub
    return env


def _validate(model: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "s4kv.cli", "validate", model], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


@pytest.fixture(scope="module")
def answers(hub, tmp_path_factory):
    """Every case at once (the hub client backs off for ~25 s before giving up on a 5xx/429)."""
    tmp = tmp_path_factory.mktemp("validate")
    empty = tmp / "empty-model-dir"
    empty.mkdir()
    cases = {
        "503": ("org/status-503", _env(tmp, hub)),
        "429": ("org/status-429", _env(tmp, hub)),
        "404": ("org/status-404", _env(tmp, hub)),
        "401": ("org/status-401", _env(tmp, hub)),
        "no dns": ("org/model", _env(tmp, "http://hub.invalid")),
        "offline": ("org/model", _env(tmp, hub, HF_HUB_OFFLINE="1")),
        "empty dir": (str(empty), _env(tmp, hub)),
        "no dir": (str(tmp / "no-such-dir"), _env(tmp, hub)),
    }
    with ThreadPoolExecutor(len(cases)) as pool:
        futures = {name: pool.submit(_validate, *case) for name, case in cases.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.parametrize("case,rc,says", [
    ("503", 75, "CANNOT CHECK NOW: org/status-503: the Hugging Face Hub answered 503; try again later"),
    ("429", 75, "CANNOT CHECK NOW: org/status-429: the Hugging Face Hub answered 429; try again later"),
    ("no dns", 75, "CANNOT CHECK NOW: org/model: the Hugging Face Hub cannot be reached"),
    ("404", 1, "NO CONFIG: org/status-404: the Hugging Face Hub answered 404 (no such model"),
    ("401", 1, "NO CONFIG: org/status-401: the Hugging Face Hub answered 401"),
    ("offline", 1, "NO CONFIG: org/model: HF_HUB_OFFLINE is set and its config is not in the local cache"),
    ("empty dir", 1, "a local directory without config.json or params.json"),
    ("no dir", 1, "no-such-dir: no such local directory"),
])
def test_validate_answers_in_one_line_with_an_exit_code_per_kind_of_failure(answers, case, rc, says):
    r = answers[case]
    assert r.returncode == rc, (r.returncode, r.stdout, r.stderr[-2000:])
    assert says in r.stdout
    assert len(r.stdout.strip().splitlines()) == 1, r.stdout
    assert "Traceback" not in r.stderr and "ValidationError" not in r.stderr, r.stderr[-2000:]


def test_the_launcher_retries_an_unreachable_hub_and_refuses_a_missing_model(hub, tmp_path):
    """The deploy launcher with the real `s4kv validate` in its venv: a hub answering 503 is a
    transient failure (75: systemd restarts the unit later), a model the hub does not have a
    refusal (78: the stack rolls back as config-refused)."""
    inst = FakeInstance(tmp_path)
    write_exe(inst.venv / "bin/s4kv", f"#!/bin/sh\ncd {ROOT} && exec {sys.executable} -m s4kv.cli \"$@\"\n")
    try:
        def launch(model):
            envfile = inst.base / f"{model.replace('/', '_')}.env"
            envfile.write_text(f"S4KV_MODEL_ID={model}\nS4KV_VENV={inst.venv}\n")
            env = inst.env(S4KV_SERVE_ENV=envfile, S4KV_DRY_RUN="1", HF_HOME=tmp_path / "hf", HF_ENDPOINT=hub)
            return subprocess.run([str(LAUNCHER)], env=env, capture_output=True, text=True, check=False, timeout=300)

        with ThreadPoolExecutor(2) as pool:
            flaky, missing = pool.map(launch, ["org/status-503", "org/status-404"])
    finally:
        inst.cleanup()
    assert flaky.returncode == 75, flaky.stderr
    assert "could not validate org/status-503 now" in flaky.stderr and "answered 503" in flaky.stderr
    assert missing.returncode == 78, missing.stderr
    assert "answered 404" in missing.stderr
