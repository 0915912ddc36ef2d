"""S4 KV fork layer: build tooling for the patch series over pinned vLLM releases.

This package is *not* part of the ``s4kv`` wheel (pyproject only includes ``s4kv*``).
It is used by ``noxfile.py`` and can be run directly: ``python -m forklayer --help``.

Modules, by what they need:

- ``versions``, ``series``, ``apply``, ``wheel``, ``upstream``, ``build``: Python standard
  library plus the ``git`` binary (``git apply`` works outside a repository). ``apply`` is what
  an offline machine uses to patch an installed ``site-packages/`` (no gitpython there).
- ``gitflow`` (patches-edit / patches-export / port): needs gitpython.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PATCHES_DIR = REPO_ROOT / "patches"
VERSIONS_FILE = REPO_ROOT / "VERSIONS"
DIST_DIR = REPO_ROOT / "dist"
WORK_DIR = REPO_ROOT / ".work"

#: Local-version label of everything we build: ``<upstream version>+s4kv.<N>``.
LOCAL_LABEL = "s4kv"
