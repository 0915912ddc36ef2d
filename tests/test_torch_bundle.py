"""tools/gpu/torch_bundle.py cuts wheels into chunks for the GPU machine and writes setup-torch.sh,
which must refuse a missing or damaged chunk before it touches the site, and install the wheels
from intact ones. Checked with two small real wheels and chunks far smaller than the real 58 MiB,
so the payload spans several of them; the script's last step (the new torch on a GPU) fails here,
with its own exit code, after the install."""

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "gpu"))
import torch_bundle


def make_wheel(folder: Path, name: str, payload: bytes) -> Path:
    """A minimal installable wheel holding one module with `payload` in it."""
    dist = f"{name}-1.0.dist-info"
    files = {f"{name}.py": b"DATA = " + repr(payload).encode() + b"\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},,\n" for p in files) + f"{dist}/RECORD,,\n"
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for p, data in files.items():
            z.writestr(p, data)
        z.writestr(f"{dist}/RECORD", record)
    return path


def run_setup(bundle: Path, stage: Path, site: Path, tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "S4KV_STAGE": str(stage), "S4KV_SITE": str(site), "S4KV_TORCH_WORK": str(tmp / "work"),
           "S4KV_PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(["bash", str(bundle / "setup-torch.sh")], env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def test_chunks_refuse_missing_and_damaged_then_install(tmp_path):
    wheels_dir, bundle, stage, site = (tmp_path / d for d in ("wheels", "bundle", "stage", "site"))
    for d in (wheels_dir, bundle, stage):
        d.mkdir()
    # incompressible payloads, so each wheel is several chunks long
    wheels = [make_wheel(wheels_dir, f"s4kvfake{i}", os.urandom(6000)) for i in range(2)]
    chunks, payload = torch_bundle.write_bundle(wheels, bundle, chunk_bytes=4096)

    assert len(chunks) >= 4
    assert all((bundle / n).stat().st_size <= 4096 for n, _ in chunks)
    whole = b"".join((bundle / n).read_bytes() for n, _ in chunks)
    assert hashlib.sha256(whole).hexdigest() == payload
    assert all(hashlib.sha256((bundle / n).read_bytes()).hexdigest() == h for n, h in chunks)

    # one chunk short: exit 3, naming it, nothing installed
    for n, _ in chunks[:-1]:
        (stage / n).write_bytes((bundle / n).read_bytes())
    res = run_setup(bundle, stage, site, tmp_path)
    assert res.returncode == 3, res.stderr
    assert chunks[-1][0] in res.stderr
    assert not site.exists()

    # all there, one damaged: exit 4, and the damaged one removed so that it is carried again
    (stage / chunks[-1][0]).write_bytes((bundle / chunks[-1][0]).read_bytes())
    bad = stage / chunks[1][0]
    data = bad.read_bytes()
    bad.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])  # a byte that surely differs
    res = run_setup(bundle, stage, site, tmp_path)
    assert res.returncode == 4, res.stderr
    assert not bad.exists()
    assert not site.exists()

    # intact: the wheels are installed and marked; the GPU check then fails (no GPU here): exit 5
    bad.write_bytes((bundle / chunks[1][0]).read_bytes())
    res = run_setup(bundle, stage, site, tmp_path)
    assert "installed into" in res.stdout, res.stdout + res.stderr
    assert res.returncode == 5, res.stdout + res.stderr
    for i, w in enumerate(wheels):
        assert (site / f"s4kvfake{i}.py").exists(), w
    assert (site / ".s4kv-torch").read_text().strip() == payload

    # run again: the finished install is skipped
    res = run_setup(bundle, stage, site, tmp_path)
    assert "already installed" in res.stdout


def test_chunks_fit_beside_the_tree_in_one_call(tmp_path):
    """A call sends the checkout's tree and its chunk, 64 MiB in all: the default chunk leaves 2 MiB
    to spare beside the tree, and a call cut for a smaller tree is found before anything is sent
    (a tree of 5.8 MiB, 7.1 MiB in 4 KiB blocks, beside make-bundle's 58 MiB chunks was refused)."""
    MiB = 2**20
    assert torch_bundle.fitting_chunk(1 * MiB) == 58 * MiB
    assert torch_bundle.fitting_chunk(int(7.1 * MiB)) == 54 * MiB
    assert torch_bundle.fitting_chunk(int(7.1 * MiB)) + int(7.1 * MiB) + 2 * MiB <= torch_bundle.CALL_LIMIT
    assert torch_bundle.on_disk(1) == torch_bundle.on_disk(4096) == 4096 < torch_bundle.on_disk(4097)
    (tmp_path / "c0").write_bytes(b"\0" * (58 * MiB))
    (tmp_path / "c1").write_bytes(b"\0" * (52 * MiB))
    (tmp_path / "setup.sh").write_bytes(b"#!/bin/sh\n")
    calls = [{"carry": ["c0"]}, {"carry": ["c1", "setup.sh"]}]
    tree = int(7.1 * MiB)
    assert [i for i, _ in torch_bundle.oversized(calls, tree, tmp_path)] == [1]
    assert torch_bundle.oversized(calls, 1 * MiB, tmp_path) == []


def test_tree_bytes_counts_what_a_call_sends(tmp_path):
    """tracked and untracked-not-ignored files, each in whole 4 KiB blocks; ignored ones (the
    bundle's chunks) left out"""
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / ".gitignore").write_text("/.gpu33/\n")
    (tmp_path / "tracked.py").write_bytes(b"x" * 5000)
    git("add", ".gitignore", "tracked.py")
    (tmp_path / "untracked.md").write_bytes(b"y" * 10)
    (tmp_path / ".gpu33").mkdir()
    (tmp_path / ".gpu33" / "t0").write_bytes(b"z" * 3 * 2**20)
    assert torch_bundle.tree_bytes(tmp_path) == 4096 + 2 * 4096 + 4096  # .gitignore, tracked.py, untracked.md
