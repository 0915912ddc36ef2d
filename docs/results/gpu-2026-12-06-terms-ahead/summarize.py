"""Print this folder's bench table from raw/: per bench log, the page kernel's profiler time at
8k x 32 and 32k x 8 (both rows: with the query rotation as its own launch and in the row kernel)
and the decode call per layer with 8 layers per CUDA graph (its share of the copy bandwidth).

    python3 docs/results/gpu-2026-12-06-terms-ahead/summarize.py
"""
import re
from pathlib import Path

ROW = re.compile(r"\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+\d+\s+([\d.]+)%.*\|\s+([\d.]+)\s+([\d.]+)%")

for f in sorted((Path(__file__).parent / "raw").glob("bench-*.log")):
    lines = f.read_text().splitlines()
    cells = []
    for i, line in enumerate(lines):
        m = ROW.match(line)
        if m:
            page = [re.search(r"_decode_kernel ([\d.]+)", lines[i + j]).group(1) for j in (1, 2)]
            cells.append(f"{m.group(1)}x{m.group(2)}: page {page[0]}/{page[1]} call8 {m.group(6)} ({m.group(7)}%)")
    print(f"{f.stem:24s}", " | ".join(cells))
