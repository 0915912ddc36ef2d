"""Fail fast on an unsupported model: a config-only Llama with head_dim 96 (random weights via
--load-format dummy, no tokenizer) and --kv-cache-dtype int4_kivi.

* `vllm serve` itself (the launcher with S4KV_VALIDATE=0 execs it) exits non-zero with the
  reason: vLLM's startup validation of int4_kivi;
* the unit's command (the launcher, with `s4kv validate`) refuses it before vLLM starts with
  exit 78, which the unit does not restart, and the boot path turns that into a FAILURE signal
  carrying the reason (s4kv-bootstrap wait, with the stand-in systemd of deploy_helpers running
  the real launcher and this venv's s4kv and vllm).

Both need the int4_kivi validation (`s4kv validate` and the vLLM patch): PENDING until
INT4_KIVI_READY in tests/serve_harness.py is True.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from deploy_helpers import BOOTSTRAP, FakeInstance, write_exe
from serve_harness import PENDING_INT4_KIVI, Server, needs_vllm

pytestmark = [pytest.mark.engine, needs_vllm, PENDING_INT4_KIVI]

HEAD_DIM_96 = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 384,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 96, "intermediate_size": 768,
    "num_hidden_layers": 2, "vocab_size": 1024, "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "tie_word_embeddings": True,
    "bos_token_id": 1, "eos_token_id": 2,
}
DUMMY_ARGS = "--load-format dummy --skip-tokenizer-init --enforce-eager"


@pytest.fixture(scope="module")
def head_dim_96(tmp_path_factory):
    from s4kv.models import write_config

    return str(write_config(HEAD_DIM_96, tmp_path_factory.mktemp("models") / "llama-head-dim-96"))


def _assert_reason(text: str):
    assert "int4_kivi" in text and "head_dim" in text, text[-3000:]


def test_vllm_serve_refuses_at_startup(tmp_path, head_dim_96):
    server = Server(tmp_path, "refused-by-vllm", head_dim_96, "int4_kivi", extra_args=DUMMY_ARGS,
                    validate=False).start()
    try:
        rc = server.wait_exit(300)
        log = server.log()
        assert "s4kv-serve: exec" in log  # this time vLLM itself ran and refused
        assert rc != 0, log[-3000:]
        _assert_reason(log)
    finally:
        server.stop()


def test_unit_refuses_without_restart_and_signals_failure(tmp_path, head_dim_96):
    inst = FakeInstance(tmp_path)
    try:
        for tool in ("vllm", "s4kv"):  # the real ones of this venv
            write_exe(inst.venv / "bin" / tool, f"#!/bin/sh\nexec {sys.prefix}/bin/{tool} \"$@\"\n")
        env_file = inst.root / "etc/s4kv/serve.env"
        env_file.write_text(env_file.read_text() + f"S4KV_MODEL_ID={head_dim_96}\nS4KV_EXTRA_ARGS={DUMMY_ARGS}\n"
                            "S4KV_HOST=127.0.0.1\nS4KV_PORT=1\nVLLM_CPU_KVCACHE_SPACE=1\n")
        # the unit's HOME and HF_HOME would be fresh directories under the temporary root: vLLM's
        # model-registry cache there is cold and `s4kv validate` takes twice as long
        env = inst.env(FAKE_UNIT_ENV_SKIP="HOME,HF_HOME")
        subprocess.run(["systemctl", "restart", "s4kv-serve.service"], env=env, check=True)
        r = subprocess.run([sys.executable, str(BOOTSTRAP), "wait", "--timeout", "240",
                            "--stack", "s4kv-test", "--region", "us-east-1"],
                           env=env, capture_output=True, text=True, check=False, timeout=300)
        assert r.returncode == 1, r.stdout
        st = inst.unit_state()
        assert st["ExecMainStatus"] == 78 and st["NRestarts"] == 0 and st["ActiveState"] == "failed", st
        journal = (inst.state / "s4kv-serve.service.journal").read_text()
        assert "s4kv-serve: error:" in journal and "s4kv-serve: exec" not in journal  # vLLM never ran
        _assert_reason(journal)
        (call,) = inst.calls("cfn-signal")
        assert call[call.index("--success") + 1] == "false" and call[call.index("--id") + 1] == "config-refused"
        _assert_reason(inst.bootstrap_log())
    finally:
        inst.cleanup()
