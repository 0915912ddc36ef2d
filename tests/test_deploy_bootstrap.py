"""The boot path without AWS or a GPU: the s4kv-serve launcher (serve.env -> `vllm serve` argv,
refusals and their exit codes), s4kv-bootstrap (serve.env, CloudWatch config, health wait), and
the template's user data run end to end against a stand-in systemd that runs the real launcher
(tests/deploy_helpers.py): healthy -> SUCCESS signal; refused model -> FAILURE config-refused
with the reason logged and no restart; crash loop -> restarts up to the start limit, then
FAILURE unit-failed; no /health -> FAILURE health-timeout; not an S4 KV image -> FAILURE.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import subprocess
import sys

import pytest
from deploy_helpers import (
    BOOTSTRAP,
    LAUNCHER,
    UNIT_FILE,
    FakeInstance,
    free_port,
    load_template,
    substitute,
    write_exe,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="needs bash and Linux process groups")


@pytest.fixture
def inst(tmp_path):
    fake = FakeInstance(tmp_path)
    yield fake
    fake.cleanup()


def launch(inst, env_text: str, dry=True, **env):
    envfile = inst.base / "serve.env"
    envfile.write_text(env_text)
    extra = {"S4KV_SERVE_ENV": envfile}
    if dry:
        extra["S4KV_DRY_RUN"] = "1"
    return subprocess.run([str(LAUNCHER)], env=inst.env(**extra, **env), capture_output=True,
                          text=True, check=False, timeout=60)


# ------------------------------------------------------------------------------- the launcher

def test_launcher_argv_from_serve_env(inst):
    r = launch(inst, f"""# comment
S4KV_MODEL_ID=Qwen/Qwen2.5-7B-Instruct
S4KV_KV_CACHE_DTYPE=int4_kivi
S4KV_HOST="0.0.0.0"
S4KV_PORT='8000'
  S4KV_MAX_MODEL_LEN=8192\r
S4KV_GPU_MEMORY_UTILIZATION=0.9
S4KV_SERVED_MODEL_NAME=qwen
S4KV_EXTRA_ARGS=--enforce-eager  --max-num-seqs 64
S4KV_VENV={inst.venv}
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        f"{inst.venv}/bin/vllm", "serve", "Qwen/Qwen2.5-7B-Instruct",
        "--kv-cache-dtype", "int4_kivi", "--host", "0.0.0.0", "--port", "8000",
        "--max-model-len", "8192", "--gpu-memory-utilization", "0.9",
        "--served-model-name", "qwen", "--enforce-eager", "--max-num-seqs", "64",
    ]
    assert "s4kv validate: Qwen/Qwen2.5-7B-Instruct: supported" in r.stderr


def test_launcher_defaults_and_empty_values(inst):
    r = launch(inst, f"S4KV_MODEL_ID=m\nS4KV_MAX_MODEL_LEN=0\nS4KV_GPU_MEMORY_UTILIZATION=\n"
                     f"S4KV_SERVED_MODEL_NAME=\nS4KV_EXTRA_ARGS=\nS4KV_VENV={inst.venv}\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[1:] == ["serve", "m", "--kv-cache-dtype", "int4_kivi",
                                    "--host", "0.0.0.0", "--port", "8000"]


def test_launcher_exports_allowed_keys_and_no_glob(inst, tmp_path):
    (tmp_path / "match-me").write_text("")
    r = launch(inst, f"S4KV_MODEL_ID=m\nS4KV_KV_CACHE_DTYPE=auto\nS4KV_EXTRA_ARGS=--x {tmp_path}/*\n"
                     "VLLM_API_KEY=k\nHF_HUB_OFFLINE=1\nCUDA_VISIBLE_DEVICES=0,1\nNCCL_DEBUG=WARN\n"
                     f"S4KV_VENV={inst.venv}\n", dry=False, FAKE_VLLM_MODE="print-env")
    assert r.returncode == 0, r.stderr
    assert inst.vllm_argv()[-1][-2:] == ["--x", f"{tmp_path}/*"]
    env = inst.vllm_env()
    assert (env["VLLM_API_KEY"], env["HF_HUB_OFFLINE"], env["CUDA_VISIBLE_DEVICES"], env["NCCL_DEBUG"]) == \
        ("k", "1", "0,1", "WARN")


