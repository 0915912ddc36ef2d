"""The int4_kivi backend's metadata builder: vLLM's per-step metadata into the kernels' batch
(s4kv.kernels.batch.S4KVMetadata, shared by every layer of a step), with each row's residual slot."""

from __future__ import annotations

import numpy as np
import torch

from s4kv import format as fmt
from s4kv import residual
from s4kv.kernels import num_sms
from s4kv.kernels.batch import S4KVMetadata, plan_launch

try:  # vLLM is only needed when the backend is used inside an engine.
    from vllm.v1.attention.backend import AttentionCGSupport, AttentionMetadataBuilder
except ImportError:  # pragma: no cover - s4kv's pure parts import without vLLM
    AttentionMetadataBuilder = object  # type: ignore[assignment,misc]
    AttentionCGSupport = None  # type: ignore[assignment]


class V2Slots:
    """Slots handed over by vLLM 0.24's V2 runner (a patch calls :meth:`set` per metadata build)."""

    idx: np.ndarray | None = None

    @classmethod
    def set(cls, idx_mapping_np: np.ndarray, num_reqs: int) -> None:
        cls.idx = np.asarray(idx_mapping_np[:num_reqs], dtype=np.int32).copy()

    @classmethod
    def take(cls) -> np.ndarray | None:
        idx, cls.idx = cls.idx, None
        return idx


class S4KVMetadataBuilder(AttentionMetadataBuilder):
    # Decode-only full CUDA graphs; prefill and mixed batches run piecewise (attention is a
    # graph-splitting op there).
    _cudagraph_support = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE if AttentionCGSupport else None

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._init_reorder_batch_threshold(1)  # decodes first: kernels split the batch on the host
        self.block_size = kv_cache_spec.block_size
        if self.block_size != fmt.BLOCK_SIZE:
            raise ValueError(f"int4_kivi needs block_size {fmt.BLOCK_SIZE}, the KV cache spec has "
                             f"{self.block_size}")
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.num_kv_heads = kv_cache_spec.num_kv_heads
        self.num_sms = num_sms(torch.device(device))
        self.scratch = self.max_num_reqs
        # Persistent so a captured CUDA graph always reads the current slots.
        self._slots = torch.full((self.max_num_reqs,), self.scratch, dtype=torch.int32, device=device)
        self._last_generation = -1

    def _row_slots(self, cam, num_reqs: int) -> np.ndarray:
        slots = np.full(num_reqs, self.scratch, dtype=np.int32)
        req_idx = getattr(cam, "req_idx", None)  # vLLM 0.32 V2 runner
        if req_idx is None:
            req_idx = V2Slots.take()  # vLLM 0.24 V2 runner (patch)
        if req_idx is not None:
            n = min(len(req_idx), num_reqs)
            slots[:n] = req_idx[:n]
            return slots
        table = residual.slot_table(self.max_num_reqs)  # V1 runner (patch)
        # Rows come from the lifecycle hook of this step. A second build in the same step can only
        # be a dummy run (warm-up, profiling), which must not touch any request's slot.
        if table.generation != self._last_generation:
            self._last_generation = table.generation
            rows = table.row_slots
            n = min(len(rows), num_reqs)
            slots[:n] = rows[:n]
        return slots

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False) -> S4KVMetadata:
        cam = common_attn_metadata
        n = cam.num_reqs
        slots_np = self._row_slots(cam, n)
        slots_cpu = torch.from_numpy(slots_np)
        self._slots[:n].copy_(slots_cpu, non_blocking=True)
        seq_lens_cpu = cam.seq_lens_cpu_upper_bound
        if seq_lens_cpu is None:
            seq_lens_cpu = cam.seq_lens.cpu()
        md = S4KVMetadata(
            num_reqs=n,
            num_actual_tokens=cam.num_actual_tokens,
            max_query_len=cam.max_query_len,
            max_seq_len=cam.max_seq_len,
            query_start_loc=cam.query_start_loc,
            seq_lens=cam.seq_lens,
            block_table=cam.block_table_tensor,
            slots=self._slots[:n],
            query_start_loc_cpu=cam.query_start_loc_cpu,
            seq_lens_cpu=seq_lens_cpu[:n],
            slots_cpu=slots_cpu,
        )
        return plan_launch(md, self.num_kv_heads, self.num_sms, uniform_decode=self._uniform_decode(cam))

    @staticmethod
    def _uniform_decode(cam) -> bool:
        return cam.max_query_len == 1

    def build_for_cudagraph_capture(self, common_attn_metadata) -> S4KVMetadata:
        # Capture runs are dummies: every row reads and writes the scratch slot.
        md = self.build(0, common_attn_metadata)
        md.slots.fill_(self.scratch)
        md.slots_cpu.fill_(self.scratch)
        return md
