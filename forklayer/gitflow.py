"""patches-edit / patches-export / port: the series as ordinary git commits (needs gitpython).

- ``edit``: ``.work/vllm-<version>`` = git repo whose first commit "vllm <version> upstream"
  (tag ``upstream``) is the Python text tree of the first build's wheel, with fixed author,
  committer and date (so its sha is reproducible); the series is applied on top with
  ``git am`` (one commit per patch, author and date from the patch).
- ``export``: ``git format-patch`` of ``upstream..HEAD`` back into ``patches/vllm-<version>/``
  with stable names (``NNNN-<subject slug>.patch``), zero From-shas, no signature, no
  numbering and full blob ids; the revision is bumped only when the bytes differ.
- ``port``: the newest series tried on another upstream release with 3-way merges; a report.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import git

from . import PATCHES_DIR, WORK_DIR
from .series import SeriesError, parse_patch, read_series, series_dir, slug, write_series
from .upstream import iter_tree, upstream_wheel
from .versions import Pin, get_pin, load_versions

FIXED_NAME = "S4 KV fork layer"
FIXED_EMAIL = "fork-layer@s4kv.invalid"
FIXED_DATE = "1767225600 +0000"  # 2026-01-01T00:00:00Z

#: no user/system git config (diff.noprefix, format.signature ... would change the output)
ISOLATED = {"GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
COMMITTER = {"GIT_COMMITTER_NAME": FIXED_NAME, "GIT_COMMITTER_EMAIL": FIXED_EMAIL, "GIT_COMMITTER_DATE": FIXED_DATE}
AUTHOR = {"GIT_AUTHOR_NAME": FIXED_NAME, "GIT_AUTHOR_EMAIL": FIXED_EMAIL, "GIT_AUTHOR_DATE": FIXED_DATE}


class FlowError(RuntimeError):
    pass


def _repo(path: Path) -> git.Repo:
    repo = git.Repo(path)
    repo.git.update_environment(**ISOLATED, **COMMITTER)
    return repo


def _write_tree(root: Path, wheel: Path) -> int:
    n = 0
    for name, data, executable in iter_tree(wheel):
        f = root / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
        if executable:
            f.chmod(0o755)
        n += 1
    return n


def _commit_all(repo: git.Repo, message: str) -> str:
    repo.git.add("-A")
    with repo.git.custom_environment(**AUTHOR):
        repo.git.commit("-q", "--allow-empty", "-m", message)
    return repo.head.commit.hexsha


def layout_upstream(repo_dir: Path, wheel: Path, version: str) -> git.Repo:
    """Init ``repo_dir`` with one commit "vllm <version> upstream" (tag ``upstream``)."""
    if repo_dir.exists() and any(repo_dir.iterdir()):
        raise FlowError(f"{repo_dir}: exists and is not empty")
    repo_dir.mkdir(parents=True, exist_ok=True)
    with git.Git().custom_environment(**ISOLATED):
        git.Repo.init(repo_dir, initial_branch="main")
    repo = _repo(repo_dir)
    n = _write_tree(repo_dir, wheel)
    _commit_all(repo, f"vllm {version} upstream\n\nPython text tree of {wheel.name} ({n} files).")
    repo.git.tag("upstream")
    return repo


def am(repo: git.Repo, patch: Path, three_way: bool = True) -> tuple[bool, str]:
    args = ["--3way"] if three_way else []
    status, out, err = repo.git.am(
        *args, "--whitespace=nowarn", str(patch.resolve()), with_extended_output=True, with_exceptions=False
    )
    return status == 0, out + err


# --------------------------------------------------------------------------- edit / export


def edit(
    version: str,
    *,
    force: bool = False,
    build: str | None = None,
    work_dir: Path = WORK_DIR,
    patches_root: Path = PATCHES_DIR,
) -> Path:
    """Materialize the edit repo (upstream of ``build``, default the first listed, + series)."""
    pin = get_pin(version)
    series = read_series(version, patches_root)
    for problem in series.problems():
        print(f"warning: {problem}")
    repo_dir = Path(work_dir) / f"vllm-{version}"
    if repo_dir.exists():
        if not force:
            raise FlowError(
                f"{repo_dir} already exists. Export it (nox -s patches-export -- {version}) or "
                f"recreate it with --force (discards its commits)."
            )
        shutil.rmtree(repo_dir)
    wheel = upstream_wheel(build or pin.edit_build, version)
    repo = layout_upstream(repo_dir, wheel, version)
    for p in series.paths:
        ok, out = am(repo, p)
        if not ok:
            raise FlowError(
                f"{p.name} does not apply in {repo_dir} (git am stopped there):\n{out.strip()}\n"
                f"Resolve it there (edit, git add, git am --continue), then run patches-export."
            )
    print(f"{repo_dir}: vllm {version} ({wheel.name}) + {len(series.patches)} patch(es), revision {series.revision}")
    print(repo.git.log("--oneline", "-n", str(len(series.patches) + 1)))
    print(
        f"Edit with ordinary git there (commit, commit --amend, rebase -i upstream; the commit message"
        f" body is the patch's why-header), then: nox -s patches-export -- {version}"
    )
    return repo_dir


def format_patch(repo: git.Repo, sha: str) -> bytes:
    return repo.git.format_patch(
        "-1", sha, "--stdout", "--zero-commit", "--no-signature", "--no-numbered", "--full-index",
        "--no-renames",
        stdout_as_string=False, strip_newline_in_stdout=False,
    )


def export(version: str, *, work_dir: Path = WORK_DIR, patches_root: Path = PATCHES_DIR) -> tuple[bool, int]:
    """Write the edit repo's commits back as the series. Returns (changed, revision)."""
    get_pin(version)
    repo_dir = Path(work_dir) / f"vllm-{version}"
    if not (repo_dir / ".git").is_dir():
        raise FlowError(f"{repo_dir}: no edit repo; run nox -s patches-edit -- {version} first")
    repo = _repo(repo_dir)
    if (repo_dir / ".git" / "rebase-apply").exists() or (repo_dir / ".git" / "rebase-merge").exists():
        raise FlowError(f"{repo_dir}: a git am/rebase is in progress; finish it first")
    if repo.is_dirty(untracked_files=False):
        raise FlowError(f"{repo_dir}: uncommitted changes; commit them (or stash) before exporting")
    if repo.git.rev_list("--merges", "upstream..HEAD").strip():
        raise FlowError(f"{repo_dir}: merge commits in upstream..HEAD; the series must be linear")
    shas = repo.git.rev_list("--reverse", "upstream..HEAD").split()
    items: list[tuple[str, bytes]] = []
    for i, sha in enumerate(shas, 1):
        c = repo.commit(sha)
        body = c.message.split("\n", 1)[1].strip() if "\n" in c.message else ""
        if not body:
            raise FlowError(f"commit {sha[:12]} ({c.summary!r}) has no why-header: add a message body saying why")
        data = format_patch(repo, sha)
        if not parse_patch(data.decode("utf-8", "replace")).files:
            raise FlowError(f"commit {sha[:12]} ({c.summary!r}) changes nothing")
        items.append((f"{i:04d}-{slug(c.summary)}.patch", data))
    try:
        old = read_series(version, patches_root)
    except SeriesError:
        old = None
    from .series import digest_of

    if old is not None and old.digest == digest_of(items):
        print(f"patches/vllm-{version}: unchanged ({len(items)} patch(es), revision {old.revision})")
        return False, old.revision
    revision = (old.revision + 1) if old is not None else 1
    write_series(version, revision, items, patches_root)
    print(f"patches/vllm-{version}: wrote {len(items)} patch(es), revision {revision} -> {version}+s4kv.{revision}")
    for name, _ in items:
        print(f"  {name}")
    return True, revision


