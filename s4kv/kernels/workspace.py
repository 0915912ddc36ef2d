"""Scratch tensors shared by all layers of a shape (they run one after the other), reserved while an
engine loads its model so that vLLM's memory profile counts them and never reallocated afterwards
(captured CUDA graphs keep reading the same addresses). Outside an engine (tests, benchmarks) they
grow on demand."""

from __future__ import annotations

from typing import ClassVar

import torch


class ReservedWorkspace:
    """Buffers per (device, kv heads, head size) holding at least `count` items (pages, tokens: what
    `allocate` sizes by). Each subclass keeps its own buffers and reservations."""

    what: ClassVar[str] = "workspace"  # how the reservation error names it
    unit: ClassVar[str] = "items"
    _buffers: ClassVar[dict]
    _reserved: ClassVar[dict]  # key -> reserved count

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._buffers, cls._reserved = {}, {}

    @staticmethod
    def allocate(count: int, num_kv_heads: int, head_size: int, device) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    @staticmethod
    def _key(num_kv_heads: int, head_size: int, device) -> tuple:
        return (str(torch.device(device)), num_kv_heads, head_size)

    @classmethod
    def reserve(cls, count: int, num_kv_heads: int, head_size: int, device) -> None:
        key = cls._key(num_kv_heads, head_size, device)
        cls._reserved[key] = max(count, cls._reserved.get(key, 0))
        cls._ensure(key, cls._reserved[key], num_kv_heads, head_size, device)

    @classmethod
    def capacity(cls, num_kv_heads: int, head_size: int, device) -> int | None:
        """The reserved count (None: not reserved, grows as needed)."""
        return cls._reserved.get(cls._key(num_kv_heads, head_size, device))

    @classmethod
    def get(cls, count: int, num_kv_heads: int, head_size: int, device) -> tuple[torch.Tensor, ...]:
        """The buffers, holding at least `count` items; more than a reservation is an error."""
        key = cls._key(num_kv_heads, head_size, device)
        reserved = cls._reserved.get(key)
        if reserved is not None and count > reserved:
            raise RuntimeError(f"int4_kivi {cls.what}: {count} {cls.unit} asked, {reserved} reserved")
        cls._ensure(key, count, num_kv_heads, head_size, device)
        return cls._buffers[key]

    @classmethod
    def nbytes(cls) -> int:
        """Bytes of every buffer this process holds."""
        return sum(t.numel() * t.element_size() for bufs in cls._buffers.values() for t in bufs)

    @classmethod
    def _ensure(cls, key, count, num_kv_heads, head_size, device) -> None:
        have = cls._buffers.get(key)
        if have is None or have[0].shape[0] < count:
            cls._buffers[key] = cls.allocate(count, num_kv_heads, head_size, device)
