"""For one measurement only (the sixteenth session's quality of INT8_KEYS 1 on the GPU): the engine's
start-up check (s4kv.backend.selfcheck) holds bf16 rows to 6e-2 of the fp32 reference instead of 1e-2 (3e-2 was too tight:
3.03e-2 at SmolLM2's shape),
so that an engine whose key dots round q * s to int8 (1.3e-2 to 2.6e-2 off in the kernel tests, 3.0e-2 in the check)
starts and its quality can be measured. Put on PYTHONPATH by that measurement's command alone."""
import sys

import torch

from s4kv.backend import selfcheck

selfcheck.TOLERANCE[torch.bfloat16] = 6e-2
print("sitecustomize: s4kv start-up check's bf16 bound widened to 6e-2 for this measurement", file=sys.stderr)
