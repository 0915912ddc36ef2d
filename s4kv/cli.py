"""The `s4kv` console script: subcommands dispatch to their modules.

    s4kv validate MODEL   can int4_kivi serve this model? (s4kv.validation)
    s4kv bench ...        KV-cache dtypes side by side (s4kv.bench.cli)
    s4kv demo             serve SmolLM2 with int4_kivi here, next to bf16 (s4kv.demo)
"""

from __future__ import annotations

import sys

COMMANDS = {
    "validate": "can int4_kivi serve this model? exit 0 yes, 1 no (with the reasons), 75 hub unreachable",
    "bench": "KV-cache dtypes side by side: capacity, speed, quality, serving at a latency SLO",
    "demo": "serve SmolLM2 with int4_kivi on this machine: an answer, and its KV capacity next to bf16's",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: s4kv {" + ",".join(COMMANDS) + "} ...\n")
        for name, what in COMMANDS.items():
            print(f"  {name:<10} {what}")
        return 0 if argv[:1] in ([], ["-h"], ["--help"]) else 2
    if argv[0] == "validate":
        from s4kv.validation import main as validate_main

        return validate_main(argv[1:])
    if argv[0] == "demo":
        from s4kv.demo import main as demo_main

        return demo_main(argv[1:])
    missing = missing_modules(BENCH_EXTRA)
    if missing:
        print(f"s4kv bench needs its optional dependencies: pip install 's4kv[bench]' "
              f"(missing: {', '.join(missing)})", file=sys.stderr)
        return 1
    from s4kv.bench.cli import main as bench_main

    return bench_main(argv[1:])


# The modules of pyproject.toml's `bench` extra (tests/test_cli.py keeps the two in step).
BENCH_EXTRA = ("matplotlib", "tqdm")


def missing_modules(names) -> list[str]:
    """The modules among `names` that are not installed here (found without importing them)."""
    import importlib.util

    missing = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except ValueError:  # in sys.modules as None: made unimportable
            found = False
        if not found:
            missing.append(name)
    return missing


if __name__ == "__main__":
    sys.exit(main())
