"""Fail fast: which models and engine settings int4_kivi can serve correctly, and why not.

One set of checks serves three callers:

* vLLM's config validation (a patch calls :func:`s4kv.vllm_hooks.validate_vllm_config` from a
  ``VllmConfig`` model validator), so ``vllm serve MODEL --kv-cache-dtype int4_kivi`` stops in the
  front-end process, before any engine process starts or any weight is loaded;
* the attention-backend selection of every layer (a per-layer backstop for what only layers know);
* ``s4kv validate MODEL`` on the command line, before any GPU time is spent.

A refusal is a :class:`UnsupportedModelError` (a ``ValueError``) whose message names every reason.
There is never a silent fallback to another KV-cache dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from s4kv import format as fmt

SUPPORTED_MODEL_DTYPES_CUDA = ("bfloat16", "float16")
# exact tails are stored in the model dtype inside 4 pages (s4kv.format): 16-bit models only
SUPPORTED_MODEL_DTYPES_CPU = ("bfloat16", "float16")
MIN_CUDA_CAPABILITY = (8, 0)  # Ampere (A10G, A100, L4, L40S) through Hopper (H100, H200)

# Models whose attention has learned per-head sink logits (not in the KV cache, but the kernels
# would have to add them to the softmax denominator).
_LEARNED_SINK_MODEL_TYPES = {"gpt_oss"}


class UnsupportedModelError(ValueError):
    pass


@dataclass
class ModelFacts:
    """What the checks need to know about a model, however it was obtained."""

    name: str
    architectures: list[str] = field(default_factory=list)
    model_type: str = ""
    head_size: int = 0
    head_size_v: int | None = None
    dtype: str = "bfloat16"
    use_mla: bool = False
    is_hybrid: bool = False
    is_attention_free: bool = False
    is_encoder_decoder: bool = False
    uses_alibi: bool = False
    sliding_window: int | None = None
    layer_types: list[str] | None = None
    runner_type: str = "generate"


@dataclass
class EngineFacts:
    """Engine settings that change what the cache must support."""

    platform: str = "cpu"  # "cuda" | "cpu" | anything else (refused)
    device_capability: tuple[int, int] | None = None
    block_size: int | None = None
    speculative: bool = False
    kv_transfer: bool = False
    kv_offloading: bool = False
    skip_layers: list[str] = field(default_factory=list)
    decode_context_parallel: int = 1
    prefill_context_parallel: int = 1
    data_parallel: int = 1
    ubatching: bool = False  # dual-batch overlap or micro-batches
    sleep_mode: bool = False


def model_reasons(m: ModelFacts) -> list[str]:
    reasons = []
    if m.is_attention_free:
        reasons.append("the model has no attention layers (nothing to cache)")
    if m.use_mla:
        reasons.append("MLA (multi-head latent attention) caches a latent vector, not per-head K/V")
    if m.is_hybrid:
        reasons.append("hybrid model (Mamba / linear-attention layers keep a recurrent state, not K/V)")
    if m.is_encoder_decoder:
        reasons.append("encoder-decoder model (cross-attention is not supported)")
    if m.runner_type != "generate":
        reasons.append(f"runner '{m.runner_type}' (only text generation is supported)")
    if m.uses_alibi:
        reasons.append("ALiBi position biases are not supported")
    windowed = [t for t in (m.layer_types or []) if "sliding" in t or "local" in t or "chunked" in t]
    if m.sliding_window is not None or windowed:
        what = f"sliding_window={m.sliding_window}" if m.sliding_window is not None else \
            f"{len(windowed)} sliding/local attention layers"
        reasons.append(f"sliding-window/local attention ({what}) is not supported")
    if m.model_type in _LEARNED_SINK_MODEL_TYPES:
        reasons.append(f"learned attention-sink parameters ({m.model_type}) are not supported")
    if not m.use_mla and m.head_size not in fmt.SUPPORTED_HEAD_SIZES:
        reasons.append(f"head_dim={m.head_size} (supported: {', '.join(map(str, fmt.SUPPORTED_HEAD_SIZES))})")
    if m.head_size_v not in (None, m.head_size):
        reasons.append(f"value head_dim {m.head_size_v} differs from key head_dim {m.head_size}")
    return reasons


def engine_reasons(m: ModelFacts, e: EngineFacts) -> list[str]:
    reasons = []
    if e.platform == "cuda":
        if m.dtype not in SUPPORTED_MODEL_DTYPES_CUDA:
            reasons.append(f"model dtype {m.dtype} on CUDA (kernels cover {', '.join(SUPPORTED_MODEL_DTYPES_CUDA)})")
        if e.device_capability is not None and tuple(e.device_capability) < MIN_CUDA_CAPABILITY:
            cap = ".".join(map(str, e.device_capability))
            reasons.append(f"GPU compute capability {cap} (needs sm80 or newer: A10G, L4, L40S, A100, H100, H200)")
    elif e.platform == "cpu":
        if m.dtype not in SUPPORTED_MODEL_DTYPES_CPU:
            reasons.append(f"model dtype {m.dtype} (supported on CPU: {', '.join(SUPPORTED_MODEL_DTYPES_CPU)}; the exact "
                           f"tail is kept in the model dtype inside the pages, sized for 16 bits)")
    else:
        reasons.append(f"platform '{e.platform}' (supported: cuda, cpu)")
    if e.block_size is not None and e.block_size != fmt.BLOCK_SIZE:
        reasons.append(f"--block-size {e.block_size} (int4_kivi pages hold exactly {fmt.BLOCK_SIZE} tokens)")
    if e.speculative:
        reasons.append("speculative decoding (rejected draft tokens could be quantized into a block)")
    if e.kv_transfer:
        reasons.append("KV transfer connectors (they move a request's complete blocks, not the pages of its exact tail)")
    if e.kv_offloading:
        reasons.append("KV offloading (it moves a request's complete blocks, not the pages of its exact tail)")
    if e.skip_layers:
        reasons.append(f"--kv-cache-dtype-skip-layers {e.skip_layers} (mixed page formats are not supported)")
    if e.decode_context_parallel > 1 or e.prefill_context_parallel > 1:
        reasons.append("decode/prefill context parallelism")
    if e.data_parallel > 1:
        reasons.append(f"data parallelism (data_parallel_size {e.data_parallel}: an idle rank runs dummy batches whose "
                       f"rows carry stale block tables, and int4_kivi writes the pages of the exact tail a "
                       f"row's block table lists)")
    if e.ubatching:
        reasons.append("dual-batch overlap / micro-batching (--enable-dbo, --ubatch-size > 1: the micro-batches "
                       "would share one decode workspace)")
    if e.sleep_mode:
        reasons.append("sleep mode (--enable-sleep-mode: level 2 discards the memory of int4_kivi's rotation "
                       "operands and workspaces, which are not rebuilt on wake-up)")
    return reasons


def check(m: ModelFacts, e: EngineFacts | None = None) -> None:
    reasons = model_reasons(m) + (engine_reasons(m, e) if e is not None else [])
    if reasons:
        raise UnsupportedModelError(
            f"kv_cache_dtype={fmt.KV_CACHE_DTYPE} does not support {m.name}: " + "; ".join(reasons))


# ---------------------------------------------------------------------------------------------
# Gathering facts from vLLM objects


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def facts_from_model_config(model_config) -> ModelFacts:
    hf_text = model_config.hf_text_config
    head_size = model_config.get_head_size()
    head_size_v = getattr(model_config.model_arch_config, "head_size_v", None) \
        if hasattr(model_config, "model_arch_config") else None
    return ModelFacts(
        name=str(model_config.model),
        architectures=list(getattr(model_config, "architectures", None) or []),
        model_type=str(getattr(model_config.hf_config, "model_type", "") or ""),
        head_size=head_size,
        head_size_v=head_size_v if isinstance(head_size_v, int) else None,
        dtype=_dtype_name(model_config.dtype),
        use_mla=bool(model_config.use_mla),
        is_hybrid=bool(model_config.is_hybrid),
        is_attention_free=bool(model_config.is_attention_free),
        is_encoder_decoder=bool(model_config.is_encoder_decoder),
        uses_alibi=bool(model_config.uses_alibi),
        sliding_window=model_config.get_sliding_window(),
        layer_types=list(getattr(hf_text, "layer_types", None) or []) or None,
        runner_type=str(getattr(model_config, "runner_type", "generate")),
    )


def facts_from_vllm_config(vllm_config) -> tuple[ModelFacts, EngineFacts]:
    from vllm.platforms import current_platform

    m = facts_from_model_config(vllm_config.model_config)
    cache = vllm_config.cache_config
    par = vllm_config.parallel_config
    if current_platform.is_cuda():
        platform = "cuda"
        cap = current_platform.get_device_capability()
        capability = (cap.major, cap.minor) if cap is not None else None
    elif current_platform.is_cpu():
        platform, capability = "cpu", None
    else:
        platform, capability = str(getattr(current_platform, "device_name", "unknown")), None
    e = EngineFacts(
        platform=platform,
        device_capability=capability,
        # Only a size the user asked for: otherwise vLLM picks the backend's size (128) later.
        block_size=cache.block_size if getattr(cache, "user_specified_block_size", False) else None,
        speculative=vllm_config.speculative_config is not None,
        kv_transfer=vllm_config.kv_transfer_config is not None,
        kv_offloading=bool(getattr(cache, "kv_offloading_size", None)),
        skip_layers=list(getattr(cache, "kv_cache_dtype_skip_layers", None) or []),
        decode_context_parallel=int(getattr(par, "decode_context_parallel_size", 1) or 1),
        prefill_context_parallel=int(getattr(par, "prefill_context_parallel_size", 1) or 1),
        data_parallel=int(getattr(par, "data_parallel_size", 1) or 1),
        ubatching=bool(getattr(par, "enable_dbo", False)) or int(getattr(par, "ubatch_size", 0) or 0) > 1,
        sleep_mode=bool(getattr(vllm_config.model_config, "enable_sleep_mode", False)),
    )
    return m, e


def validate_vllm_config(vllm_config) -> None:
    """Raise :class:`UnsupportedModelError` naming every reason the engine cannot serve correctly."""
    if vllm_config.model_config is None:
        return
    m, e = facts_from_vllm_config(vllm_config)
    check(m, e)


def validate_model(model: str, dtype: str = "auto", platform: str | None = None, **model_kwargs) -> ModelFacts:
    """Check a model by name or path without starting an engine (``s4kv validate``).

    Uses vLLM's own ModelConfig, so derived facts (head size, MLA, hybrid, sliding window) are
    exactly the ones the engine will see. ``platform`` adds the platform checks ("cuda" or "cpu").
    """
    from vllm.config import ModelConfig

    mc = ModelConfig(model=model, dtype=dtype, **model_kwargs)
    m = facts_from_model_config(mc)
    check(m, EngineFacts(platform=platform) if platform else None)
    return m


EXIT_SUPPORTED, EXIT_REFUSED, EXIT_TEMPFAIL = 0, 1, 75  # 75: EX_TEMPFAIL (sysexits.h), "try again"


def main(argv: list[str] | None = None) -> int:
    """``s4kv validate MODEL``: can int4_kivi serve this model? Exit 0 yes; 1 no, no config at
    that name or no vLLM installed to read it (one line with the reason); 75 the Hugging Face Hub could not be asked now (HTTP 429
    or 5xx, no connection): try again later."""
    import argparse
    import json

    from s4kv.cli import missing_modules
    from s4kv.hub import ConfigNotFound, HubUnavailable, ensure_config

    ap = argparse.ArgumentParser(prog="s4kv validate", description=main.__doc__)
    ap.add_argument("model", help="local path or Hugging Face model id (config only is read)")
    ap.add_argument("--dtype", default="auto", help="model dtype as vLLM's --dtype (default: auto)")
    ap.add_argument("--platform", choices=["cuda", "cpu"], default=None,
                    help="also check dtype support of the kernels on this platform")
    ap.add_argument("--trust-remote-code", action="store_true")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)

    def answer(code: int, label: str, reason: str) -> int:
        out = {"model": args.model, "supported": False, "reason": reason, "retry": code == EXIT_TEMPFAIL}
        print(json.dumps(out) if args.json else f"{label}: {reason}")
        return code

    if missing_modules(["vllm"]):
        # the config is read by vLLM's own ModelConfig (so the facts are the engine's): no vLLM, no check
        return answer(EXIT_REFUSED, "CANNOT CHECK", "s4kv validate reads the model's config with vLLM, which is "
                      "not installed here: install the patched vLLM wheel from dist/ (README: a serving environment)")
    try:
        ensure_config(args.model)
    except HubUnavailable as e:
        return answer(EXIT_TEMPFAIL, "CANNOT CHECK NOW", str(e))
    except ConfigNotFound as e:
        return answer(EXIT_REFUSED, "NO CONFIG", str(e))
    try:
        facts = validate_model(args.model, dtype=args.dtype, platform=args.platform,
                               trust_remote_code=args.trust_remote_code)
    except UnsupportedModelError as e:
        return answer(EXIT_REFUSED, "NOT SUPPORTED", str(e))
    except ValueError as e:  # vLLM's own config errors (pydantic): the first line says what
        return answer(EXIT_REFUSED, "INVALID CONFIG", _first_line(e))
    out = {"model": args.model, "supported": True, "head_dim": facts.head_size, "dtype": facts.dtype,
           "architectures": facts.architectures,
           "bytes_per_token_per_kv_head": fmt.bytes_per_token_per_head(facts.head_size),
           "density_vs_16bit": round(fmt.density_vs(facts.head_size), 3)}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"supported: {args.model} ({', '.join(facts.architectures) or facts.model_type}, "
              f"head_dim {facts.head_size}, {facts.dtype}): {out['bytes_per_token_per_kv_head']} B per token "
              f"per kv head, {out['density_vs_16bit']}x the tokens of a 16-bit cache")
    return EXIT_SUPPORTED


def _first_line(e: Exception) -> str:
    """The message of a config error in one line (pydantic's ValidationError: its first error's)."""
    errors = getattr(e, "errors", None)
    msg = str(errors()[0].get("msg", e)) if callable(errors) and errors() else str(e)
    return " ".join(msg.split("\n")[0].split())
