"""Upstream wheels: download once (``pip download --no-deps``), cache, read their Python tree.

Cache layout (``$S4KV_CACHE_DIR``, else ``$XDG_CACHE_HOME/s4kv-forklayer``, else
``~/.cache/s4kv-forklayer``)::

    upstream/<dist>-<version>/<wheel file>          the published wheel, as downloaded
    upstream/<dist>-<version>/<wheel file>.sha256   its sha256 (keyed by size and mtime)
    built/<key>/<patched wheel file>                 build outputs, key = hash of all inputs
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .wheel import normalize_dist


class UpstreamError(RuntimeError):
    pass


def cache_dir() -> Path:
    if os.environ.get("S4KV_CACHE_DIR"):
        return Path(os.environ["S4KV_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "s4kv-forklayer"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cached_sha256(path: Path) -> str:
    """sha256 of a cached wheel, remembered in a side file keyed by size and mtime."""
    st = path.stat()
    side = path.with_name(path.name + ".sha256")
    stamp = f"{st.st_size} {st.st_mtime_ns}"
    if side.is_file():
        saved_stamp, _, digest = side.read_text().strip().rpartition(" ")
        if saved_stamp == stamp:
            return digest
    digest = sha256_file(path)
    side.write_text(f"{stamp} {digest}\n")
    return digest


def upstream_wheel(dist: str, version: str, *, offline: bool = False) -> Path:
    """Path of the published wheel ``dist==version`` in the cache, downloading it if needed."""
    d = cache_dir() / "upstream" / f"{normalize_dist(dist)}-{version}"
    found = sorted(d.glob("*.whl")) if d.is_dir() else []
    if found:
        return found[0]
    if offline:
        raise UpstreamError(f"{dist}=={version}: not in the cache ({d}) and offline")
    d.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=d.parent, prefix=".dl-") as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "-q", "-d", tmp, f"{dist}=={version}",
        ]
        print(f"forklayer: downloading {dist}=={version} (pip download --no-deps)", flush=True)
        r = subprocess.run(cmd, check=False)
        wheels = sorted(Path(tmp).glob("*.whl"))
        if r.returncode != 0 or len(wheels) != 1:
            raise UpstreamError(f"pip download {dist}=={version} failed (exit {r.returncode})")
        d.mkdir(parents=True, exist_ok=True)
        dest = d / wheels[0].name
        shutil.move(str(wheels[0]), dest)
    cached_sha256(dest)
    return dest


def is_text(data: bytes) -> bool:
    return b"\0" not in data


def iter_tree(wheel: Path, prefix: str = "vllm/"):
    """(name, bytes, executable) for the text files of the wheel under ``prefix`` (no binaries)."""
    with zipfile.ZipFile(wheel) as z:
        for zi in z.infolist():
            if zi.is_dir() or not zi.filename.startswith(prefix) or zi.filename.endswith((".so", ".pyc")):
                continue
            data = z.read(zi)
            if is_text(data):
                yield zi.filename, data, bool((zi.external_attr >> 16) & 0o111)


def extract_members(wheel: Path, names: set[str] | list[str], dest: Path) -> set[str]:
    """Extract the given members (those that exist) into ``dest``; return the names extracted."""
    got = set()
    with zipfile.ZipFile(wheel) as z:
        present = set(z.namelist())
        for name in sorted(names):
            if name in present:
                out = dest / name
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(z.read(name))
                got.add(name)
    return got