# Keys that would change which code runs (or, misspelt, silently do nothing): each is refused by
# name, before anything is exported or run.
@pytest.mark.parametrize("line", [
    "LD_PRELOAD=/tmp/evil.so",
    "LD_LIBRARY_PATH=/tmp",
    "PYTHONPATH=/tmp/evil",
    "PYTHONSTARTUP=/tmp/evil.py",
    "PATH=/tmp/evil:/usr/bin",
    "BASH_ENV=/tmp/evil.sh",
    "S4KV_AWS_CLI=/tmp/evil",
    "S4KV_SERVE_ENV=/tmp/other.env",
    "S4KV_MAX_MODEL_LENGTH=4096",  # misspelt setting
    "CUDA_INJECTION64_PATH=/tmp/evil.so",
    "NCCL_NET_PLUGIN=/tmp/evil.so",
    "  HOME=/tmp",
    "vllm_api_key=lowercase",
])
def test_launcher_refuses_keys_outside_the_allow_list(inst, line):
    key = line.strip().split("=", 1)[0]
    r = launch(inst, f"S4KV_MODEL_ID=m\n{line}\nS4KV_VENV={inst.venv}\n", dry=False)
    assert r.returncode == 78, (r.returncode, r.stderr)
    assert f"serve.env:2: {key} may not be set in serve.env" in r.stderr, r.stderr
    assert inst.vllm_argv() == [] and inst.calls("aws") == []


@pytest.mark.parametrize("line", ["export LD_PRELOAD=/tmp/evil.so", "LD_PRELOAD =x", "S4KV_PORT 8000"])
def test_launcher_refuses_lines_that_are_not_assignments(inst, line):
    r = launch(inst, f"S4KV_MODEL_ID=m\n{line}\nS4KV_VENV={inst.venv}\n")
    assert r.returncode == 78 and "serve.env:2: not a KEY=VALUE line" in r.stderr, r.stderr


def test_launcher_values_are_data_not_code(inst, tmp_path):
    marker = tmp_path / "pwned"
    r = launch(inst, f"S4KV_MODEL_ID=m\nS4KV_SERVED_MODEL_NAME=$(touch {marker})\n"
                     f"S4KV_EXTRA_ARGS=--x `touch {marker}`;touch {marker}\n"
                     f"VLLM_LOGGING_PREFIX=${{IFS}}$(touch {marker})\nS4KV_VENV={inst.venv}\n",
               dry=False, FAKE_VLLM_MODE="print-env")
    assert r.returncode == 0, r.stderr
    assert not marker.exists()
    argv = inst.vllm_argv()[-1]
    assert argv[argv.index("--served-model-name") + 1] == f"$(touch {marker})"
    assert argv[-4:] == ["--x", "`touch", f"{marker}`;touch", str(marker)]  # split on blanks only
    assert inst.vllm_env()["VLLM_LOGGING_PREFIX"] == f"${{IFS}}$(touch {marker})"


def test_launcher_no_longer_runs_a_configurable_aws_cli(inst, tmp_path):
    """S4KV_AWS_CLI used to name the command run to fetch the token; now `aws` from the unit's PATH."""
    marker = tmp_path / "ran"
    evil = write_exe(tmp_path / "evil", f"#!/bin/sh\ntouch {marker}\necho stolen\n")
    arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:hf-AbCdEf"
    r = launch(inst, f"S4KV_MODEL_ID=m\nS4KV_HF_TOKEN_SECRET_ARN={arn}\nS4KV_VENV={inst.venv}\n",
               dry=False, FAKE_VLLM_MODE="print-env", S4KV_AWS_CLI=evil)
    assert r.returncode == 0, r.stderr
    assert not marker.exists() and "HF_TOKEN=hf_test_token_123" in r.stdout


