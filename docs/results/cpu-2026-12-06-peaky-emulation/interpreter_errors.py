"""CPU, Triton's interpreter: the decode kernel's distance from the reference on
test_peaky_queries_against_reference's inputs (queries 1x/8x/16x) and on
test_fp16_operands_do_not_overflow's (queries 300x, keys 3000x), for a bf16 model with the model's
operands (the interpreter multiplies them as fp32), a bf16 model with fp16 operands
({"decode-grid": {"fp16_operands": true}}: the interpreter rounds fp16 operands as a GPU does) and an
fp16 model. Run: PYTHONPATH=.:tests python docs/results/cpu-2026-12-06-peaky-emulation/interpreter_errors.py"""
import os

os.environ["TRITON_INTERPRET"] = "1"
import torch
from paged_harness import Engine

from s4kv import format as fmt
from s4kv import kernels
from s4kv.backend import triton_ops

BS = fmt.BLOCK_SIZE


def err(dtype, q_scale, k_scale, fp16_operands):
    kernels.LAUNCH[("decode-grid", 0)] = {"fp16_operands": fp16_operands}
    e = Engine(7, 1, 64, dtype, ops=triton_ops, num_blocks=16)
    e.add("a", 5 * BS + 3)
    e.reqs["a"]["q"] *= q_scale
    e.reqs["a"]["k"] *= k_scale
    e.step([("a", 5 * BS + 2)])
    (name, oc), = e.step([("a", 1)]).items()
    ref = e.reference(name, oc)
    return ((oc[0] - ref).norm() / ref.norm()).item()


print(f"{'inputs':>22}  {'bf16 model':>10}  {'bf16, fp16 operands':>19}  {'fp16 model':>10}")
for q_scale, k_scale in ((1, 1), (8, 1), (16, 1), (300, 3000)):
    print(f"q {q_scale:>3}x, k {k_scale:>4}x  " + f"{err(torch.bfloat16, q_scale, k_scale, False):>10.2e}  "
          f"{err(torch.bfloat16, q_scale, k_scale, True):>19.2e}  {err(torch.float16, q_scale, k_scale, False):>10.2e}",
          flush=True)
