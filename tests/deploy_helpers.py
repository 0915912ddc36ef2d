"""Helpers of the deploy tests: the CloudFormation template as data, synthetic wheels, and a
stand-in for the instance's system commands (systemd, journalctl, cfn-signal, CloudWatch agent,
vLLM, `s4kv validate`), so the boot path runs for real on a CI machine without AWS or a GPU.

The stand-in systemd (`systemctl`) runs the real unit's ExecStart (the real s4kv-serve launcher)
under a small supervisor that follows the unit file's Restart=, RestartPreventExitStatus= and
StartLimitBurst=/StartLimitIntervalSec=, prefixing /etc and /opt paths with a temporary root.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
IMAGE = DEPLOY / "image"
TEMPLATE = DEPLOY / "cfn-gpu-serving.yaml"
LAUNCHER = IMAGE / "s4kv-serve"
BOOTSTRAP = IMAGE / "s4kv-bootstrap"
UNIT_FILE = IMAGE / "s4kv-serve.service"


# ------------------------------------------------------------------------ CloudFormation YAML

class _CfnLoader(yaml.SafeLoader):
    pass


def _tag(loader, tag_suffix, node):
    name = "Ref" if tag_suffix == "Ref" else f"Fn::{tag_suffix}"
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        if tag_suffix == "GetAtt":
            value = value.split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return {name: value}


_CfnLoader.add_multi_constructor("!", _tag)


def load_template(path: Path = TEMPLATE) -> dict:
    """The template with short-form intrinsics (!Ref, !Sub, ...) as their long forms."""
    return yaml.load(path.read_text(), Loader=_CfnLoader)


def substitute(text: str, values: dict[str, str]) -> str:
    """Fn::Sub for a test: ${Name} and ${AWS::X} from `values`; fails on a missing one."""
    def repl(m):
        key = m.group(1)
        if key.startswith("!"):
            return "${" + key[1:] + "}"
        if key not in values:
            raise KeyError(f"no value for ${{{key}}}")
        return str(values[key])
    return re.sub(r"\$\{([^}]+)\}", repl, text)


# -------------------------------------------------------------------------- synthetic wheels

def synthetic_wheel(out: Path, dist: str, version: str, package: str, script: str | None = None,
                    requires: tuple[str, ...] = ()) -> Path:
    """A tiny pure-Python wheel with `package`, a console script `script` and `requires`."""
    from forklayer.testing import make_wheel

    di = f"{dist.replace('-', '_')}-{version}.dist-info"
    files = {
        f"{package}/__init__.py": f"__version__ = {version!r}\n".encode(),
        f"{package}/cli.py": b"def main():\n    print('synthetic')\n",
    }
    if script:
        files[f"{di}/entry_points.txt"] = f"[console_scripts]\n{script} = {package}.cli:main\n".encode()
    return make_wheel(out, dist, version, files, requires=requires)


# ---------------------------------------------------------------------------- small utilities

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def py_script(body: str) -> str:
    return f"#!{sys.executable}\n{body}"


def kill_group(pid: int, sig=signal.SIGKILL) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# --------------------------------------------------------------------------- fake executables

FAKE_SYSTEMCTL = r'''
import json, os, signal, subprocess, sys, time
from pathlib import Path

STATE = Path(os.environ["FAKE_STATE"])
ROOT = os.environ["S4KV_ROOT"]
UNIT_DIR = Path(os.environ["FAKE_UNIT_DIR"])

def record(argv):
    with open(STATE / "systemctl.log", "a") as f:
        f.write(json.dumps(argv) + "\n")

def rooted(value):
    return ROOT.rstrip("/") + value if value.startswith(("/etc/", "/opt/", "/var/")) else value

def unit_conf(unit):
    conf, env = {}, {}
    for line in (UNIT_DIR / unit).read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;[" or "=" not in line:
            continue
        key, value = line.split("=", 1)
        if key == "Environment":
            k, v = value.split("=", 1)
            env[k] = rooted(v)
        else:
            conf[key] = value
    return conf, env

def seconds(v):
    v = v.strip()
    return float(v[:-3]) * 60 if v.endswith("min") else float(v.rstrip("s"))

def state_file(unit):
    return STATE / (unit + ".json")

def write_state(unit, **kw):
    st = json.loads(state_file(unit).read_text()) if state_file(unit).exists() else {}
    st.update(kw)
    tmp = state_file(unit).with_suffix(".tmp")
    tmp.write_text(json.dumps(st))
    tmp.replace(state_file(unit))

def supervise(unit):
    conf, env = unit_conf(unit)
    for key in os.environ.get("FAKE_UNIT_ENV_SKIP", "").split(","):
        env.pop(key, None)  # e.g. HOME: keep the caller's warm caches
    argv = [rooted(a) for a in conf["ExecStart"].split()]
    prevent = {int(x) for x in conf.get("RestartPreventExitStatus", "").split()}
    burst = int(conf.get("StartLimitBurst", "5"))
    interval = seconds(conf.get("StartLimitIntervalSec", "10s"))
    restart_sec = float(os.environ.get("FAKE_RESTART_SEC", seconds(conf.get("RestartSec", "0.1s"))))
    child = None

    def stop(*_):
        if child and child.poll() is None:
            child.terminate()
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    starts, restarts = [], 0
    journal = open(STATE / (unit + ".journal"), "ab", buffering=0)
    while True:
        now = time.monotonic()
        starts = [t for t in starts if now - t < interval]
        if len(starts) >= burst:
            write_state(unit, ActiveState="failed", SubState="failed", Result="start-limit-hit")
            return
        starts.append(now)
        write_state(unit, ActiveState="active", SubState="running", Result="success",
                    NRestarts=restarts)
        child = subprocess.Popen(argv, env={**os.environ, **env}, stdout=journal, stderr=journal)
        rc = child.wait()
        write_state(unit, ExecMainStatus=rc)
        if rc == 0:
            write_state(unit, ActiveState="inactive", SubState="dead", Result="success")
            return
        if conf.get("Restart") in ("on-failure", "always") and rc not in prevent:
            write_state(unit, ActiveState="activating", SubState="auto-restart", Result="exit-code")
            time.sleep(restart_sec)
            restarts += 1
            continue
        write_state(unit, ActiveState="failed", SubState="failed", Result="exit-code")
        return

def main(argv):
    record(argv)
    args = [a for a in argv if not a.startswith("--")]
    verb = args[0] if args else ""
    units = args[1:]
    if verb == "_supervise":
        supervise(units[0])
    elif verb in ("start", "restart"):
        for unit in units:
            if not (UNIT_DIR / unit).exists():
                print(f"Unit {unit} not found.", file=sys.stderr)
                return 5
            write_state(unit, ActiveState="activating", SubState="start", Result="success",
                        ExecMainStatus=0, NRestarts=0)
            p = subprocess.Popen([sys.executable, __file__, "_supervise", unit],
                                 start_new_session=True, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            with open(STATE / "supervisors", "a") as f:
                f.write(f"{p.pid}\n")
    elif verb == "show":
        st = json.loads(state_file(units[0]).read_text()) if state_file(units[0]).exists() else {
            "ActiveState": "inactive", "SubState": "dead", "Result": "success",
            "ExecMainStatus": 0, "NRestarts": 0}
        for k in ("ActiveState", "SubState", "Result", "ExecMainStatus", "NRestarts"):
            print(f"{k}={st.get(k, '')}")
    return 0

sys.exit(main(sys.argv[1:]))
'''

FAKE_JOURNALCTL = r'''
import os, sys
from pathlib import Path
argv = sys.argv[1:]
unit = argv[argv.index("--unit") + 1]
n = int(argv[argv.index("--lines") + 1]) if "--lines" in argv else 10
path = Path(os.environ["FAKE_STATE"]) / (unit + ".journal")
lines = path.read_text(errors="replace").splitlines() if path.exists() else []
print("\n".join(lines[-n:]))
'''

FAKE_RECORDER = r'''
import json, os, sys
from pathlib import Path
with open(Path(os.environ["FAKE_STATE"]) / "{name}.log", "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
sys.exit(int(os.environ.get("FAKE_{env}_RC", "0")))
'''

# vllm: `serve MODEL ... --port P`; FAKE_VLLM_MODE: healthy (serve /health 200), crash (exit 1
# with a CUDA-style error), unhealthy (listen, /health 503), print-env (print HF_TOKEN, exit 0).
FAKE_VLLM = r'''
import http.server, json, os, sys
from pathlib import Path
argv = sys.argv[1:]
state = Path(os.environ["FAKE_STATE"])
with open(state / "vllm-argv.jsonl", "a") as f:
    f.write(json.dumps(argv) + "\n")
(state / "vllm-env.json").write_text(json.dumps(dict(os.environ)))  # what the launcher exported
mode = os.environ.get("FAKE_VLLM_MODE", "healthy")
print("INFO fake vllm", " ".join(argv), flush=True)
if mode == "crash":
    print("RuntimeError: CUDA error: out of memory", file=sys.stderr, flush=True)
    sys.exit(1)
if mode == "print-env":
    print("HF_TOKEN=" + os.environ.get("HF_TOKEN", "<unset>"), flush=True)
    sys.exit(0)
port = int(argv[argv.index("--port") + 1])
code = 200 if mode == "healthy" else 503

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(code if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *a):
        pass

http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''

# s4kv: `validate MODEL`; a model id containing "unsupported" is refused (exit 1) with a
# head_dim reason, "flaky" answers 75 (try again), anything else is supported.
FAKE_S4KV = r'''
import sys
assert sys.argv[1] == "validate", sys.argv
model = sys.argv[2]
if "unsupported" in model:
    print(f"{model}: not supported by int4_kivi: head_dim 96 (int4_kivi supports head_dim 64 and 128)")
    sys.exit(1)
if "flaky" in model:
    print(f"{model}: could not fetch config.json (connection reset)")
    sys.exit(75)
print(f"{model}: supported by int4_kivi (head_dim 128)")
'''

# aws secretsmanager get-secret-value: FAKE_AWS_SECRETS (JSON: secret id -> SecretString, or
# null for "unreachable": exit 255 like the CLI) overrides the default answer hf_test_token_123.
FAKE_AWS = r'''
import json, os, sys
from pathlib import Path
argv = sys.argv[1:]
with open(Path(os.environ["FAKE_STATE"]) / "aws.log", "a") as f:
    f.write(json.dumps(argv) + "\n")
secrets = json.loads(os.environ.get("FAKE_AWS_SECRETS", "{}"))
secret_id = argv[argv.index("--secret-id") + 1]
value = secrets.get(secret_id, "hf_test_token_123")
if value is None:
    print("Could not connect to the endpoint URL", file=sys.stderr)
    sys.exit(255)
print(value)
'''


class FakeInstance:
    """A temporary root laid out like the image (as provision.sh installs it), with fake
    system commands on `bin` and a fake venv (vllm, s4kv) under root/opt/s4kv/venv."""

    def __init__(self, base: Path):
        self.base = base
        self.root = base / "root"
        self.bin = base / "bin"
        self.state = base / "state"
        self.state.mkdir(parents=True)
        self.units = self.root / "etc/systemd/system"
        self.venv = self.root / "opt/s4kv/venv"
        # the image's files
        for src, dst, mode in [
            (LAUNCHER, "opt/s4kv/bin/s4kv-serve", 0o755),
            (BOOTSTRAP, "opt/s4kv/bin/s4kv-bootstrap", 0o755),
            (IMAGE / "cloudwatch-agent.json", "opt/s4kv/share/cloudwatch-agent.json", 0o644),
            (IMAGE / "s4kv-serve.service", "etc/systemd/system/s4kv-serve.service", 0o644),
            (IMAGE / "s4kv-serve-log.service", "etc/systemd/system/s4kv-serve-log.service", 0o644),
        ]:
            (self.root / dst).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, self.root / dst)
            (self.root / dst).chmod(mode)
        env_text = (IMAGE / "serve.env").read_text().replace(
            "S4KV_VENV=/opt/s4kv/venv", f"S4KV_VENV={self.venv}")
        (self.root / "etc/s4kv").mkdir(parents=True)
        (self.root / "etc/s4kv/serve.env").write_text(env_text)
        # the venv
        write_exe(self.venv / "bin/vllm", py_script(FAKE_VLLM))
        write_exe(self.venv / "bin/s4kv", py_script(FAKE_S4KV))
        # system commands
        write_exe(self.bin / "systemctl", py_script(FAKE_SYSTEMCTL))
        write_exe(self.bin / "journalctl", py_script(FAKE_JOURNALCTL))
        write_exe(self.bin / "cfn-signal", py_script(FAKE_RECORDER.replace("{name}", "cfn-signal")
                                                      .replace("{env}", "CFN_SIGNAL")))
        write_exe(self.bin / "amazon-cloudwatch-agent-ctl", py_script(
            FAKE_RECORDER.replace("{name}", "cwagent").replace("{env}", "CWAGENT")))
        write_exe(self.bin / "aws", py_script(FAKE_AWS))
        # /opt/s4kv/bin is on the user data's PATH; here the image's copy is reached through bin/
        write_exe(self.bin / "s4kv-bootstrap", f"#!/bin/sh\nexec {sys.executable} "
                  f"{self.root / 'opt/s4kv/bin/s4kv-bootstrap'} \"$@\"\n")

    def env(self, **extra) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("S4KV_", "FAKE_"))}
        env.update({
            "PATH": f"{self.bin}:{env.get('PATH', '/usr/bin:/bin')}",
            "S4KV_ROOT": str(self.root),
            "FAKE_STATE": str(self.state),
            "FAKE_UNIT_DIR": str(self.units),
            "FAKE_RESTART_SEC": "0.2",
            "S4KV_BOOTSTRAP_INTERVAL": "0.3",
            "S4KV_BOOTSTRAP_FLUSH_WAIT": "0",
        })
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def calls(self, name: str) -> list[list[str]]:
        path = self.state / f"{name}.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def vllm_env(self) -> dict[str, str]:
        """The environment of the last fake vllm start."""
        return json.loads((self.state / "vllm-env.json").read_text())

    def vllm_argv(self) -> list[list[str]]:
        path = self.state / "vllm-argv.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def unit_state(self, unit: str = "s4kv-serve.service") -> dict:
        path = self.state / f"{unit}.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def serve_env(self) -> str:
        return (self.root / "etc/s4kv/serve.env").read_text()

    def bootstrap_log(self) -> str:
        path = self.root / "var/log/s4kv/bootstrap.log"
        return path.read_text() if path.exists() else ""

    def cleanup(self) -> None:
        path = self.state / "supervisors"
        if path.exists():
            for pid in path.read_text().split():
                kill_group(int(pid))