@pytest.mark.parametrize("mode", [0o666, 0o660, 0o646, 0o620])
def test_launcher_refuses_a_serve_env_others_can_write(inst, mode):
    envfile = inst.base / "serve.env"
    envfile.write_text(f"S4KV_MODEL_ID=m\nS4KV_VENV={inst.venv}\n")
    envfile.chmod(mode)
    r = subprocess.run([str(LAUNCHER)], env=inst.env(S4KV_SERVE_ENV=envfile, S4KV_DRY_RUN="1"),
                       capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 78 and "is writable by group or others" in r.stderr, r.stderr
    envfile.chmod(0o640)
    r = subprocess.run([str(LAUNCHER)], env=inst.env(S4KV_SERVE_ENV=envfile, S4KV_DRY_RUN="1"),
                       capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 0, r.stderr


TRICKY_ENV = """# one parser: the quoting rules of both readers are the launcher's
S4KV_MODEL_ID="org/model"
S4KV_SERVED_MODEL_NAME='a b'   \r
  S4KV_MAX_MODEL_LEN=1024
VLLM_D=trailing blanks kept   
S4KV_EXTRA_ARGS=--x "y z" # not a comment
VLLM_A="unbalanced
VLLM_B=a=b=c
VLLM_C="x" "y"
S4KV_PORT=1
S4KV_PORT=8000
"""


def test_bootstrap_reads_serve_env_exactly_as_the_launcher_exports_it(inst, monkeypatch):
    envfile = inst.base / "serve.env"
    envfile.write_text(TRICKY_ENV + f"S4KV_VENV={inst.venv}\nS4KV_KV_CACHE_DTYPE=auto\n")
    r = launch(inst, envfile.read_text(), dry=False, FAKE_VLLM_MODE="print-env")
    assert r.returncode == 0, r.stderr
    exported = inst.vllm_env()
    mod = _bootstrap_module()
    monkeypatch.setenv("S4KV_ROOT", str(inst.root))  # the bootstrap runs the image's launcher
    values = mod.read_env(str(envfile))
    records = mod.parse_env(str(envfile))
    assert values == {k: exported[k] for k in values}
    assert values["S4KV_SERVED_MODEL_NAME"] == "a b" and values["VLLM_D"] == "trailing blanks kept   "
    assert values["S4KV_EXTRA_ARGS"] == '--x "y z" # not a comment' and values["VLLM_A"] == '"unbalanced'
    assert values["VLLM_B"] == "a=b=c" and values["VLLM_C"] == 'x" "y' and values["S4KV_PORT"] == "8000"
    assert [(n, k) for n, k, _ in records][:3] == [(2, "S4KV_MODEL_ID"), (3, "S4KV_SERVED_MODEL_NAME"),
                                                   (4, "S4KV_MAX_MODEL_LEN")]


def test_print_env_refuses_like_the_launcher(inst):
    envfile = inst.base / "serve.env"
    envfile.write_text("S4KV_MODEL_ID=m\nLD_PRELOAD=/tmp/x.so\n")
    r = subprocess.run([str(LAUNCHER), "--print-env"], env=inst.env(S4KV_SERVE_ENV=envfile),
                       capture_output=True, check=False, timeout=60)
    assert r.returncode == 78 and r.stdout == b"" and b"LD_PRELOAD may not be set" in r.stderr
    envfile.write_text("S4KV_MODEL_ID=m\n")
    r = subprocess.run([str(LAUNCHER), "--print-env"], env=inst.env(S4KV_SERVE_ENV=envfile),
                       capture_output=True, check=False, timeout=60)
    assert r.returncode == 0 and r.stdout == b"1\0S4KV_MODEL_ID\0m\0"
    r = subprocess.run([str(LAUNCHER), "--bogus"], env=inst.env(S4KV_SERVE_ENV=envfile),
                       capture_output=True, check=False, timeout=60)
    assert r.returncode == 2 and b"usage: s4kv-serve [--print-env]" in r.stderr


@pytest.mark.parametrize("text, message", [
    ("S4KV_KV_CACHE_DTYPE=int4_kivi\n", "S4KV_MODEL_ID is not set"),
    ("S4KV_MODEL_ID=m\nS4KV_PORT=80a\n", "S4KV_PORT=80a is not a TCP port"),
    ("S4KV_MODEL_ID=m\nS4KV_PORT=70000\n", "not a TCP port"),
    ("S4KV_MODEL_ID=m\nS4KV_MAX_MODEL_LEN=8k\n", "S4KV_MAX_MODEL_LEN=8k is not a number"),
    ("S4KV_MODEL_ID=m\nS4KV_GPU_MEMORY_UTILIZATION=90\n", "not a fraction"),
    ("S4KV_MODEL_ID=m\nthis is not an assignment\n", "serve.env:2: not a KEY=VALUE line"),
    ("S4KV_MODEL_ID=m\nS4KV_VENV=/nonexistent/venv\n", "/nonexistent/venv/bin/vllm is missing"),
    ("S4KV_MODEL_ID=org/unsupported-model\n",
     ("org/unsupported-model is refused for --kv-cache-dtype int4_kivi (s4kv validate exit 1): "
      "org/unsupported-model: not supported by int4_kivi: head_dim 96")),
])
def test_launcher_refuses_with_78(inst, text, message):
    if "S4KV_VENV" not in text:
        text += f"S4KV_VENV={inst.venv}\n"
    r = launch(inst, text)
    assert r.returncode == 78, (r.returncode, r.stderr)
    assert "s4kv-serve: error: " in r.stderr and message in r.stderr, r.stderr
    assert r.stdout == ""


def test_launcher_missing_env_file(inst):
    r = subprocess.run([str(LAUNCHER)], env=inst.env(S4KV_SERVE_ENV=inst.base / "nope.env"),
                       capture_output=True, text=True, check=False, timeout=60)
    assert r.returncode == 78 and "cannot read" in r.stderr


def test_launcher_validation_only_for_int4_kivi_and_can_be_skipped(inst):
    base = f"S4KV_MODEL_ID=org/unsupported-model\nS4KV_VENV={inst.venv}\n"
    assert launch(inst, base + "S4KV_KV_CACHE_DTYPE=auto\n").returncode == 0
    r = launch(inst, base + "S4KV_VALIDATE=0\n")
    assert r.returncode == 0 and "s4kv validate" not in r.stderr


def test_launcher_transient_validation_failure_is_75(inst):
    r = launch(inst, f"S4KV_MODEL_ID=org/flaky-model\nS4KV_VENV={inst.venv}\n")
    assert r.returncode == 75 and "could not validate org/flaky-model now" in r.stderr


def test_launcher_fetches_hf_token_from_the_secret(inst):
    arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:hf-AbCdEf"
    r = launch(inst, f"S4KV_MODEL_ID=m\nS4KV_HF_TOKEN_SECRET_ARN={arn}\nS4KV_VENV={inst.venv}\n",
               dry=False, FAKE_VLLM_MODE="print-env")
    assert r.returncode == 0, r.stderr
    assert "HF_TOKEN=hf_test_token_123" in r.stdout
    assert "hf_test_token_123" not in " ".join(inst.vllm_argv()[-1])  # not on the command line
    assert inst.calls("aws") == [["secretsmanager", "get-secret-value", "--secret-id", arn,
                                  "--region", "eu-west-1", "--query", "SecretString", "--output", "text"]]


API_ARN = "arn:aws:secretsmanager:us-west-2:123456789012:secret:s4kv-api-key-Xy12Ab"


def test_launcher_gives_vllm_the_api_key_from_the_secret(inst):
    secrets = json.dumps({API_ARN: "sk-s4kv-0123456789abcdef"})
    r = launch(inst, f"S4KV_MODEL_ID=m\nS4KV_API_KEY_SECRET_ARN={API_ARN}\nS4KV_VENV={inst.venv}\n",
               dry=False, FAKE_VLLM_MODE="print-env", FAKE_AWS_SECRETS=secrets)
    assert r.returncode == 0, r.stderr
    assert inst.vllm_env()["VLLM_API_KEY"] == "sk-s4kv-0123456789abcdef"  # vLLM's own API key setting
    assert "sk-s4kv" not in " ".join(inst.vllm_argv()[-1]) and "sk-s4kv" not in r.stderr
    assert inst.calls("aws") == [["secretsmanager", "get-secret-value", "--secret-id", API_ARN,
                                  "--region", "us-west-2", "--query", "SecretString", "--output", "text"]]
    # read at every start, written nowhere: not in serve.env, not under the instance's root
    assert not any(b"sk-s4kv" in f.read_bytes() for f in inst.root.rglob("*") if f.is_file())


@pytest.mark.parametrize("answer, code, message", [
    (None, 75, "could not read the API key from"),  # Secrets Manager unreachable: the unit retries
    ("", 78, "holds no API key (empty, or no SecretString)"),
    ("None", 78, "holds no API key"),  # a binary secret: aws --output text prints None
])
def test_launcher_refuses_without_a_usable_api_key(inst, answer, code, message):
    r = launch(inst, f"S4KV_MODEL_ID=m\nS4KV_API_KEY_SECRET_ARN={API_ARN}\nS4KV_VENV={inst.venv}\n",
               dry=False, FAKE_AWS_SECRETS=json.dumps({API_ARN: answer}))
    assert r.returncode == code and message in r.stderr, (r.returncode, r.stderr)
    assert inst.vllm_argv() == []  # never serves without the key it was told to require


def test_launcher_refuses_two_api_keys(inst):
    r = launch(inst, f"S4KV_MODEL_ID=m\nS4KV_API_KEY_SECRET_ARN={API_ARN}\nVLLM_API_KEY=other\n"
                     f"S4KV_VENV={inst.venv}\n")
    assert r.returncode == 78 and "VLLM_API_KEY and S4KV_API_KEY_SECRET_ARN are both set" in r.stderr


def test_exit_codes_agree():
    """78 is EX_CONFIG in the launcher, the unit's RestartPreventExitStatus and the bootstrap."""
    assert "readonly EX_CONFIG=78 EX_TEMPFAIL=75" in LAUNCHER.read_text()
    prevent = [line for line in UNIT_FILE.read_text().splitlines()
               if line.startswith("RestartPreventExitStatus=")]
    assert prevent == ["RestartPreventExitStatus=2 78"]
    assert "EX_CONFIG = 78" in BOOTSTRAP.read_text()


def test_scripts_parse():
    for script in (LAUNCHER, BOOTSTRAP.parent / "provision.sh"):
        subprocess.run(["bash", "-n", str(script)], check=True)
    import ast
    ast.parse(BOOTSTRAP.read_text(), feature_version=(3, 9))  # the image's system python3 (AL2023)


# ---------------------------------------------------------------------------- s4kv-bootstrap

def _bootstrap_module():
    loader = importlib.machinery.SourceFileLoader("s4kv_bootstrap", str(BOOTSTRAP))
    spec = importlib.util.spec_from_loader("s4kv_bootstrap", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def bootstrap(inst, *args, **env):
    return subprocess.run([sys.executable, str(BOOTSTRAP), *args], env=inst.env(**env),
                          capture_output=True, text=True, check=False, timeout=60)


def test_configure_merges_serve_env_and_cloudwatch(inst, monkeypatch):
    env_file = inst.root / "etc/s4kv/serve.env"
    env_file.write_text(env_file.read_text() + "VLLM_API_KEY=keep-me\nS4KV_MAX_MODEL_LEN=1\n")
    r = bootstrap(inst, "configure", "--model-id", "meta-llama/Llama-3.1-8B-Instruct",
                  "--max-model-len", "0", "--gpu-memory-utilization", "0.85",
                  "--hf-token-secret-arn", "", "--api-key-secret-arn", API_ARN,
                  "--log-group", "s4kv-stack-LogGroup-X1")
    assert r.returncode == 0, r.stdout + r.stderr
    mod = _bootstrap_module()
    monkeypatch.setenv("S4KV_ROOT", str(inst.root))
    values = mod.read_env(str(env_file))
    assert values["S4KV_MODEL_ID"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert values["S4KV_MAX_MODEL_LEN"] == ""  # 0 = the model's maximum
    assert values["S4KV_GPU_MEMORY_UTILIZATION"] == "0.85"
    assert values["S4KV_HF_TOKEN_SECRET_ARN"] == ""
    assert values["S4KV_API_KEY_SECRET_ARN"] == API_ARN
    assert values["S4KV_PORT"] == "8000" and values["S4KV_HOST"] == "0.0.0.0"
    assert values["VLLM_API_KEY"] == "keep-me"  # operator lines survive
    assert inst.serve_env().count("S4KV_MAX_MODEL_LEN=") == 1
    assert "# KV cache dtype" in inst.serve_env()  # comments survive
    assert oct(env_file.stat().st_mode & 0o777) == "0o640"  # the server's group reads, only root writes
    cw = json.loads((inst.root / "opt/aws/amazon-cloudwatch-agent/etc/s4kv.json").read_text())
    groups = {c["log_group_name"] for c in cw["logs"]["logs_collected"]["files"]["collect_list"]}
    assert groups == {"s4kv-stack-LogGroup-X1"}
    assert inst.calls("cwagent") == [["-a", "fetch-config", "-m", "ec2", "-s", "-c",
                                      "file:/opt/aws/amazon-cloudwatch-agent/etc/s4kv.json"]]


@pytest.mark.parametrize("args", [
    ["--model-id", "x'; rm -rf /"],
    ["--model-id", "m", "--max-model-len", "8 192"],
    ["--model-id", "m", "--hf-token-secret-arn", "arn:aws:s3:::bucket"],
    ["--model-id", "m", "--api-key-secret-arn", "arn:aws:secretsmanager:us-east-1:123456789012:secret:k\nLD_PRELOAD=x"],
])
def test_configure_rejects_bad_values(inst, args):
    r = bootstrap(inst, "configure", *args)
    assert r.returncode == 1 and "invalid --" in r.stdout


def test_configure_refuses_a_serve_env_the_launcher_would_refuse(inst):
    env_file = inst.root / "etc/s4kv/serve.env"
    env_file.write_text(env_file.read_text() + "PYTHONPATH=/tmp/evil\n")
    before = env_file.read_bytes()
    r = bootstrap(inst, "configure", "--model-id", "m")
    assert r.returncode == 1, r.stdout
    assert "FAILED (config-refused)" in r.stdout and "PYTHONPATH may not be set" in r.stdout
    assert env_file.read_bytes() == before and not env_file.with_name("serve.env.tmp").exists()


def test_user_data_with_an_injected_serve_env_key_signals_config_refused(inst):
    env_file = inst.root / "etc/s4kv/serve.env"
    env_file.write_text(env_file.read_text() + "LD_PRELOAD=/tmp/evil.so\n")
    r = run_user_data(inst, user_data(free_port()))
    assert r.returncode == 1
    assert signals(inst) == [("false", "config-refused")]
    assert "LD_PRELOAD may not be set" in inst.bootstrap_log() and inst.vllm_argv() == []


def test_reason_from_logs():
    mod = _bootstrap_module()
    assert mod.reason_from(["INFO a", "s4kv-serve: error: m is refused: head_dim 96", "x"]) == \
        "error: m is refused: head_dim 96"
    assert mod.reason_from(["Traceback (most recent call last):", "  File x",
                            "pydantic_core._pydantic_core.ValidationError: 1 validation error",
                            "INFO shutting down"]).startswith("pydantic_core._pydantic_core.ValidationError")
    assert mod.reason_from(["just a line"]) == "just a line"
    assert mod.reason_from([]) == "(no log lines)"


# ------------------------------------------------------------------ the user data, end to end

STACK = "arn:aws:cloudformation:us-east-1:123456789012:stack/s4kv-test/0a1b"


def user_data(port: int, timeout: int = 120, **params) -> str:
    instance = load_template()["Resources"]["Instance"]
    text = instance["Properties"]["UserData"]["Fn::Base64"]["Fn::Sub"]
    values = {"ModelId": "Qwen/Qwen2.5-7B-Instruct", "MaxModelLen": "8192",
              "GpuMemoryUtilization": "0.9", "HfTokenSecretArn": "", "ApiKeySecretArn": "",
              "LogGroup": "s4kv-lg",
              "AWS::StackName": STACK, "AWS::Region": "us-east-1"}
    values.update(params)
    text = substitute(text, values)
    assert text.count("--port 8000") == 1 and text.count("--timeout 2400") == 1
    return text.replace("--port 8000", f"--port {port}").replace("--timeout 2400", f"--timeout {timeout}")


def run_user_data(inst, script: str, timeout=90, **env):
    path = write_exe(inst.base / "user-data.sh", script)
    return subprocess.run(["bash", str(path)], env=inst.env(**env), capture_output=True, text=True,
                          check=False, timeout=timeout)


def signals(inst):
    return [(c[c.index("--success") + 1], c[c.index("--id") + 1] if "--id" in c else None)
            for c in inst.calls("cfn-signal")]


def test_user_data_healthy_signals_success(inst):
    port = free_port()
    r = run_user_data(inst, user_data(port))
    assert r.returncode == 0, r.stdout + r.stderr
    assert signals(inst) == [("true", None)]
    call = inst.calls("cfn-signal")[0]
    assert call[call.index("--stack") + 1] == STACK and call[call.index("--resource") + 1] == "Instance"
    assert inst.vllm_argv() == [["serve", "Qwen/Qwen2.5-7B-Instruct", "--kv-cache-dtype", "int4_kivi",
                                 "--host", "0.0.0.0", "--port", str(port), "--max-model-len", "8192",
                                 "--gpu-memory-utilization", "0.9"]]
    systemctl = inst.calls("systemctl")
    assert ["enable", "s4kv-serve.service"] in systemctl and ["restart", "s4kv-serve.service"] in systemctl
    assert "answered 200: serving" in inst.bootstrap_log()


def test_user_data_with_an_api_key_serves_behind_it(inst):
    port = free_port()
    r = run_user_data(inst, user_data(port, ApiKeySecretArn=API_ARN),
                      FAKE_AWS_SECRETS=json.dumps({API_ARN: "sk-from-the-stack"}))
    assert r.returncode == 0, r.stdout + r.stderr
    assert signals(inst) == [("true", None)]
    assert f"S4KV_API_KEY_SECRET_ARN={API_ARN}" in inst.serve_env().splitlines()
    assert "sk-from-the-stack" not in inst.serve_env() and "sk-from-the-stack" not in inst.bootstrap_log()
    assert inst.vllm_env()["VLLM_API_KEY"] == "sk-from-the-stack"


def test_user_data_refused_model_signals_failure_with_reason(inst):
    r = run_user_data(inst, user_data(free_port(), ModelId="org/unsupported-model"))
    assert r.returncode == 1
    assert signals(inst) == [("false", "config-refused")]
    st = inst.unit_state()
    assert st["ActiveState"] == "failed" and st["ExecMainStatus"] == 78 and st["NRestarts"] == 0
    log = inst.bootstrap_log()
    assert "FAILED (config-refused)" in log and "head_dim 96" in log and "int4_kivi" in log
    assert inst.vllm_argv() == []  # vLLM never started


def test_user_data_crash_loop_stops_at_start_limit(inst):
    r = run_user_data(inst, user_data(free_port()), FAKE_VLLM_MODE="crash")
    assert r.returncode == 1
    assert signals(inst) == [("false", "unit-failed")]
    st = inst.unit_state()
    assert st["Result"] == "start-limit-hit" and st["NRestarts"] == 4  # 5 starts (StartLimitBurst)
    assert len(inst.vllm_argv()) == 5
    assert "CUDA error: out of memory" in inst.bootstrap_log()


def test_user_data_health_timeout(inst):
    r = run_user_data(inst, user_data(free_port(), timeout=3), FAKE_VLLM_MODE="unhealthy")
    assert r.returncode == 1
    assert signals(inst) == [("false", "health-timeout")]
    assert "did not answer 200 within 3s" in inst.bootstrap_log()


def test_user_data_bad_parameter_signals_failure(inst):
    r = run_user_data(inst, user_data(free_port(), MaxModelLen="12ab"))
    assert r.returncode == 1
    assert signals(inst) == [("false", "bootstrap-error")]


def test_user_data_on_a_foreign_image_signals_failure(inst):
    (inst.bin / "s4kv-bootstrap").unlink()
    r = run_user_data(inst, user_data(free_port()))
    assert r.returncode == 1 and "not an S4 KV image" in r.stderr
    assert signals(inst) == [("false", "not-an-s4kv-image")]
