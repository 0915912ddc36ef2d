"""The functions vLLM calls through the S4 KV patch series (one guarded call per patch).

Each patch in ``patches/vllm-<version>/`` is ``if <cache dtype> == "int4_kivi":`` followed by one
call into this module; everything else lives in s4kv. Keep these signatures stable: they are the
contract with the patches of every pinned vLLM release.
"""

from __future__ import annotations

from s4kv import format as fmt

BACKEND_PATH = "s4kv.backend.backend.S4KVAttentionBackend"


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
