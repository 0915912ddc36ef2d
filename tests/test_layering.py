"""The package's layering: kernels (s4kv.kernels) never import the vLLM backend (s4kv.backend),
which composes them; the backend may import the kernels. An import from the other direction
made a circle once (kernels.selfcheck -> backend.metadata -> backend.impl -> kernels.selfcheck)."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "s4kv"


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (function-local imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_kernels_never_import_the_backend():
    offenders = {f"{p.relative_to(PKG)}: {m}" for p in (PKG / "kernels").glob("*.py") for m in _imports(p)
                 if m == "s4kv.backend" or m.startswith("s4kv.backend.")}
    assert not offenders, sorted(offenders)
