"""Triton kernels of the int4_kivi cache (CUDA; also run under TRITON_INTERPRET=1 on CPU in tests).

* ``store``: this step's tokens as 8-bit window rows; completed units quantized into pages from
  their rows; the rows of incomplete units kept in their windows (``window``: where a window's rows
  are, and how a kernel reads them).
* ``decode``: split-KV decode attention over pages + window, and the split reduction.
* ``chunk``: attention of query chunks (prefill, chunked prefill, prefix-cache extends): the pages a
  chunk reads are staged in 16 bits (``chunk_plan`` says which), then vLLM's FlashAttention
  (``flash``) runs over them.
* ``quant``: scalar helpers mirroring ``s4kv.format``.
"""

import functools
import hashlib
import json
import os

import torch
import triton
import triton.language as tl

from s4kv import format as fmt
from s4kv.kernels import code_ptx

_TL = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


# LAYOUT (a kernel's argument, kernel_layout(head_size)) read inside the kernel at compile
# time: `V_CODES: tl.constexpr = layout(LAYOUT, "v_codes")`
layout = triton.constexpr_function(fmt.layout_value)


def ptx_digest() -> str:
    """A digest of the kernels' inline PTX texts and code biases (s4kv.kernels.code_ptx)."""
    tables = (sorted(code_ptx.UNPACK_PTX.items()), sorted(code_ptx.CODE_BIAS.items()), code_ptx.FP16_SATFINITE,
              sorted(code_ptx.BYTE_CODES_PTX.items()))
    return hashlib.sha256(repr(tables).encode()).hexdigest()[:16]


@functools.cache
def kernel_layout(head_size: int) -> str:
    """Every kernel's LAYOUT argument: s4kv.format.kernel_layout(head_size) and ptx_digest().

    Triton keys its on-disk kernel cache by a kernel's source, its arguments' values and the
    constexpr globals it reads, not by what a constexpr function reads through another module, as
    the kernels read code_ptx's texts: a changed unpack PTX reused kernels compiled with the old one
    (2026-12-05). An argument's value is what every Triton version keys the cache by; the tables
    as constexpr globals read by the constexpr functions also changed Triton 3.6's keys (be5a99d),
    but through how Triton collects a kernel's globals, which its versions change, and Triton
    checks such globals on every launch. The digest adds no launch argument
    (tools/launch_host_time.py: the same host time as before, 102 us per mixed layer on the CPU
    machine) and no instruction (SASS identical)."""
    return f"{fmt.kernel_layout(head_size)};ptx={ptx_digest()}"


def group_pad(group: int) -> int:
    """Query heads per kv head padded for a dot's tile: the next power of two, at least 16. Plain
    integer arithmetic: Triton's next_power_of_2 is a constexpr function, about 2 µs per host call
    (tools/launch_host_time.py), paid in every eager launch that asks it."""
    return max(16, 1 << (group - 1).bit_length())


# the same inside a kernel, from its GROUP constexpr (`G_PAD: tl.constexpr = padded_group(GROUP)`): one
# constexpr argument fewer per launch (about 0.6 µs of host time each, tools/launch_host_time.py)
padded_group = triton.constexpr_function(group_pad)


def tl_dtype(dtype: torch.dtype):
    return _TL[dtype]


# triton.jit reads TRITON_INTERPRET when a kernel is defined, so whether s4kv's kernels run under the
# interpreter is settled when this package is imported: read once (an environment lookup per call
# cost about 2 us of host time, 7 calls per eager layer; tools/layer_host_profile.py)
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def interpreted() -> bool:
    """Kernels run under Triton's interpreter (CPU tests): no inline PTX, no bf16 dots."""
    return _INTERPRETED


def dot_dtype(dtype: torch.dtype):
    """Operand dtype of tl.dot for a model dtype. Triton's interpreter (3.9) computes bf16 dots
    wrongly, so interpreted runs use fp32 operands (the kernels' logic is what CPU tests check)."""
    if interpreted() and dtype == torch.bfloat16:
        return tl.float32
    return _TL[dtype]


# Launch options per (kernel, head_size): num_warps/num_stages and kernel tile constexprs (decode's
# SUB), measured with tools/gpu/tune_kernels.py on the H200; anything absent uses the defaults.
LAUNCH: dict[tuple[str, int], dict] = {}


def _load_overrides() -> None:
    """S4KV_KERNEL_CONFIG: a JSON file [{"kernel": ..., "head_size": ..., "options": {...}}, ...]
    (what tools/gpu/tune_kernels.py writes) replacing the entries above."""
    path = os.environ.get("S4KV_KERNEL_CONFIG")
    if path:
        with open(path) as f:
            for entry in json.load(f):
                LAUNCH[(entry["kernel"], int(entry["head_size"]))] = dict(entry["options"])


