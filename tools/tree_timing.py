"""This checkout's s4kv timed next to other trees' (--source), for the host-time tools
(tools/plan_time.py, tools/launch_host_time.py): each tree in a subprocess of its own with its
s4kv first on sys.path, the trees alternated, each one's best kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def best_of_trees(sources: list[str], argv: list[str], rounds: int = 2) -> dict[str, dict]:
    """{tree: {key: best}} for this checkout ("this") and each of `sources`, in that order: `argv` run
    `rounds` times per tree, alternating; its last line of output is a JSON object of numbers or
    lists of numbers, kept element by element at their minimum. The child's first line on stderr
    (where it imported s4kv from) is passed on."""
    trees = {"this": ROOT, **{s: Path(s).resolve() for s in sources}}
    best: dict[str, dict] = {}
    for rnd in range(rounds):
        for name, path in trees.items():
            print(f"  timing {name} (round {rnd + 1} of {rounds})", file=sys.stderr, flush=True)
            # the tree's s4kv first: PYTHONPATH, and the working directory (`python -c` puts it first
            # on sys.path); compiled launches, never Triton's interpreter (the test suite sets it)
            env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "PYTHONPATH": str(path)}
            res = subprocess.run(argv, env=env, cwd=path, capture_output=True, text=True, check=False)
            if res.returncode:
                raise SystemExit(f"{name}: {res.stderr[-2000:]}")
            print(res.stderr.splitlines()[0] if res.stderr else "", file=sys.stderr, flush=True)
            t = json.loads(res.stdout.splitlines()[-1])
            best[name] = {k: _least(v, best[name][k]) for k, v in t.items()} if name in best else t
    return best


def _least(a, b):
    return [min(x, y) for x, y in zip(a, b)] if isinstance(a, list) else min(a, b)

