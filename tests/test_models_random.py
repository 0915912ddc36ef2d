"""s4kv.models.random_model writes a checkpoint that every tensor-parallel size loads alike: a real
config cut to a few layers, random weights drawn once from the seed and saved. Checked on a small
config of the same family (the real shapes are gigabytes): transformers loads it with the layers
asked for, a second call returns the cached files unchanged, and another seed gives other weights.
"""

import pytest

from s4kv import models

TINY = {**models.DUMMY_CONFIGS["qwen2.5-7b"], "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1024, "num_hidden_layers": 28}


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(models.DUMMY_CONFIGS, "tiny-qwen", TINY)
    return "tiny-qwen"


def test_random_model_is_written_once_and_loads_with_its_layers(tiny, tmp_path):
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    path = models.random_model(tiny, layers=2, seed=0, root=tmp_path)
    weights = path / "model.safetensors"
    first = weights.stat().st_mtime_ns
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.num_hidden_layers == 2 and model.config.num_key_value_heads == 2
    assert model.config.hidden_size // model.config.num_attention_heads == 64  # a head size the cache serves
    state = load_file(weights)
    q = state["model.layers.0.self_attn.q_proj.weight"].float()
    assert 0.01 < q.std().item() < 0.03  # transformers' initialization (std 0.02), not dummy's +-1e-3
    assert not any(k.startswith("model.layers.2.") for k in state)

    assert models.random_model(tiny, layers=2, seed=0, root=tmp_path) == path
    assert weights.stat().st_mtime_ns == first  # cached, not written again

    other = load_file(models.random_model(tiny, layers=2, seed=1, root=tmp_path) / "model.safetensors")
    assert not torch.equal(other["model.layers.0.self_attn.q_proj.weight"], state["model.layers.0.self_attn.q_proj.weight"])