# --------------------------------------------------------------------------- port

_CHECKING_RE = re.compile(r"^Checking patch (.+)\.\.\.$")
_HUNK_OK_RE = re.compile(r"^Hunk #(\d+) succeeded at (\d+)(?: \(offset (-?\d+) lines?\))?\.")


@dataclass
class PortResult:
    patch: str
    result: str  # clean | offset | merged | conflict
    details: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


def _failed_hunks(out: str, patch: Path) -> list[str]:
    info = parse_patch(patch.read_text())
    found = []
    for m in re.finditer(r"patch failed: (.+):(\d+)$", out, re.MULTILINE):
        fd = info.file(m.group(1))
        hunk = next((h for h in fd.hunks if h.old_start == int(m.group(2))), None) if fd else None
        what = f"hunk #{hunk.index} {hunk.header}" if hunk else f"hunk at line {m.group(2)}"
        found.append(f"{m.group(1)}: {what}: context changed upstream")
    return found


def _offsets(out: str) -> list[str]:
    cur = "?"
    found = []
    for line in out.splitlines():
        m = _CHECKING_RE.match(line.strip())
        if m:
            cur = m.group(1)
            continue
        m = _HUNK_OK_RE.match(line.strip())
        if m and m.group(3):
            found.append(f"{cur}: hunk #{m.group(1)} at line {m.group(2)} (offset {m.group(3)})")
    return found


