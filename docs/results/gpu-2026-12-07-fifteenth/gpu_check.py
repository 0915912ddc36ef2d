import torch, sys
from s4kv.backend import torch_ops
from s4kv.kernels.bench import decode_inputs
from s4kv.kernels.decode import decode_attention
from s4kv.kernels.store import quantize_rows
from s4kv import format as fmt
BS = fmt.BLOCK_SIZE
for dt in (torch.bfloat16, torch.float16):
    for (hq, hkv, d) in ((28, 4, 128), (7, 1, 64), (16, 1, 128), (32, 8, 128), (9, 3, 64)):
        for ctx in (3 * BS + 37, 9 * BS + 1, 4096 + 5):
            for qs in (1, 8):
                q, k, v, regions, md = decode_inputs(ctx, 3, hq, hkv, d, dt, device="cuda")
                q = (q.float() * qs).to(dt)
                out = torch.zeros(3, hq, d, dtype=torch.float32, device="cuda")
                decode_attention(q, quantize_rows(k, v), regions, md, 3, d ** -0.5, out, md.decode_splits)
                ref = torch.zeros_like(out)
                torch_ops.forward(q, k, v, regions, md, d ** -0.5, ref, store=False)
                e = ((out - ref).norm() / ref.norm()).item()
                print(f"{str(dt):15} hq {hq:2} hkv {hkv} d {d:3} ctx {ctx:5} q x{qs:2} splits {md.decode_splits}: {e:.2e}", flush=True)
