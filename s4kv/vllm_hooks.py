"""The functions vLLM calls through the S4 KV patch series (one guarded call per patch), and the
``vllm.general_plugins`` entry point of the s4kv wheel.

Each patch in ``patches/vllm-<version>/`` is ``if <cache dtype> == "int4_kivi":`` followed by one
call into this module; everything else lives in s4kv. Keep these signatures stable: they are the
contract with the patches of every pinned vLLM release.

From vLLM 0.33 on, ``int4_kivi`` is declared through vLLM's own plugin point instead of a patch:
``register`` (the entry point ``s4kv`` in the group ``vllm.general_plugins``, pyproject.toml)
registers a ``KVCacheDTypeHandler``. On 0.24 and 0.32 the series' first patch declares the dtype and
``register`` does nothing.
"""

from __future__ import annotations

from s4kv import format as fmt

BACKEND_PATH = "s4kv.backend.backend.S4KVAttentionBackend"


def register() -> bool:
    """``vllm.general_plugins`` entry point: declare the int4_kivi kv-cache dtype where vLLM has the
    plugin point for it (``vllm.config.cache.register_kv_cache_dtype``, vLLM 0.33+). Returns whether it
    registered the dtype now.

    vLLM loads general plugins in every process before it validates a ``CacheConfig`` or builds a
    model: the front end in ``EngineArgs.__post_init__`` (and ``AsyncEngineArgs.add_cli_args``), the
    engine core in ``EngineCore.__init__``, the workers in ``init_worker``. Registering appends the
    name to ``KV_CACHE_DTYPES`` (pydantic, ``--kv-cache-dtype`` and the selector's assert) and sets
    ``STR_DTYPE_TO_TORCH_DTYPE["int4_kivi"] = torch.uint8``: what the 0.24/0.32 series patch in.

    The handler's ``quant_mode`` is ``KVQuantMode.NONE``, not ``KVQuantMode.CUSTOM``: in 0.33.0
    ``CUSTOM = 12`` is an alias of ``OCTAVE_K3V4`` (an ``IntEnum`` with a repeated value), so ``CUSTOM``
    would turn on the ROCm Octave paths (``is_octave``). ``NONE`` is what ``get_kv_quant_mode`` gave
    int4_kivi on 0.24/0.32 (an unknown name): vLLM's fp8 / per-token-head / nvfp4 / turboquant /
    octave machinery stays off, ``is_quantized_kv_cache`` is False, and the s4kv backend owns the
    format. Routing to that backend is still a patch (the selector asks no handler).

    Does nothing (and never raises) on vLLM without ``register_kv_cache_dtype`` (0.24, 0.32: the series
    lists int4_kivi in ``CacheDType``), when int4_kivi is already a known dtype (loaded twice, or a
    patched ``CacheDType``), or when vLLM cannot be imported.
    """
    try:
        from vllm.config import cache
    except ImportError:
        return False
    if not hasattr(cache, "register_kv_cache_dtype") or cache.is_known_kv_cache_dtype(fmt.KV_CACHE_DTYPE):
        return False
    import torch
    from vllm.v1.kv_cache_interface import KVQuantMode

    @cache.register_kv_cache_dtype(fmt.KV_CACHE_DTYPE)
    class Int4KiviHandler:
        """int4_kivi pages are raw bytes whose layout s4kv owns (s4kv.format)."""

        name = fmt.KV_CACHE_DTYPE

        def torch_dtype(self) -> torch.dtype:
            return torch.uint8

        def quant_mode(self) -> KVQuantMode:
            return KVQuantMode.NONE

    return True


def validate_vllm_config(vllm_config) -> None:
    """Called from a ``VllmConfig`` model validator (front-end process, before any engine starts).
    Raises ``ValueError`` naming every reason the model or engine settings are unsupported."""
    from s4kv.validation import validate_vllm_config as _validate

    _validate(vllm_config)


def select_attn_backend(selected_backend, attn_selector_config, num_heads=None):
    """Called from vLLM's attention-backend selector for every layer whose cache dtype is int4_kivi,
    on every platform. Returns the s4kv backend class or raises ``ValueError`` with the reasons."""
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    from s4kv.backend.backend import S4KVAttentionBackend

    if selected_backend is not None and selected_backend != AttentionBackendEnum.CUSTOM:
        raise ValueError(f"kv_cache_dtype={fmt.KV_CACHE_DTYPE} runs on its own attention backend; "
                         f"drop --attention-backend {getattr(selected_backend, 'name', selected_backend)}")
    register_backend(AttentionBackendEnum.CUSTOM, BACKEND_PATH)
    config = attn_selector_config._asdict()
    reasons = S4KVAttentionBackend.validate_configuration(
        device_capability=current_platform.get_device_capability(), **config)
    if reasons:
        raise ValueError(f"kv_cache_dtype={fmt.KV_CACHE_DTYPE} cannot serve a layer with "
                         f"head_size={config.get('head_size')}, dtype={config.get('dtype')}: "
                         + "; ".join(reasons))
    return S4KVAttentionBackend


def block_table_width(max_model_len: int) -> int:
    """vLLM 0.24 model runners (V1 and V2): block-table entries per request. A request holds the
    pages of its exact tail past its complete blocks (s4kv.backend.spec); 0.32 asks the spec."""
    return fmt.blocks_held(max_model_len)


def kv_cache_spec(layer, vllm_config):
    """vLLM 0.24 ``Attention.get_kv_cache_spec``: the int4_kivi spec (real page size, exact tails
    held in pages; 0.32 gets the same through ``S4KVAttentionBackend.customize_spec``)."""
    from s4kv.backend.spec import S4KVFullAttentionSpec

    return S4KVFullAttentionSpec(
        block_size=vllm_config.cache_config.block_size,
        num_kv_heads=layer.num_kv_heads,
        head_size=layer.head_size,
        head_size_v=layer.head_size,
        dtype=layer.kv_cache_torch_dtype,
    )
