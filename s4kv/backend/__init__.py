"""The int4_kivi attention backend for vLLM's v1 engine.

``backend`` (the class vLLM selects), ``metadata`` (per-step metadata and its builder), ``impl``
(the layer's forward), ``torch_ops`` (CPU) and ``triton_ops`` (CUDA). Only ``backend`` and
``impl`` need vLLM; the ops and metadata import without it (kernel tests, benchmarks).
"""
