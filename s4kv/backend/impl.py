"""The int4_kivi attention impl: startup checks, workspaces, and dispatch to the store + attention ops."""

from __future__ import annotations

import os

import torch
from vllm.logger import init_logger
from vllm.v1.attention.backend import AttentionImpl, AttentionType

from s4kv import format as fmt
from s4kv.kernels import num_sms
from s4kv.validation import UnsupportedModelError

# a child of vLLM's logger, so that its handlers (the engine log) print these lines
logger = init_logger(f"vllm.{__name__}")


class S4KVAttentionImpl(AttentionImpl):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes, sliding_window, kv_cache_dtype: str, logits_soft_cap=None,
                 attn_type: str = AttentionType.DECODER, kv_sharing_target_layer_name=None,
                 **extra_impl_args) -> None:
        # Last line of defence: what only a layer knows (the config-level checks ran at startup).
        reasons = []
        if alibi_slopes is not None:
            reasons.append("ALiBi")
        if sliding_window is not None:
            reasons.append(f"sliding-window attention (window {sliding_window})")
        if logits_soft_cap:
            reasons.append("attention logit soft-capping")
        if extra_impl_args.get("sinks") is not None:
            reasons.append("learned attention-sink parameters")
        if attn_type != AttentionType.DECODER:
            reasons.append(f"attention type {attn_type}")
        if kv_sharing_target_layer_name is not None:
            reasons.append("cross-layer KV-cache sharing")
        if head_size not in fmt.SUPPORTED_HEAD_SIZES:
            reasons.append(f"head_dim={head_size}")
        if reasons:
            raise UnsupportedModelError(
                f"kv_cache_dtype={fmt.KV_CACHE_DTYPE} does not support this layer: " + "; ".join(reasons))
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = None
        from vllm.config import get_current_vllm_config

        conf = get_current_vllm_config()
        self.max_num_seqs = conf.scheduler_config.max_num_seqs
        self.num_layers = conf.model_config.get_num_layers(conf.parallel_config)
        # Chunk attention stages pages for one row of max_model_len plus a full chunk (s4kv.kernels.chunk_plan).
        from s4kv.kernels.chunk_plan import scratch_pages

        self.chunk_scratch_pages = scratch_pages(conf.model_config.max_model_len,
                                                 conf.scheduler_config.max_num_batched_tokens)
        # this step's tokens as window rows (s4kv.kernels.store.StepRows): one per scheduled token
        self.max_num_batched_tokens = conf.scheduler_config.max_num_batched_tokens
        self._ops = None

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        # Workspaces are reserved while the model loads, so vLLM's memory profiling counts them
        # before it sizes the KV cache. Requests keep nothing outside their pages (their
        # windows are in pages vLLM allocates and counts, s4kv.backend.spec).
        self._prepare(act_dtype, _current_device())

    def _prepare(self, dtype: torch.dtype, device: torch.device) -> None:
        if dtype.itemsize != 2:
            raise UnsupportedModelError(f"kv_cache_dtype={fmt.KV_CACHE_DTYPE} supports 16-bit models; "
                                        f"model dtype {dtype} is not supported (serve it in bfloat16 or float16)")
        self._ops = _select_ops(device)
        self._device = device
        if device.type == "cuda":
            from s4kv.kernels.decode import DecodeWorkspace

            DecodeWorkspace.reserve(self.max_num_seqs, self.num_heads, self.head_size, self.num_kv_heads,
                                    num_sms(device), device)
            logger.info_once(f"int4_kivi decode workspace: {DecodeWorkspace.nbytes() / 2**20:.0f} MiB "
                             f"(split partials for up to max_num_seqs={self.max_num_seqs} decode rows)")
        window = fmt.WINDOW_PAGES * fmt.page_size_bytes(self.num_kv_heads, self.head_size)
        logger.info_once(f"int4_kivi windows: 0 bytes reserved outside the KV pool; each running request "
                         f"keeps its last 0..{fmt.UNIT - 1} tokens (its incomplete unit of {fmt.UNIT_BLOCKS} "
                         f"blocks) in 8 bits in {fmt.WINDOW_PAGES} of its own pages "
                         f"({window * self.num_layers / 2**20:.2f} MiB over {self.num_layers} layers, "
                         f"{fmt.WINDOW_PAGES - 1} pages more than its last block), allocated by "
                         f"vLLM's scheduler while it runs and freed on finish or preemption")
        if self._ops.__name__.endswith("triton_ops"):
            from s4kv.backend.selfcheck import check_kernels
            from s4kv.kernels.store import StepRows

            self._reserve_chunk_scratch(device)
            from s4kv.backend.selfcheck import largest_step

            StepRows.reserve(max(self.max_num_batched_tokens, largest_step()), self.num_kv_heads, self.head_size,
                             device)

            # this GPU's compiled kernels against the reference, before anything is served
            check_kernels(self.num_heads, self.num_kv_heads, self.head_size, dtype, device)

    def _reserve_chunk_scratch(self, device: torch.device) -> None:
        """Chunk attention runs vLLM's FlashAttention over 16-bit pages staged in a scratch that holds
        one row of max_model_len plus a full chunk (s4kv.kernels.chunk): check FlashAttention is
        there, and reserve the scratch now so vLLM's memory profile counts it."""
        from s4kv.kernels.chunk import ChunkWorkspace
        from s4kv.kernels.flash import flash_attention_available

        if device.type == "cuda":
            reason = flash_attention_available()
            if reason:
                raise UnsupportedModelError(f"kv_cache_dtype={fmt.KV_CACHE_DTYPE} runs chunk attention through vLLM's "
                                            f"FlashAttention on CUDA: {reason}")
        pages = self.chunk_scratch_pages
        ChunkWorkspace.reserve(pages, self.num_kv_heads, self.head_size, device)
        logger.info_once(f"int4_kivi chunk attention scratch: {pages} pages of 16-bit K/V, "
                         f"{pages * ChunkWorkspace.page_bytes(self.num_kv_heads, self.head_size) / 2**20:.0f} MiB "
                         f"(max_model_len + max_num_batched_tokens)")

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata, output: torch.Tensor,
                output_scale=None, output_block_scale=None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("int4_kivi does not fuse output quantization")
        if attn_metadata is None:  # profiling / warm-up without metadata
            return output
        if self._ops is None or self._device != query.device:
            logger.warning_once("int4_kivi workspaces reserved at first use (not profiled)")
            self._prepare(query.dtype, query.device)
        n = attn_metadata.num_actual_tokens
        out = output.view(-1, self.num_heads, self.head_size)
        q = query[:n].view(n, self.num_heads, self.head_size)
        k = key[:n].view(n, self.num_kv_heads, self.head_size)
        v = value[:n].view(n, self.num_kv_heads, self.head_size)
        regions = kv_cache.flatten(2)  # [num_blocks, Hkv, region_bytes]; each region contiguous
        self._ops.forward(q, k, v, regions, attn_metadata, self.scale, out)
        return output


