"""port: classify each patch as clean / offset / merged (3-way) / conflict, on synthetic releases."""

import pytest

from forklayer.testing import CACHE_PY, TORCH_UTILS_PY, make_wheel, sample_files
from forklayer.versions import Pin

PATCH_CACHE = """From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: T <t@example.invalid>
Date: Sun, 29 Nov 2026 12:00:00 +0000
Subject: [PATCH] accept int4_kivi

Why: test.
---
diff --git a/vllm/config/cache.py b/vllm/config/cache.py
index {old}..{new} 100644
--- a/vllm/config/cache.py
+++ b/vllm/config/cache.py
@@ -5,6 +5,7 @@ CacheDType = Literal[
     "bfloat16",
     "fp8",
     "nvfp4",
+    "int4_kivi",
 ]
 
 
"""


def _blob(data: bytes) -> str:
    import hashlib

    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@pytest.fixture
def setup(tmp_path):
    pytest.importorskip("git")
    base = make_wheel(tmp_path / "base", "vllm", "0.32.0")
    patched = CACHE_PY.replace('    "nvfp4",\n', '    "nvfp4",\n    "int4_kivi",\n')
    p1 = tmp_path / "0001-accept-int4_kivi.patch"
    p1.write_text(PATCH_CACHE.format(old=_blob(CACHE_PY.encode()), new=_blob(patched.encode())))
    p2 = tmp_path / "0002-untouched-file.patch"
    p2.write_text(
        "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\nFrom: T <t@x.invalid>\n"
        "Subject: [PATCH] second\n\nWhy: test.\n---\ndiff --git a/vllm/utils/torch_utils.py b/vllm/utils/torch_utils.py\n"
        "--- a/vllm/utils/torch_utils.py\n+++ b/vllm/utils/torch_utils.py\n@@ -1,3 +1,4 @@\n import torch\n"
        "+import os\n \n STR_DTYPE_TO_TORCH_DTYPE = {\n"
    )
    return tmp_path, base, [p1, p2]


def _port(tmp_path, base, patches, cache_py: str, name: str, torch_utils: str = TORCH_UTILS_PY):
    from forklayer.gitflow import port_wheels

    files = sample_files("0.33.0")
    files["vllm/config/cache.py"] = cache_py.encode()
    files["vllm/utils/torch_utils.py"] = torch_utils.encode()
    new = make_wheel(tmp_path / name, "vllm", "0.33.0", files)
    return port_wheels(Pin("0.32.0", ("vllm",), "2.13.0"), patches, base, new, "0.33.0", tmp_path / f"port-{name}")


def test_clean(setup):
    tmp_path, base, patches = setup
    res = _port(tmp_path, base, patches, CACHE_PY, "clean")
    assert [r.result for r in res] == ["clean", "clean"]
    assert res[0].files == ["vllm/config/cache.py"]


def test_offset(setup):
    tmp_path, base, patches = setup
    res = _port(tmp_path, base, patches, "# one\n# two\n" + CACHE_PY, "offset")
    assert [r.result for r in res] == ["offset", "clean"]
    assert res[0].details == ["vllm/config/cache.py: hunk #1 at line 7 (offset 2)"]


def test_merged_when_context_changed(setup):
    tmp_path, base, patches = setup
    new = CACHE_PY.replace("]\n\n\ndef f", "]\n\n# new upstream comment\ndef f")
    res = _port(tmp_path, base, patches, new, "merged")
    assert res[0].result == "merged"
    assert any("hunk #1 @@ -5,6 +5,7 @@" in d for d in res[0].details)


def test_conflict_names_files_and_continues(setup):
    tmp_path, base, patches = setup
    new = CACHE_PY.replace('    "nvfp4",\n', '    "nvfp4",\n    "upstream_new",\n')
    res = _port(tmp_path, base, patches, new, "conflict")
    assert res[0].result == "conflict" and res[0].files == ["vllm/config/cache.py"]
    assert res[1].result == "clean"  # the next patch is still tried


def test_report_prints(setup, capsys):
    from forklayer.gitflow import print_port_report

    tmp_path, base, patches = setup
    res = _port(tmp_path, base, patches, "# x\n" + CACHE_PY, "report")
    print_port_report(res, "0.32.0", "0.33.0", tmp_path)
    out = capsys.readouterr().out
    assert "0001-accept-int4_kivi.patch" in out and "offset" in out and "summary: 1 clean, 1 offset" in out
