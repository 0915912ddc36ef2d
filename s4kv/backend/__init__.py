"""The int4_kivi attention backend for vLLM's v1 engine (metadata builder + impl)."""

from s4kv.backend.backend import S4KVAttentionBackend

__all__ = ["S4KVAttentionBackend"]
