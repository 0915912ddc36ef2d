"""Each attention layer's own queries and keys of a real model on the project's evaluation text
(CPU), for tools that measure something about them (docs/results/*/bound_gaps.py, offset_gaps.py).

    from layer_qk import each_layer
    path = each_layer(lambda layer, q, k, scale: ..., tokens=2048, windows=2)

The model (default: the converted SmolLM2) runs in fp32, one `tokens`-long window of
s4kv/data/eval_text.txt after another, with its attention replaced by one that first hands the
layer's q [Hq, T, D] and k [Hkv, T, D] (before any KV-cache format) and softmax scale to `on_layer`,
then computes exact causal attention, so every layer sees the model's unquantized activations."""

import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def each_layer(on_layer: Callable[[int, torch.Tensor, torch.Tensor, float], None], tokens: int, windows: int,
               model: str | None = None) -> str:
    """Run `windows` windows of `tokens` tokens through the model, calling on_layer(layer index, q,
    k, scale) in every attention layer; returns the model's path."""
    sys.path.insert(0, str(ROOT))
    from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer

    from s4kv import models

    path = model or str(models.smollm2())
    ids = AutoTokenizer.from_pretrained(path).encode((ROOT / "s4kv" / "data" / "eval_text.txt").read_text())

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
        on_layer(module.layer_idx, query[0], key[0], scale)
        hq, hkv = query.shape[1], key.shape[1]
        o = torch.nn.functional.scaled_dot_product_attention(
            query.float(), key.repeat_interleave(hq // hkv, 1).float(),
            value.repeat_interleave(hq // hkv, 1).float(), is_causal=True, scale=scale)
        return o.transpose(1, 2).to(query.dtype), None

    AttentionInterface.register("s4kv_layer_qk", attention)
    lm = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32,
                                              attn_implementation="s4kv_layer_qk").eval()
    for w in range(windows):
        x = torch.tensor([ids[w * tokens:(w + 1) * tokens]])
        with torch.no_grad():
            lm(x)
        print(f"window {w + 1}/{windows} done", file=sys.stderr, flush=True)
    return path
