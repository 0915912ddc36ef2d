#!/usr/bin/env python3
"""The decode kernel bench's records as one table: per --json file of `python3 -m s4kv.kernels.bench`
and per point, the page kernel's profiler time, the decode call one per CUDA graph and with 8 layers
per graph, and the latter's share of the copy bandwidth measured in the same run.

    python3 tools/kernel_bench_table.py BENCH.json [...]

Results folders that compare trees or passes print their tables with it
(docs/results/gpu-h100-2026-12-06-page-loop-bound/summarize.py, docs/results/gpu-h200-2026-12-06-ninth/).
"""

import json
import sys
from pathlib import Path

HEADER = ("file                         context batch  page kernel (us)  call, 1 per graph (us)  "
          "call, 8 layers per graph (us)  of copy (8 layers)")


def table(files) -> None:
    """Print the header and one line per point of each file, in the order given."""
    print(HEADER)
    for f in files:
        for r in json.loads(Path(f).read_text())["rows"]:
            print(f"{Path(f).stem:28s} {r['context']:7d} {r['batch']:5d}  {r['kernels_ms']['_decode_kernel'] * 1e3:16.1f}"
                  f"  {r['ms'] * 1e3:22.1f}  {r['layers_ms'] * 1e3:29.1f}  {r['layers_fraction_of_copy']:17.1%}")


if __name__ == "__main__":
    table(sys.argv[1:])
