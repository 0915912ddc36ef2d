"""On a GPU: the Gluon page-loop probe (MODULE) against the shipped decode kernel's page partials,
then both timed (profiler device time per kernel, eager calls), with the pages from DRAM and from an
L2-resident pool. python probe.py MODULE [--dtypes bf16,fp16] [--points 8192x32,32768x8] [--out F]"""
import argparse, importlib, json, os, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from s4kv.kernels import bench
from s4kv.kernels.decode import _workspace, decode_attention, page_operand_dtype, window_splits
from s4kv.kernels.store import quantize_rows

ap = argparse.ArgumentParser()
ap.add_argument("module")
ap.add_argument("--dtypes", default="bf16,fp16")
ap.add_argument("--points", default="8192x32,32768x8")
ap.add_argument("--alias", type=int, default=128)
ap.add_argument("--out", default=None)
args = ap.parse_args()
mod = importlib.import_module(args.module)
rows_out = []
for dt in args.dtypes.split(","):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dt]
    for pt in args.points.split(","):
        ctx, batch = map(int, pt.split("x"))
        for alias in (None, args.alias):
            q, k, v, regions, md = bench.decode_inputs(ctx, batch, dtype=dtype, alias_blocks=alias)
            rows = quantize_rows(k, v)
            out = torch.empty(batch, 28, 128, dtype=torch.float32, device="cuda")
            splits = md.decode_splits
            run = lambda: decode_attention(q, rows, regions, md, batch, 128 ** -0.5, out, splits)
            run(); torch.cuda.synchronize()
            part_o, part_ml, qr = _workspace(q, batch, splits)
            ref_o, ref_ml = part_o.clone(), part_ml.clone()
            parts = splits + window_splits()
            my_o = torch.full_like(part_o, float("nan")); my_ml = torch.full_like(part_ml, float("nan"))
            operands = page_operand_dtype(dtype)
            mine = lambda: mod.page_partials(qr, regions, md, batch, 7, 4, 128, dtype, operands, my_o, my_ml,
                                             splits, parts)
            mine(); torch.cuda.synchronize()
            R = batch * 28
            ro, rml = ref_o.view(-1)[:R * parts * 128].view(R, parts, 128)[:, :splits], ref_ml.view(-1)[:R * parts * 2].view(R, parts, 2)[:, :splits]
            mo, mml = my_o.view(-1)[:R * parts * 128].view(R, parts, 128)[:, :splits], my_ml.view(-1)[:R * parts * 2].view(R, parts, 2)[:, :splits]
            full = torch.isfinite(rml[..., 0])
            dm = (mml[..., 0] - rml[..., 0])[full].abs().max().item()
            # outputs normalized by each partial's sum, in units of the reference's largest |o / l|
            on_r = ro / rml[..., 1:2]; on_m = mo / mml[..., 1:2]
            do = ((on_m - on_r)[full].abs().max() / on_r[full].abs().max()).item()
            dl = ((mml[..., 1] - rml[..., 1]) / rml[..., 1])[full].abs().max().item()
            empty_ok = bool(((mml[..., 0] == -float("inf")) | full).all())
            kb_ref = bench.kernel_breakdown(run); kb_me = bench.kernel_breakdown(mine)
            shipped = sum(v for n, v in kb_ref.items() if "_decode_kernel" in n) * 1e3
            probe = sum(v for n, v in kb_me.items() if "_page_kernel" in n) * 1e3
            r = dict(dtype=dt, point=pt, alias=alias, splits=splits, max_dm=dm, max_do=do, max_dl=dl,
                     empty_ok=empty_ok, shipped_decode_us=shipped, probe_pages_us=probe,
                     shipped_all=kb_ref, probe_all=kb_me)
            print(json.dumps({k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()
                              if k not in ("shipped_all", "probe_all")}), flush=True)
            rows_out.append(r)
            del q, k, v, regions, md, rows
            torch.cuda.empty_cache()
if args.out:
    json.dump(rows_out, open(args.out, "w"), indent=1)