_load_overrides()


# GPUs whose blocks get less shared memory than this (sm86/sm89: A10G, L4, L40S have ~99 KiB; A100
# 163 KiB, H100/H200 227 KiB) start from SMALL_SHARED_LAUNCH where a kernel's general launch does
# not fit them (tools/kernel_static.py compiles every kernel for each and tests/test_kernel_launch_fit.py
# fails on one that does not fit). Entries of LAUNCH (tuned on the machine) win.
SMALL_SHARED_MEMORY = 160 * 1024
SMALL_SHARED_LAUNCH: dict[tuple[str, int], dict] = {}


@functools.cache
def _max_shared_memory(index: int) -> int:
    from triton.runtime import driver

    return int(driver.active.utils.get_device_properties(index)["max_shared_mem"])


def max_shared_memory(device) -> int | None:
    """Shared memory a block may use on a CUDA device (what Triton checks at launch); None elsewhere."""
    if device is None or _INTERPRETED:
        return None
    if not isinstance(device, torch.device):  # a tensor's .device already is one (every launch)
        device = torch.device(device)
    if device.type != "cuda":
        return None
    return _max_shared_memory(device.index if device.index is not None else torch.cuda.current_device())


def launch_options(kernel: str, head_size: int, device=None) -> dict:
    """Options of one kernel launch on `device`: the tuned LAUNCH entry over the device's
    shared-memory defaults."""
    return launch_options_for(kernel, head_size, max_shared_memory(device))


def launch_options_for(kernel: str, head_size: int, shared_memory: int | None) -> dict:
    """The same for a GPU whose blocks may use `shared_memory` bytes (None: no rule, e.g. off the
    GPU); tools/kernel_static.py asks it per architecture."""
    tuned = LAUNCH.get((kernel, head_size))
    if shared_memory is None or shared_memory >= SMALL_SHARED_MEMORY:
        return dict(tuned) if tuned else {}
    return {**SMALL_SHARED_LAUNCH.get((kernel, head_size), {}), **(tuned or {})}


def mma_sync_env(capability_major: int | None) -> dict[str, str]:
    """Environment variables for compiling the decode page kernel for GPUs of this compute capability
    major. On sm90, Triton 3.8 and later compile the page loop's dots (N = 8 query heads) to wgmma,
    whose operands pass through shared memory: 1,080 instructions per warp and page and 64 bytes
    spilled (Qwen2.5-7B shape, bf16), against 767 with mma.sync, which Triton 3.6 chose by itself
    (779; tools/kernel_static.py, docs/results/kernel-static-2026-12-04-triton38/). Triton's
    DISABLE_MMA_V3 keeps the kernel on mma.sync; it is one of Triton's cache-invalidating variables,
    so those binaries are cached apart from the rest. Empty elsewhere."""
    return {"DISABLE_MMA_V3": "1"} if capability_major == 9 else {}


class compile_env:
    """Context manager: `env` set in os.environ for what runs inside (a kernel launch, which compiles
    the kernel on its first call for a specialization), then restored. Triton reads its compiler
    variables when it compiles; a compiled kernel is found again by the same launch without them.
    The process environment is shared: a thread compiling another Triton kernel during such a
    first launch would see the variables too (vLLM's model runner launches from one thread)."""

    __slots__ = ("env", "saved")

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.saved: dict[str, str | None] = {}

    def __enter__(self):
        for key, value in self.env.items():
            self.saved[key] = os.environ.get(key)
            os.environ[key] = value
        return self

    def __exit__(self, *exc):
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        return False


@functools.cache
def _capability_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def capability_major(device: torch.device) -> int | None:
    """Compute capability major of the GPU `device` is on (cached per device); None off the GPU and
    under the interpreter, where no kernel is compiled for a GPU."""
    if device.type != "cuda" or interpreted():
        return None
    return _capability_major(device.index if device.index is not None else torch.cuda.current_device())


def page_kernel_env(device: torch.device) -> dict[str, str]:
    """mma_sync_env for the GPU `device` is on; empty off the GPU and under the interpreter."""
    return mma_sync_env(capability_major(device))


def num_sms(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (1 elsewhere): the decode split count scales with it."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


_ROT: dict = {}


def rotation_operand(head_size: int, dtype: torch.dtype, device) -> torch.Tensor:
    """The +-1 rotation matrix as a kernel operand (cached per device and dtype)."""
    key = (head_size, dtype, str(device))
    if key not in _ROT:
        _ROT[key] = fmt.rotation_pm1(head_size, device=device, dtype=dtype).contiguous()
    return _ROT[key]
