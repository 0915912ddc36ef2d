"""Applying a series to a plain tree with git apply: strict, idempotent, diagnostics, CLI."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from forklayer.apply import PatchError, apply_series, compile_errors, touched_files
from forklayer.testing import CACHE_PY, TORCH_UTILS_PY

PATCH_1 = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: T <t@example.invalid>
Date: Sun, 29 Nov 2026 12:00:00 +0000
Subject: [PATCH] accept int4_kivi

Why: test.
---
diff --git a/vllm/config/cache.py b/vllm/config/cache.py
--- a/vllm/config/cache.py
+++ b/vllm/config/cache.py
@@ -5,6 +5,7 @@ CacheDType = Literal[
     "bfloat16",
     "fp8",
     "nvfp4",
+    "int4_kivi",
 ]
 
 
diff --git a/vllm/utils/torch_utils.py b/vllm/utils/torch_utils.py
--- a/vllm/utils/torch_utils.py
+++ b/vllm/utils/torch_utils.py
@@ -4,4 +4,5 @@ STR_DTYPE_TO_TORCH_DTYPE = {
     "float32": torch.float,
     "fp8": torch.uint8,
     "nvfp4": torch.uint8,
+    "int4_kivi": torch.uint8,
 }
"""

PATCH_2 = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: T <t@example.invalid>
Date: Sun, 29 Nov 2026 12:00:00 +0000
Subject: [PATCH] second

Why: depends on the first.
---
diff --git a/vllm/config/cache.py b/vllm/config/cache.py
--- a/vllm/config/cache.py
+++ b/vllm/config/cache.py
@@ -6,6 +6,7 @@ CacheDType = Literal[
     "fp8",
     "nvfp4",
     "int4_kivi",
+    "int4_more",
 ]
 
 
"""


def make_tree(root: Path) -> Path:
    (root / "vllm/config").mkdir(parents=True)
    (root / "vllm/utils").mkdir(parents=True)
    (root / "vllm/config/cache.py").write_text(CACHE_PY)
    (root / "vllm/utils/torch_utils.py").write_text(TORCH_UTILS_PY)
    return root


@pytest.fixture
def patches(tmp_path):
    d = tmp_path / "patches"
    d.mkdir()
    (d / "0001-accept-int4_kivi.patch").write_text(PATCH_1)
    (d / "0002-second.patch").write_text(PATCH_2)
    return [d / "0001-accept-int4_kivi.patch", d / "0002-second.patch"]


def test_strict_apply_then_idempotent(tmp_path, patches):
    tree = make_tree(tmp_path / "site")
    done = apply_series(tree, patches, strict=True)
    assert [a.action for a in done] == ["applied", "applied"]
    text = (tree / "vllm/config/cache.py").read_text()
    assert '"int4_kivi",\n    "int4_more",' in text
    again = apply_series(tree, patches, strict=False)
    assert [a.action for a in again] == ["already applied", "already applied"]
    assert (tree / "vllm/config/cache.py").read_text() == text
    with pytest.raises(PatchError):  # strict: a patched tree is not pristine upstream
        apply_series(tree, patches, strict=True)
    assert compile_errors(tree, touched_files(patches)) == []


def test_half_applied_series_is_completed(tmp_path, patches):
    tree = make_tree(tmp_path / "site")
    apply_series(tree, patches[:1])
    done = apply_series(tree, patches, strict=False)
    assert [a.action for a in done] == ["already applied", "applied"]


def test_broken_patch_names_patch_file_and_hunk(tmp_path, patches):
    tree = make_tree(tmp_path / "site")
    broken = tmp_path / "0001-broken.patch"
    broken.write_text(PATCH_1.replace('     "fp8": torch.uint8,\n', '     "fp16": torch.uint8,\n'))
    with pytest.raises(PatchError) as e:
        apply_series(tree, [broken])
    msg = str(e.value)
    assert str(broken) in msg
    assert "vllm/utils/torch_utils.py" in msg
    assert "hunk #1 @@ -4,4 +4,5 @@ STR_DTYPE_TO_TORCH_DTYPE = {" in msg
    # nothing was written: git apply is all-or-nothing per patch
    assert "int4_kivi" not in (tree / "vllm/config/cache.py").read_text()


def test_missing_file_is_named(tmp_path, patches):
    tree = make_tree(tmp_path / "site")
    (tree / "vllm/utils/torch_utils.py").unlink()
    with pytest.raises(PatchError, match=r"file vllm/utils/torch_utils.py: No such file"):
        apply_series(tree, patches[:1])


def test_tree_inside_a_git_checkout(tmp_path, patches):
    """site-packages inside some git repo (e.g. a venv in a checkout) is still a plain tree."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    tree = make_tree(tmp_path / "venv" / "site")
    apply_series(tree, patches)
    assert "int4_more" in (tree / "vllm/config/cache.py").read_text()


def test_compile_errors(tmp_path):
    (tmp_path / "bad.py").write_text("def f(:\n")
    (tmp_path / "good.py").write_text("x = 1\n")
    errs = compile_errors(tmp_path, ["bad.py", "good.py", "missing.py"])
    assert len(errs) == 1 and errs[0].startswith("bad.py:1")


def test_cli_apply_idempotent(tmp_path, patches):
    root = tmp_path / "root"
    series = root / "vllm-0.32.0"
    series.mkdir(parents=True)
    for p in patches:
        shutil.copy(p, series / p.name)
    from forklayer.series import bump

    (series / "series").write_text("revision: 0\n" + "".join(p.name + "\n" for p in patches))
    assert bump("0.32.0", root).revision == 1
    tree = make_tree(tmp_path / "site")
    repo = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "forklayer", "--patches-root", str(root), "apply", "--vllm", "0.32.0",
           "--target", str(tree)]
    r1 = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, check=False)
    assert r1.returncode == 0, r1.stderr
    assert r1.stdout.count("applied ") == 2
    r2 = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, check=False)
    assert r2.returncode == 0, r2.stderr
    assert r2.stdout.count("already applied") == 2


def test_cli_apply_refuses_other_vllm_version(tmp_path):
    tree = make_tree(tmp_path / "site")
    (tree / "vllm/_version.py").write_text("__version__ = version = '0.24.0'\n")
    repo = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "forklayer", "apply", "--vllm", "0.32.0", "--target", str(tree)]
    r = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "is vLLM 0.24.0, not 0.32.0" in r.stderr
