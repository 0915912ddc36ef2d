"""The GPU's distances for test_int8_key_dots_against_their_roundings (one and two int8 terms): the
kernel's row against its own roundings, against bf16 operands, against no rounding, and against the
fp32 reference, for each case and split count, so that the test's bounds can be set from them.
    PYTHONPATH=.:tests python3 docs/results/gpu-2026-12-07-sixteenth/int8_errors.py
int8_errors.txt came from f931f4f's tree (INT8_KEYS 1 and 2, with TERMS=1,2 then the default); two
terms were removed after it, so the default is now TERMS=1."""
import os

import pytest
import torch
from operand_roundings import decode_row_with_operand_roundings
from test_kernels import BS, _engine, _set_launch, relative_error

from s4kv.kernels import decode

for terms in [int(t) for t in os.environ.get("TERMS", "1").split(",")]:
    for q_scale in (1, 8):
        for d, hq in ((64, 7), (128, 8)):
            with pytest.MonkeyPatch.context() as mp:
                _set_launch(mp, {("decode", d): {"INT8_KEYS": terms}})
                e = _engine(hq, 1, d, torch.bfloat16, num_blocks=16)
                e.add("a", 5 * BS + 3)
                e.reqs["a"]["q"] *= q_scale
                e.step([("a", 5 * BS + 2)])
                orig = decode.num_splits
                for splits in (1, 3, 8):
                    mp.setattr(decode, "num_splits", lambda *a, s=splits, **k: s)
                    out, ctx = e.step([("a", 1)])["a"]
                    r = e.reqs["a"]
                    q, k, v = r["q"][ctx:ctx + 1], r["k"][:ctx + 1], r["v"][:ctx + 1]
                    row = {n: decode_row_with_operand_roundings(q, k, v, d ** -0.5, dt, t)
                           for n, dt, t in (("own", torch.bfloat16, terms), ("bf16", torch.bfloat16, 0),
                                            ("none", torch.float32, 0))}
                    print(f"terms {terms} q x{q_scale} d {d} hq {hq} splits {splits}: "
                          + " ".join(f"{n} {relative_error(out, x):.2e}" for n, x in row.items()), flush=True)
                    e.reqs["a"]["done"] -= 1
