"""Residual slots: where each running request keeps its not-yet-full tail block exact.

Every attention layer owns a residual tensor ``[num_slots, 2, num_kv_heads, BLOCK_SIZE, head_size]``
in the model dtype (rotated basis, like the pages). A request holds one slot index from when it is
scheduled until it finishes or is preempted; all layers use the same index. The last slot is a
scratch slot for rows that belong to no request (profiling, warm-up, CUDA-graph padding), so
kernels never need a branch for "no slot".

Where the slot index comes from depends on vLLM's model runner:

* V1 runner (vLLM 0.32 CPU, 0.24 Qwen2 on CUDA): rows of the persistent batch move around
  (``condense``, ``swap_states``), so :class:`SlotTable` maps request ids to slots. A patch calls
  :func:`s4kv.vllm_hooks.on_batch_updated` once per step, after the batch is final.
* V2 runner (vLLM 0.32 CUDA, 0.24 Llama on CUDA): the runner already gives every request a stable
  index in ``[0, max_num_seqs)`` for its whole residency (``CommonAttentionMetadata.req_idx`` in
  0.32; handed over by a patch in 0.24). That index is the slot.

Contents never need clearing: a request always (re)starts at a block boundary (prefix-cache hits
are whole blocks; a resumed request recomputes from its last cached block), so the tokens it reads
from its slot are always ones it wrote.
"""

from __future__ import annotations

import threading

import numpy as np


class SlotTable:
    """request id -> residual slot, for runners whose batch rows are not stable."""

    def __init__(self, num_request_slots: int):
        self.num_request_slots = num_request_slots
        self.scratch = num_request_slots  # index of the scratch slot
        self._slot_of: dict[str, int] = {}
        self._free = list(range(num_request_slots - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self.row_slots = np.full(0, self.scratch, dtype=np.int32)
        self.generation = 0  # bumped by every update (one per scheduler step)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._slot_of)

    def slot_of(self, req_id: str) -> int | None:
        return self._slot_of.get(req_id)

    def release(self, req_ids) -> None:
        for req_id in req_ids or ():
            slot = self._slot_of.pop(req_id, None)
            if slot is not None:
                self._free.append(slot)

    def update(self, finished, preempted, row_req_ids) -> np.ndarray:
        """Apply one scheduler step and return the slot of every batch row.

        Finished and preempted requests are released *before* new ones are assigned: an aborted id
        can be resubmitted and appear in both sets in one step.
        """
        with self._lock:
            self.release(finished)
            self.release(preempted)
            rows = np.empty(len(row_req_ids), dtype=np.int32)
            for i, req_id in enumerate(row_req_ids):
                if req_id is None:
                    rows[i] = self.scratch
                    continue
                slot = self._slot_of.get(req_id)
                if slot is None:
                    if not self._free:
                        raise RuntimeError(
                            f"int4_kivi: no free residual slot for request {req_id!r}: "
                            f"{self.num_request_slots} slots (max_num_seqs) are all held")
                    slot = self._free.pop()
                    self._slot_of[req_id] = slot
                rows[i] = slot
            self.row_slots = rows
            self.generation += 1
            return rows


_table: SlotTable | None = None


def slot_table(num_request_slots: int | None = None) -> SlotTable:
    """The process-wide table (one engine per worker process). The attention impl creates it
    while the model is built; later callers just fetch it."""
    global _table
    if _table is None:
        if num_request_slots is None:
            raise RuntimeError("int4_kivi: residual slot table used before the attention backend was built")
        _table = SlotTable(num_request_slots)
    elif num_request_slots is not None and num_request_slots != _table.num_request_slots:
        raise RuntimeError(f"int4_kivi: residual slot table has {_table.num_request_slots} slots, "
                           f"asked for {num_request_slots}")
    return _table


def reset_slot_table() -> None:
    global _table
    _table = None