def memory_outside_pool(worker) -> dict:
    """Bytes of every tensor s4kv holds in a worker outside vLLM's KV pool: the layers' own, and
    the shared workspaces (``LLM.collective_rpc(memory_outside_pool)``; tests and diagnostics)."""
    from s4kv.kernels.chunk import ChunkWorkspace
    from s4kv.kernels.decode import DecodeWorkspace

    impls = [m.impl for m in worker.model_runner.model.modules() if isinstance(getattr(m, "impl", None),
                                                                               S4KVAttentionImpl)]
    layers = sum(v.numel() * v.element_size() for impl in impls for v in vars(impl).values()
                 if isinstance(v, torch.Tensor))
    from s4kv.kernels.store import StepRows

    return {"layers_with_int4_kivi": len(impls), "layers": layers, "decode_workspace": DecodeWorkspace.nbytes(),
            "chunk_scratch": ChunkWorkspace.nbytes(), "step_rows": StepRows.nbytes()}


def _select_ops(device: torch.device):
    """Triton kernels on CUDA, PyTorch elsewhere; S4KV_OPS=torch|triton overrides (debugging)."""
    choice = os.environ.get("S4KV_OPS") or ("triton" if device.type == "cuda" else "torch")
    if choice == "triton":
        from s4kv.backend import triton_ops

        return triton_ops
    from s4kv.backend import torch_ops

    return torch_ops


def _current_device() -> torch.device:
    from vllm.platforms import current_platform

    if current_platform.is_cuda_alike():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(current_platform.device_type)
