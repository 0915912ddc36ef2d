#!/usr/bin/env python3
"""Smoke test of int4_kivi in a real vLLM engine: greedy outputs next to the bf16 cache.

    python3 tools/gpu/smoke_int4.py MODEL_DIR [--eager] [--kv int4_kivi]

Each engine runs in a subprocess (clean memory). Prompts: two short ones and two long-context
prompts (>1,000 tokens, so most attended tokens are quantized). Prints the texts and, per prompt,
the first position where int4_kivi's greedy tokens diverge from bf16's.
"""

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPTS_FILE = os.path.join(ROOT, "s4kv", "data", "prompts_long.jsonl")


def child(model: str, kv: str, eager: bool, out: str) -> None:
    from vllm import LLM, SamplingParams

    prompts = ["The capital of France is", "def fibonacci(n):"]
    prompts += [json.loads(line)["prompt"] for line in open(PROMPTS_FILE)][:2]
    t0 = time.time()
    kwargs = dict(gpu_memory_utilization=0.3) if not os.environ.get("VLLM_CPU_KVCACHE_SPACE") else {}
    llm = LLM(model=model, kv_cache_dtype=kv, max_model_len=4096, seed=0, max_num_seqs=16,
              enforce_eager=eager, **kwargs)
    t1 = time.time()
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True), use_tqdm=False)
    t2 = time.time()
    json.dump({"kv": kv, "load_s": t1 - t0, "gen_s": t2 - t1,
               "tokens": [list(o.outputs[0].token_ids) for o in outs],
               "texts": [o.outputs[0].text for o in outs]}, open(out, "w"))
    os._exit(0)  # do not wait for engine shutdown


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4] == "1", sys.argv[5])
        return 0
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    model = args[0]
    eager = "--eager" in sys.argv
    kv = sys.argv[sys.argv.index("--kv") + 1] if "--kv" in sys.argv else "int4_kivi"
    results = {}
    for dtype in ("auto", kv):
        out = f"/tmp/smoke-{dtype}.json"
        rc = subprocess.call([sys.executable, __file__, "--child", model, dtype, "1" if eager else "0", out])
        if rc != 0 or not os.path.exists(out):
            print(f"FAILED: engine with kv_cache_dtype={dtype} exited {rc}")
            return 1
        results[dtype] = json.load(open(out))
        print(f"{dtype}: load {results[dtype]['load_s']:.0f} s, generate {results[dtype]['gen_s']:.1f} s")
    for i, (a, b) in enumerate(zip(results["auto"]["tokens"], results[kv]["tokens"])):
        div = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
        print(f"prompt {i}: first divergence {div if div is not None else 'none'} / {len(a)}")
        print(f"  auto: {results['auto']['texts'][i][:100]!r}")
        print(f"  {kv}: {results[kv]['texts'][i][:100]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
