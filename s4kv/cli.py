"""The `s4kv` console script: subcommands dispatch to their modules.

    s4kv bench ...      KV-cache dtypes side by side (s4kv.bench.cli)
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {"bench": "KV-cache dtypes side by side: capacity, speed, quality"}
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print("usage: s4kv {" + ",".join(commands) + "} ...\n")
        for name, what in commands.items():
            print(f"  {name:<10} {what}")
        return 0 if argv[:1] in ([], ["-h"], ["--help"]) else 2
    if argv[0] == "bench":
        from s4kv.bench.cli import main as bench_main

        return bench_main(argv[1:])
    return 2


if __name__ == "__main__":
    sys.exit(main())