def port(
    new_version: str,
    *,
    base: str | None = None,
    build: str | None = None,
    work_dir: Path = WORK_DIR,
    patches_root: Path = PATCHES_DIR,
) -> tuple[str, list[PortResult]]:
    """Returns (base version, per-patch results)."""
    pins = load_versions()
    if base:
        base_pin = get_pin(base, pins)
    else:
        with_series = [p for p in pins if (series_dir(p.version, patches_root) / "series").is_file()]
        if not with_series:
            raise FlowError("no series to port")
        base_pin = max(with_series, key=lambda p: p.key)
    series = read_series(base_pin.version, patches_root)
    build = build or base_pin.edit_build
    base_wheel = upstream_wheel(base_pin.edit_build, base_pin.version)
    new_wheel = upstream_wheel(build, new_version)
    results = port_wheels(base_pin, series.paths, base_wheel, new_wheel, new_version,
                          Path(work_dir) / f"port-{new_version}")
    return base_pin.version, results


def port_wheels(base_pin: Pin, patches: list[Path], base_wheel: Path, new_wheel: Path, new_version: str,
                repo_dir: Path) -> list[PortResult]:
    shutil.rmtree(repo_dir, ignore_errors=True)
    repo = layout_upstream(repo_dir, base_wheel, base_pin.version)
    # The new release as a child of the old one: the old blobs stay in the object store, so
    # `git am --3way` can really merge (the patches carry full preimage blob ids).
    for child in repo_dir.iterdir():
        if child.name != ".git":
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    _write_tree(repo_dir, new_wheel)
    _commit_all(repo, f"vllm {new_version} upstream\n\nPython text tree of {new_wheel.name}.")
    repo.git.tag("new-upstream")
    results = []
    for p in patches:
        status, out, err = repo.git.apply("--check", "-v", str(p.resolve()), with_extended_output=True,
                                          with_exceptions=False)
        direct_ok = status == 0
        offsets = _offsets(out + "\n" + err)
        failed = [] if direct_ok else _failed_hunks(out + "\n" + err, p)
        ok, am_out = am(repo, p, three_way=True)
        if ok:
            kind = ("offset" if offsets else "clean") if direct_ok else "merged"
            details = offsets + failed + ([] if direct_ok else ["-> git am --3way merged it without conflicts"])
            results.append(PortResult(p.name, kind, details, sorted(parse_patch(p.read_text()).touched())))
            continue
        conflicted = repo.git.diff("--name-only", "--diff-filter=U").split()
        if not conflicted:  # e.g. file gone upstream: take the names from git's errors
            conflicted = sorted({m.group(1) for m in re.finditer(r"error: (\S+?): ", am_out)})
        lines = [ln for ln in am_out.splitlines() if ln.startswith(("error:", "CONFLICT", "U "))]
        results.append(PortResult(p.name, "conflict", failed + lines[:6], conflicted))
        repo.git.am("--abort", with_exceptions=False)
    return results


def print_port_report(results: list[PortResult], base: str, new_version: str, repo_dir: Path) -> None:
    print(f"port: series of vllm {base} onto vllm {new_version} (scratch repo {repo_dir})")
    width = max([len(r.patch) for r in results] + [5])
    print(f"{'patch':<{width}}  {'result':<8}  files / details")
    for r in results:
        label = {"clean": "clean", "offset": "offset", "merged": "merged", "conflict": "CONFLICT"}[r.result]
        print(f"{r.patch:<{width}}  {label:<8}  {', '.join(r.files)}")
        for d in r.details:
            print(f"{'':<{width}}  {'':<8}    {d}")
    counts = {k: sum(r.result == k for r in results) for k in ("clean", "offset", "merged", "conflict")}
    print("summary: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
