"""A minimal paged runtime for testing int4_kivi implementations without vLLM: pages, block tables,
windows inside the pages, and requests scheduled in chunks, checked against s4kv.reference."""

import torch

from s4kv import format as fmt
from s4kv.kernels.batch import S4KVMetadata, plan_launch
from s4kv.reference import kivi_attention

BS = fmt.BLOCK_SIZE


class Engine:
    """A minimal paged runtime around torch_ops.forward: pages and block tables. Like vLLM's
    scheduler it gives a request of L tokens fmt.blocks_held(L) pages (its window's too), and freed
    pages go back to the pool dirty, first in line to be reused."""

    def __init__(self, hq, hkv, d, dtype, num_blocks=64, seed=0, ops=None, device="cpu"):
        from s4kv.backend import torch_ops

        self.ops = ops or torch_ops
        self.device = torch.device(device)
        self.hq, self.hkv, self.d, self.dtype = hq, hkv, d, dtype
        # Pages start as noise (NaN and inf bit patterns included): nothing may read a byte it did not write.
        self.regions = torch.randint(0, 256, (num_blocks, hkv, fmt.PageLayout(d).region_bytes), dtype=torch.uint8,
                                     generator=torch.Generator().manual_seed(seed + 2)).to(device)
        self.free_blocks = list(torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist())
        self.g = torch.Generator().manual_seed(seed + 1)
        self.reqs = {}  # name -> dict(q, k, v (full sequences), blocks, done)

    def held(self, num_tokens):
        return fmt.blocks_held(num_tokens, self.d, self.dtype.itemsize)

    def free(self, name, keep_blocks=0):
        """Give back a request's pages after its first keep_blocks (a preemption keeps the cached
        complete units and resumes there; a finished request keeps none)."""
        assert keep_blocks % fmt.UNIT_BLOCKS == 0, "the prefix cache keeps whole units (s4kv.backend.spec)"
        r = self.reqs[name]
        self.free_blocks += r["blocks"][keep_blocks:][::-1]
        r["blocks"] = r["blocks"][:keep_blocks]
        r["done"] = min(r["done"], keep_blocks * BS)

    def add(self, name, length, shared_prefix_of=None, shared_blocks=0):
        g = self.g
        q = torch.randn(length, self.hq, self.d, generator=g).to(self.dtype)
        k = torch.randn(length, self.hkv, self.d, generator=g).to(self.dtype)
        v = torch.randn(length, self.hkv, self.d, generator=g).to(self.dtype)
        blocks = []
        done = 0
        if shared_prefix_of is not None:  # prefix-cache hit on whole units (s4kv.backend.spec)
            assert shared_blocks % fmt.UNIT_BLOCKS == 0
            src = self.reqs[shared_prefix_of]
            n = shared_blocks * BS
            k[:n], v[:n] = src["k"][:n], src["v"][:n]
            blocks = src["blocks"][:shared_blocks]
            done = n
        self.reqs[name] = {"q": q, "k": k, "v": v, "blocks": list(blocks), "done": done}

    def step(self, schedule):
        """schedule: list of (name, num_tokens). Returns {name: (out, ctx)}."""
        qs, ks, vs, qsl, seq, tables = [], [], [], [0], [], []
        for name, n in schedule:
            r = self.reqs[name]
            ctx, end = r["done"], r["done"] + n
            assert end <= r["q"].shape[0], "schedule past the end of the request"
            while len(r["blocks"]) < self.held(end):
                r["blocks"].append(self.free_blocks.pop())
            qs.append(r["q"][ctx:end])
            ks.append(r["k"][ctx:end])
            vs.append(r["v"][ctx:end])
            qsl.append(qsl[-1] + n)
            seq.append(end)
            tables.append(r["blocks"])
        width = max(len(t) for t in tables)
        bt = torch.zeros(len(tables), width, dtype=torch.int32)
        for i, t in enumerate(tables):
            bt[i, :len(t)] = torch.tensor(t)
        qsl_t = torch.tensor(qsl, dtype=torch.int32)
        seq_t = torch.tensor(seq, dtype=torch.int32)
        dev = self.device
        md = S4KVMetadata(
            num_reqs=len(schedule), num_actual_tokens=qsl[-1], max_query_len=max(n for _, n in schedule),
            max_seq_len=max(seq), query_start_loc=qsl_t.to(dev), seq_lens=seq_t.to(dev),
            block_table=bt.to(dev), query_start_loc_cpu=qsl_t, seq_lens_cpu=seq_t)
        plan_launch(md, self.hkv, num_sms=4, uniform_decode=all(n == 1 for _, n in schedule))
        q = torch.cat(qs).to(self.device)
        k = torch.cat(ks).to(self.device)
        v = torch.cat(vs).to(self.device)
        out = torch.full(q.shape, float("nan"), device=self.device)  # poison: every row must be written
        self.ops.forward(q, k, v, self.regions, md, self.d ** -0.5, out)
        out = out.cpu()
        result = {}
        for i, (name, n) in enumerate(schedule):
            r = self.reqs[name]
            result[name] = (out[qsl[i]:qsl[i + 1]], r["done"])
            r["done"] += n
        return result

    def reference(self, name, out_ctx):
        r = self.reqs[name]
        out, ctx = out_ctx
        n = out.shape[0]
        return kivi_attention(r["q"][ctx:ctx + n], r["k"][:ctx + n], r["v"][:ctx + n], self.d ** -0.5, q_start=ctx)




def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """||got - want|| / ||want|| (Frobenius), the distance every kernel and reference test bounds."""
    return ((got - want).norm() / want.norm()).item()


def check(engine, results, tol):
    for name, oc in results.items():
        ref = engine.reference(name, oc)
        assert torch.isfinite(oc[0]).all(), name
        err = relative_error(oc[0], ref)
        assert err < tol, (name, oc[1], err)
