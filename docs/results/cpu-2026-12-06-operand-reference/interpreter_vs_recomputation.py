"""CPU, Triton's interpreter (3.9): the decode kernel's row on test_peaky_queries_against_reference's
inputs against the reference and against tests/operand_roundings.py's recomputation with the kernel's
operand roundings (fp32 for the model's bf16 operands under the interpreter, fp16 with
{"decode-grid": {"fp16_operands": true}}).
Run: PYTHONPATH=.:tests python docs/results/cpu-2026-12-06-operand-reference/interpreter_vs_recomputation.py"""
import os; os.environ["TRITON_INTERPRET"] = "1"
import torch
from paged_harness import Engine
from operand_roundings import decode_row_with_operand_roundings as emu
from s4kv import format as fmt, kernels
from s4kv.backend import triton_ops
BS = fmt.BLOCK_SIZE
rel = lambda a, b: ((a - b).norm() / b.norm()).item()
for fp16 in (False, True):
    kernels.LAUNCH[("decode-grid", 0)] = {"fp16_operands": fp16}
    for qs in (1, 8, 16):
        e = Engine(7, 1, 64, torch.bfloat16, ops=triton_ops, num_blocks=16)
        e.add("a", 5 * BS + 3); e.reqs["a"]["q"] *= qs
        e.step([("a", 5 * BS + 2)]); res = e.step([("a", 1)])
        out, ctx = res["a"]; r = e.reqs["a"]
        q, k, v = r["q"][ctx:ctx+1], r["k"][:ctx+1], r["v"][:ctx+1]
        ref = e.reference("a", res["a"])
        em = emu(q, k, v, 64 ** -0.5, torch.float16 if fp16 else torch.float32)
        print(f"fp16_operands={fp16} q {qs:>2}x: kernel-ref {rel(out, ref):.2e}  kernel-emulation {rel(out, em):.2e}  emulation-ref {rel(em, ref):.2e}", flush=True)
