#!/usr/bin/env python3
"""Host time of a step's launch plan: s4kv's per-step Python on top of vLLM's metadata.

    python3 tools/plan_time.py [--source CHECKOUT ...] [--repeat 200]

Every step with a chunk row (prefill, chunked prefill, prefix-cache extends) plans its chunk
attention once on the host (s4kv.kernels.chunk_plan.plan_chunks, then one upload: to_device, here
to the CPU) and every step fills the launch shapes (s4kv.kernels.batch.plan_launch). That is
Python in the step's critical path, paid before the step's first kernel is issued, on the engine's
host. Pure host arithmetic: this machine measures it; its absolute times are this CPU's, the ratio
between two trees in one run is the signal.

Batches (context before the step, new tokens; one entry per row):
  mixed 31 x 8k + 2048 @ 30k   31 decode rows at 8k and a 2,048-token chunk after 30,720 cached
  chunk 2048 @ 6144           an 8k prompt's last chunk
  60 x 1.5k + 4 prompts of 1k a 1k/1k serving step: decodes with a few new prompts
  16 prompts of 1k            a prefill step of sixteen 1k prompts
  8k chunk @ 16k + 8k prompt  two long rows

--source: time another checkout's s4kv (its directory with the s4kv package) in the same run,
next to this one (each in a subprocess of its own, alternating, best of the repeats).
"""

from __future__ import annotations

import argparse
import json
import sys

from tree_timing import best_of_trees

BATCHES = {
    "mixed 31 x 8k + 2048 @ 30k": [(8192, 1)] * 31 + [(30720, 2048)],
    "chunk 2048 @ 6144": [(6144, 2048)],
    "60 x 1.5k + 4 prompts of 1k": [(1500, 1)] * 60 + [(0, 1024)] * 4,
    "16 prompts of 1k": [(0, 1024)] * 16,
    "8k chunk @ 16k + 8k prompt": [(16384, 8192), (0, 8192)],
}
CAPACITY = 2000  # scratch pages (an engine's: scratch_pages(max_model_len, max_num_batched_tokens))
KV_HEADS, SMS = 8, 132

_CHILD = r"""
import json, sys, timeit
import numpy as np, torch
from s4kv.kernels.batch import S4KVMetadata, plan_launch
from s4kv.kernels.chunk_plan import plan_chunks, to_device
import os, s4kv
print(f"    s4kv from {os.path.dirname(s4kv.__file__)}", file=sys.stderr)  # tools/tree_timing.py passes it on
batches, repeat, capacity, kv_heads, sms = json.loads(sys.argv[1])
out = {}
for name, rows in batches.items():
    qsl = np.cumsum([0] + [n for _, n in rows]).astype(np.int32)
    seq = np.array([c + n for c, n in rows], dtype=np.int32)
    first = sum(1 for _, n in rows if n == 1)  # decodes come first, as the runner orders them
    md = S4KVMetadata(len(rows), int(qsl[-1]), int(np.diff(qsl).max()), int(seq.max()), None, None, None,
                      torch.from_numpy(qsl), torch.from_numpy(seq))
    def chunks():
        to_device(plan_chunks(qsl, seq, first, capacity), "cpu")
    def launch():
        plan_launch(md, kv_heads, sms)
    out[name] = [min(timeit.repeat(f, number=repeat, repeat=5)) / repeat * 1e6 for f in (chunks, launch)]
print(json.dumps(out))
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", action="append", default=[], help="another checkout to time next to this one")
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args(argv)
    best = best_of_trees(args.source, [sys.executable, "-c", _CHILD,
                                       json.dumps([BATCHES, args.repeat, CAPACITY, KV_HEADS, SMS])])
    cols = list(best)
    print("| batch | " + " | ".join(f"{c}: chunk plan + upload (µs) | {c}: launch shapes (µs)" for c in cols) + " |")
    print("|---|" + "---|---|" * len(cols))
    for b in BATCHES:
        print(f"| {b} | " + " | ".join(f"{best[c][b][0]:.1f} | {best[c][b][1]:.1f}" for c in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
