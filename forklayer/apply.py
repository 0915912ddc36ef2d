"""Apply a patch series to a plain directory tree with ``git apply`` (no repository, no gitpython).

This is the one code path that puts the series onto files, used by:

- the wheel build (onto a scratch tree holding the files the series touches),
- ``patches-check`` (same, for every VERSIONS entry and build),
- an offline machine patching an installed vLLM:
  ``python -m forklayer apply --vllm 0.24.0 --target /path/to/site-packages``.

Two modes:

- ``strict`` (build, check): every patch must apply forward to the pristine upstream.
- idempotent (the ``apply`` CLI): the leading patches that are already there (detected by
  reverse-applying them on a scratch copy) are skipped, so re-running is a no-op and a
  half-applied series is completed.

A failure names the patch file, the target file and the hunk (number and ``@@`` header).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .series import PatchInfo, parse_patch


class PatchError(RuntimeError):
    pass


def git_env(target: Path) -> dict[str, str]:
    """Environment for git commands on ``target``: no user/system config, no repo discovery above it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env["GIT_CONFIG_GLOBAL"] = os.devnull
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    # git apply inside a repository applies relative to the repository top and silently skips
    # paths outside the cwd; a site-packages inside some checkout must be treated as a plain tree.
    env["GIT_CEILING_DIRECTORIES"] = str(Path(target).resolve().parent)
    return env


def git_binary() -> str:
    git = shutil.which("git")
    if not git:
        raise PatchError("the `git` binary is needed to apply patches (git apply works outside a repo)")
    return git


def git_apply(target: Path, patch: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [git_binary(), "apply", "--whitespace=nowarn", *args, str(Path(patch).resolve())]
    return subprocess.run(
        cmd, cwd=target, env=git_env(target), capture_output=True, text=True, check=False
    )


_FAILED_RE = re.compile(r"patch failed: (.+):(\d+)$")
_ERR_FILE_RE = re.compile(r"^error: (?:(.+?): )?(.+)$")


def explain_failure(patch: Path, info: PatchInfo, git_output: str) -> str:
    """A message naming patch file, target file(s) and hunk(s) from ``git apply -v`` output."""
    lines = [f"{patch}: does not apply"]
    named = False
    for line in git_output.splitlines():
        m = _FAILED_RE.search(line)
        if m:
            path, line_no = m.group(1), int(m.group(2))
            fd = info.file(path)
            hunk = None
            if fd:
                hunk = next((h for h in fd.hunks if h.old_start == line_no), None)
                if hunk is None:  # fall back to the nearest hunk at or before the line
                    cands = [h for h in fd.hunks if h.old_start <= line_no]
                    hunk = cands[-1] if cands else None
            where = f"hunk #{hunk.index} {hunk.header}" if hunk else f"hunk at line {line_no}"
            lines.append(f"  file {path}: {where}")
            named = True
        elif line.startswith("error: ") and "patch does not apply" not in line and "while searching" not in line:
            m2 = _ERR_FILE_RE.match(line)
            if m2 and m2.group(1):
                lines.append(f"  file {m2.group(1)}: {m2.group(2)}")
                named = True
    if not named:
        lines.append("  (git apply gave no file/hunk; its output follows)")
    lines.append("  git apply said:")
    lines.extend("    " + ln for ln in git_output.strip().splitlines())
    return "\n".join(lines)


@dataclass
class Applied:
    patch: Path
    action: str  # "applied" | "already applied" | "ok" (check only)


def _copy_touched(target: Path, rels: set[str], dest: Path) -> None:
    for rel in rels:
        src = target / rel
        if src.is_file():
            out = dest / rel
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out)


def applied_prefix(target: Path, patches: list[Path]) -> int:
    """How many leading patches of the series are already in ``target`` (0..len).

    A later patch may change the context of an earlier one, so "patch k is applied" is tested as
    "patches k..1 reverse-apply, in that order" on a scratch copy of the touched files.
    """
    rels = touched_files(patches)
    for k in range(len(patches), 0, -1):
        with tempfile.TemporaryDirectory(prefix="s4kv-rev-") as tmp:
            scratch = Path(tmp)
            _copy_touched(target, rels, scratch)
            if all(git_apply(scratch, p, "-R").returncode == 0 for p in reversed(patches[:k])):
                return k
    return 0


def _apply_forward(target: Path, patches: list[Path]) -> None:
    for patch in patches:
        info = parse_patch(patch.read_text())
        res = git_apply(target, patch, "-v")
        if res.returncode != 0:  # git apply is all-or-nothing per patch: nothing was written
            raise PatchError(explain_failure(patch, info, res.stdout + res.stderr))


def apply_series(
    target: Path,
    patches: list[Path],
    *,
    strict: bool = True,
    check_only: bool = False,
) -> list[Applied]:
    """Apply ``patches`` in order to the tree at ``target``.

    strict: every patch must apply forward (a pristine upstream is expected). Otherwise the
    leading patches that are already there are skipped (see ``applied_prefix``) and the rest is
    applied, so a re-run changes nothing and a half-applied series is completed.
    check_only: do it on a scratch copy of the touched files; ``target`` is not written.
    """
    target = Path(target)
    patches = [Path(p) for p in patches]
    if not target.is_dir():
        raise PatchError(f"{target}: not a directory")
    k = 0 if strict else applied_prefix(target, patches)
    done = [Applied(p, "already applied") for p in patches[:k]]
    rest = patches[k:]
    try:
        if check_only:
            with tempfile.TemporaryDirectory(prefix="s4kv-check-") as tmp:
                _copy_touched(target, touched_files(patches), Path(tmp))
                _apply_forward(Path(tmp), rest)
        else:
            _apply_forward(target, rest)
    except PatchError as e:
        if k:
            raise PatchError(f"{e}\n  (the first {k} patch(es) of the series were already applied)") from None
        raise
    return done + [Applied(p, "ok" if check_only else "applied") for p in rest]


def touched_files(patches: list[Path]) -> set[str]:
    out: set[str] = set()
    for p in patches:
        out |= parse_patch(Path(p).read_text()).touched()
    return out


def compile_errors(target: Path, paths: set[str] | list[str]) -> list[str]:
    """Byte-compile (in memory) every existing ``.py`` among ``paths``; return the errors."""
    errors = []
    for rel in sorted(paths):
        f = Path(target) / rel
        if rel.endswith(".py") and f.is_file():
            try:
                compile(f.read_bytes(), rel, "exec", dont_inherit=True)
            except SyntaxError as e:
                errors.append(f"{rel}:{e.lineno}: {e.msg}")
    return errors


def find_installed_vllm_root() -> Path:
    """The directory holding the installed ``vllm`` package (without importing vllm)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError("vllm is not installed in this interpreter; pass --target")
    return Path(next(iter(spec.submodule_search_locations))).parent
