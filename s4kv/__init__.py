"""S4 KV: an int4 (KIVI) KV cache for vLLM."""

__version__ = "0.1.0"
