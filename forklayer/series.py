"""``patches/vllm-<version>/series``: the ordered patch list, its revision and digest.

File format (``#`` comments, blank lines ignored)::

    revision: 3
    digest: sha256:<hex>
    0001-accept-int4_kivi-kv-cache-dtype.patch
    0002-....patch

``revision`` is N in the wheel version ``<vllm version>+s4kv.<N>``. ``digest`` is the sha256 of
the patch list (names and bytes, in order). ``patches-export`` bumps ``revision`` and rewrites
``digest`` whenever the exported content differs, so N changes whenever the series does; a
hand edit of a patch without a bump is caught by ``patches-check`` and refused by the build.

Also here: a small parser for git format-patch files (subject, why-header, files, hunks).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import LOCAL_LABEL, PATCHES_DIR

SERIES_NAME = "series"
_PATCH_NAME_RE = re.compile(r"^\d{4}-[A-Za-z0-9._-]+\.patch$")


class SeriesError(ValueError):
    pass


@dataclass
class Series:
    version: str
    dir: Path
    revision: int
    digest: str | None
    patches: list[str]

    @property
    def paths(self) -> list[Path]:
        return [self.dir / name for name in self.patches]

    def compute_digest(self) -> str:
        return digest_of([(p.name, p.read_bytes()) for p in self.paths])

    @property
    def local_version(self) -> str:
        return f"{LOCAL_LABEL}.{self.revision}"

    def wheel_version(self) -> str:
        return f"{self.version}+{self.local_version}"

    def problems(self) -> list[str]:
        """Consistency problems of the series directory (empty list: fine)."""
        out: list[str] = []
        for p in self.paths:
            if not p.is_file():
                out.append(f"{self.dir / SERIES_NAME}: lists {p.name}, which does not exist")
        if out:
            return out
        if self.digest != self.compute_digest():
            out.append(
                f"{self.dir / SERIES_NAME}: the patches changed but revision {self.revision} was not "
                f"bumped (digest mismatch). Run `nox -s patches-export -- {self.version}` from an edit "
                f"repo, or `python -m forklayer bump --vllm {self.version}`."
            )
        listed = set(self.patches)
        for extra in sorted(self.dir.glob("*.patch")):
            if extra.name not in listed:
                out.append(f"{extra}: not listed in {self.dir / SERIES_NAME}")
        for p in self.paths:
            info = parse_patch(p.read_text())
            if not info.why.strip():
                out.append(f"{p}: no why-header (the commit message body must say why the patch exists)")
            if not info.files:
                out.append(f"{p}: contains no diff")
        return out


def digest_of(items: list[tuple[str, bytes]]) -> str:
    h = hashlib.sha256()
    for name, data in items:
        h.update(name.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    return "sha256:" + h.hexdigest()


def series_dir(version: str, root: Path = PATCHES_DIR) -> Path:
    return Path(root) / f"vllm-{version}"


def read_series(version: str, root: Path = PATCHES_DIR) -> Series:
    d = series_dir(version, root)
    f = d / SERIES_NAME
    if not f.is_file():
        raise SeriesError(f"{f}: missing (every VERSIONS entry needs a patches/vllm-<version>/series)")
    revision: int | None = None
    digest: str | None = None
    patches: list[str] = []
    for lineno, raw in enumerate(f.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("revision:"):
            try:
                revision = int(line.split(":", 1)[1])
            except ValueError:
                raise SeriesError(f"{f}:{lineno}: bad revision {line!r}") from None
        elif line.startswith("digest:"):
            digest = line.split(":", 1)[1].strip()
        elif _PATCH_NAME_RE.match(line):
            if line in patches:
                raise SeriesError(f"{f}:{lineno}: {line} listed twice")
            patches.append(line)
        else:
            raise SeriesError(f"{f}:{lineno}: expected 'revision: N', 'digest: ...' or NNNN-name.patch")
    if revision is None:
        raise SeriesError(f"{f}: no 'revision: N' line")
    return Series(version, d, revision, digest, patches)


def write_series(version: str, revision: int, patches: list[tuple[str, bytes]], root: Path = PATCHES_DIR) -> Series:
    """Write the patch files and the series file; remove .patch files no longer listed."""
    d = series_dir(version, root)
    d.mkdir(parents=True, exist_ok=True)
    names = [n for n, _ in patches]
    for old in d.glob("*.patch"):
        if old.name not in names:
            old.unlink()
    for name, data in patches:
        p = d / name
        if not p.exists() or p.read_bytes() != data:
            p.write_bytes(data)
    digest = digest_of(patches)
    lines = [
        f"# S4 KV patch series over vLLM {version} (upstream = the Python tree of its published wheel).",
        f"# Written by `nox -s patches-export -- {version}`. revision is N in {version}+{LOCAL_LABEL}.<N>;",
        "# it is bumped whenever the exported patches differ (digest = sha256 of names + bytes).",
        f"revision: {revision}",
        f"digest: {digest}",
        *names,
    ]
    (d / SERIES_NAME).write_text("\n".join(lines) + "\n")
    return Series(version, d, revision, digest, names)


def bump(version: str, root: Path = PATCHES_DIR) -> Series:
    """Re-record the digest of hand-edited patches, bumping the revision if it changed."""
    s = read_series(version, root)
    items = [(p.name, p.read_bytes()) for p in s.paths]
    if digest_of(items) == s.digest:
        return s
    return write_series(version, s.revision + 1, items, root)


# --------------------------------------------------------------------------- patch files

_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")


@dataclass
class Hunk:
    index: int  # 1-based within its file, as git apply -v numbers them
    header: str  # the full "@@ -a,b +c,d @@ section" line
    old_start: int
    old_len: int
    new_start: int
    new_len: int


@dataclass
class FileDiff:
    old: str | None  # path without a/ prefix; None for a new file
    new: str | None  # None for a deleted file
    hunks: list[Hunk] = field(default_factory=list)

    @property
    def path(self) -> str:
        return self.new or self.old or ""


@dataclass
class PatchInfo:
    subject: str
    why: str
    files: list[FileDiff]

    def file(self, path: str) -> FileDiff | None:
        for f in self.files:
            if path in (f.old, f.new):
                return f
        return None

    def touched(self) -> set[str]:
        return {p for f in self.files for p in (f.old, f.new) if p}


def _strip_prefix(p: str) -> str | None:
    p = p.split("\t", 1)[0]
    if p == "/dev/null":
        return None
    return p[2:] if p[:2] in ("a/", "b/") else p


def parse_patch(text: str) -> PatchInfo:
    lines = text.splitlines()
    subject = ""
    i = 0
    # mail header: up to the first blank line
    while i < len(lines) and lines[i].strip():
        if lines[i].startswith("Subject:"):
            subject = lines[i][len("Subject:"):].strip()
            while i + 1 < len(lines) and lines[i + 1][:1] in (" ", "\t"):
                i += 1
                subject += " " + lines[i].strip()
        i += 1
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)
    body: list[str] = []
    i += 1
    while i < len(lines) and lines[i] != "---" and not lines[i].startswith("diff --git "):
        body.append(lines[i])
        i += 1
    files: list[FileDiff] = []
    cur: FileDiff | None = None
    for line in lines[i:]:
        if line.startswith("diff --git "):
            m = re.match(r"^diff --git a/(\S+) b/(\S+)$", line)
            cur = FileDiff(m.group(1), m.group(2)) if m else FileDiff(None, None)
            files.append(cur)
        elif cur is None:
            continue
        elif line.startswith("new file mode"):
            cur.old = None
        elif line.startswith("deleted file mode"):
            cur.new = None
        elif line.startswith("--- ") and not cur.hunks:
            cur.old = _strip_prefix(line[4:])
        elif line.startswith("+++ ") and not cur.hunks:
            cur.new = _strip_prefix(line[4:])
        elif line.startswith("@@ "):
            m = _HUNK_RE.match(line)
            if m:
                cur.hunks.append(
                    Hunk(
                        len(cur.hunks) + 1,
                        line,
                        int(m.group(1)),
                        int(m.group(2) or 1),
                        int(m.group(3)),
                        int(m.group(4) or 1),
                    )
                )
    return PatchInfo(subject, "\n".join(body).strip(), files)


def slug(subject: str, limit: int = 52) -> str:
    """File-name slug of a commit subject (like git format-patch's, lower-cased)."""
    s = re.sub(r"[^a-z0-9._]+", "-", subject.lower()).strip("-.")
    return s[:limit].rstrip("-.") or "patch"
