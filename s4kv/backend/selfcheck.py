"""Startup check of the Triton kernels against the PyTorch reference, on the GPU that will serve.

The kernels are tested against ``s4kv.reference`` in CI (interpreted) and on the test GPU, but
they are compiled by the user's Triton for the user's GPU (sm80 to sm90), where a miscompile
would not fail: it would serve wrong attention. So before an engine serves, one small sequence
per layer shape goes through the real launch path (store, chunk attention, append, split-KV
decode) and must match the reference; otherwise the engine refuses to start, with the numbers.
"""

from __future__ import annotations

import torch

from s4kv import format as fmt

# Relative L2 error against the fp32 reference (also the GPU kernel tests', tests/test_kernels.py):
# bf16 attention keeps ~8 bits of each probability; fp16 is tighter.
TOLERANCE = {torch.bfloat16: 1e-2, torch.float16: 4e-3, torch.float32: 4e-3}

_checked: set = set()

# (first position, tokens) of the check's steps (see check_kernels)
_PROMPT = fmt.UNIT + 37
_STEPS = [(0, _PROMPT), (_PROMPT, 1), (_PROMPT + 1, 2 * fmt.UNIT - 2 - _PROMPT), (2 * fmt.UNIT - 1, 1),
          (2 * fmt.UNIT, 1)]


def largest_step() -> int:
    """Tokens of the check's largest step: the step workspaces must hold it whatever the engine's
    max_num_batched_tokens."""
    return max(n for _, n in _STEPS)


class KernelSelfCheckError(RuntimeError):
    pass


def _step(q, k, v, regions, blocks, ctx: int, n: int, scale: float, device):
    """One engine step of a single request: tokens ctx .. ctx + n - 1."""
    from s4kv.backend import triton_ops
    from s4kv.kernels.batch import S4KVMetadata, plan_launch

    def i32(x, dev=device):
        return torch.tensor(x, dtype=torch.int32, device=dev)

    end = ctx + n
    md = S4KVMetadata(num_reqs=1, num_actual_tokens=n, max_query_len=n, max_seq_len=end,
                      query_start_loc=i32([0, n]), seq_lens=i32([end]), block_table=i32([blocks]),
                      query_start_loc_cpu=i32([0, n], "cpu"), seq_lens_cpu=i32([end], "cpu"))
    props = torch.cuda.get_device_properties(device) if device.type == "cuda" else None
    plan_launch(md, k.shape[1], num_sms=props.multi_processor_count if props else 4, uniform_decode=n == 1)
    out = torch.full((n, q.shape[1], q.shape[2]), float("nan"), dtype=q.dtype, device=device)
    triton_ops.forward(q[ctx:end].to(device), k[ctx:end].to(device), v[ctx:end].to(device), regions, md,
                       scale, out)
    return out.float().cpu()


def check_kernels(num_heads: int, num_kv_heads: int, head_size: int, dtype: torch.dtype,
                  device: torch.device) -> None:
    """Raise KernelSelfCheckError unless the kernels reproduce s4kv.reference for this layer shape.

    Once per process and shape. One request, five steps, each compared with the reference: a
    prompt of a unit + 37 tokens in one chunk (the store kernel writes two pages; chunk attention
    over pages + window rows), a decode step (split-KV over the pages + the window), a chunk that
    reads pages, its window and itself, a decode step that completes the second unit, and one
    after it. The pages start as noise: a window row never written must never be read.
    """
    from s4kv.reference import kivi_attention

    key = (str(device), num_heads, num_kv_heads, head_size, dtype)
    if key in _checked:
        return
    steps, length = _STEPS, _STEPS[-1][0] + _STEPS[-1][1]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(length, num_heads, head_size, generator=g).to(dtype)
    k = torch.randn(length, num_kv_heads, head_size, generator=g).mul(2).to(dtype)
    v = torch.randn(length, num_kv_heads, head_size, generator=g).to(dtype)
    held = fmt.blocks_held(length, head_size, dtype.itemsize)
    regions = torch.randint(0, 256, (held + 1, num_kv_heads, fmt.PageLayout(head_size).region_bytes),
                            generator=g, dtype=torch.uint8).to(device)
    blocks = torch.randperm(held + 1, generator=g)[:held].tolist()  # out of order: the block table is followed
    scale = head_size ** -0.5
    tol = TOLERANCE[dtype]
    for ctx, n in steps:
        got = _step(q, k, v, regions, blocks, ctx, n, scale, device)
        want = kivi_attention(q[ctx:ctx + n], k[:ctx + n], v[:ctx + n], scale, q_start=ctx)
        err = ((got - want).norm() / want.norm()).item() if torch.isfinite(got).all() else float("nan")
        if not err <= tol:
            what = "chunk attention" if n > 1 else "decode attention"
            raise KernelSelfCheckError(
                f"int4_kivi's Triton kernels disagree with the reference on this GPU "
                f"({_device_name(device)}): {what} of positions {ctx}..{ctx + n - 1} for {num_heads} query / "
                f"{num_kv_heads} kv heads, head_dim {head_size}, {str(dtype).removeprefix('torch.')}: relative "
                f"error {err:.3g} > {tol:g}. Refusing to serve wrong attention; please report it with your GPU, "
                f"driver and Triton versions.")
    _checked.add(key)


def _device_name(device: torch.device) -> str:
    if device.type != "cuda":
        return device.type
    import triton

    cc = torch.cuda.get_device_capability(device)
    return f"{torch.cuda.get_device_name(device)}, sm{cc[0]}{cc[1]}, Triton {triton.__version__}"
