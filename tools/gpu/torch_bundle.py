#!/usr/bin/env python3
"""Carry the torch a vLLM release pins to the offline GPU machine, next to make-bundle's vLLM.

``../shared/gpu/make-bundle --vllm V`` carries vLLM V and the packages the machine lacks, but never
the GPU stack (torch, triton, nvidia-*): the machine's image has torch 2.11 / Triton 3.6, which is
what vLLM 0.24.0 pins. vLLM 0.33.0 pins torch 2.14.0 (and torch 2.14 pins Triton 3.8): its compiled
extensions do not load against torch 2.11. This step carries that stack in chunks of its own
(t0, t1, ... beside make-bundle's c0, c1, ...) and writes ``setup-torch.sh``, which installs it into
the same ``/tmp/site`` before make-bundle's setup runs, so vLLM's own check already imports the new
torch.

    python3 tools/gpu/torch_bundle.py --vllm 0.33.0 [--out .gpu33] [--chunk-mib N]

Each device call sends the checkout's tree as well as the chunk it carries, 64 MiB in all. The
chunk size is chosen to fit beside the tree with 2 MiB to spare (at most make-bundle's 58 MiB), and
the log says which ``--chunk-mib`` make-bundle needs for the same. A call that would not fit
(make-bundle's chunks cut for a smaller tree) stops this with exit 6 before any call is printed.

What is carried, and why (each from the wheel that pins it, never a hand-written version):
* torch at the version ``VERSIONS`` gives for the release (its CUDA 13.0 build: the machine's
  driver is 580, CUDA 13.0);
* the triton and nvidia-nccl-cu13 that torch's wheel pins: NCCL because libtorch_cuda of a newer
  torch calls NCCL functions the image's older NCCL lacks (resolved lazily, so a missing one would
  kill the process at its first call instead of at import); where the registry lacks the pinned
  NCCL, the nearest newer release (said in the log);
* the torchvision vLLM pins (a torchvision built for another torch fails at import).
Not carried: the CUDA 13.0 libraries (cuda-toolkit 13.0.x, cusparselt 0.8.x), which the image's
torch already brought at the same minor version, and cuDNN (torch checks its version only when a
cuDNN kernel runs; the text models served here run none). ``setup-torch.sh`` prints the image's
versions of these next to the new torch, so a mismatch is visible in the first call's log.

Writes into OUT: t0..tN (a plain tar of the wheels, split: they are compressed already),
setup-torch.sh (from tools/gpu/setup-torch-on-device.sh with the chunk hashes filled in) and
torch-bundle.json; prints the whole call sequence, make-bundle's calls included.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from forklayer.versions import get_pin  # the repository's VERSIONS reader

CACHE = Path.home() / ".cache" / "s4kv-gpu" / "torch-wheels"
TEMPLATE = Path(__file__).with_name("setup-torch-on-device.sh")
STAGE = "/root/stage"
# the GPU machine: CPython 3.12, x86_64, glibc 2.28+ wheels first (as make-bundle picks them)
PIP_TARGET = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
              "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
              "--platform", "manylinux2014_x86_64", "--platform", "any"]
MARKERS = {"platform_system": "Linux", "sys_platform": "linux", "platform_machine": "x86_64",
           "python_version": "3.12", "python_full_version": "3.12.3", "extra": ""}


def log(msg: str) -> None:
    print(f"[torch-bundle] {msg}", flush=True)


def requires(whl: Path) -> list[Requirement]:
    """The wheel's Requires-Dist that apply on the GPU machine."""
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        lines = Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or []
    reqs = [Requirement(x) for x in lines]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(MARKERS)]


def download(spec: str) -> Path:
    """One wheel for `spec` (no dependencies), cached; pip picks the newest that matches."""
    CACHE.mkdir(parents=True, exist_ok=True)
    before = set(CACHE.glob("*.whl"))
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PIP_TARGET, "-d", str(CACHE),
           "-c", "/dev/null", spec]
    res = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if res.returncode:
        raise LookupError(res.stdout[-2000:] + res.stderr[-2000:])
    req = Requirement(spec)
    hits = [w for w in CACHE.glob("*.whl") if canonicalize_name(w.name.split("-")[0]) == canonicalize_name(req.name)
            and req.specifier.contains(w.name.split("-")[1], prereleases=True)]
    new = [w for w in hits if w not in before]
    return max(new or hits, key=lambda w: w.stat().st_mtime)


def pinned(reqs: list[Requirement], name: str) -> Requirement:
    return next(r for r in reqs if canonicalize_name(r.name) == name)


def download_or_newer(req: Requirement) -> Path:
    """The pinned release, or (where the registry lacks it) the nearest newer one of the same name."""
    spec = f"{req.name}{req.specifier}"
    try:
        return download(spec)
    except LookupError:
        floor = next(s.version for s in req.specifier)
        log(f"{spec} is not on the registry: taking the nearest newer release (>={floor})")
        return download(f"{req.name}>={floor}")


class Chunks:
    """A write-only stream cut into files t0, t1, ... of at most `size` bytes, hashed as written:
    `hashes` holds each chunk's sha256 once closed, `total` the whole stream's."""

    def __init__(self, folder: Path, size: int):
        self.folder, self.size, self.paths, self.f, self.left = folder, size, [], None, 0
        self.hashes, self.h, self.total = [], None, hashlib.sha256()

    def _end_chunk(self) -> None:
        if self.f:
            self.f.close()
            self.hashes.append(self.h.hexdigest())
            self.f = None

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        self.total.update(view)
        while view:
            if not self.left:
                self._end_chunk()
                self.paths.append(self.folder / f"t{len(self.paths)}")
                self.f, self.left = open(self.paths[-1], "wb"), self.size  # noqa: SIM115 - closed in _end_chunk
                self.h = hashlib.sha256()
            n = min(self.left, len(view))
            self.f.write(view[:n])
            self.h.update(view[:n])
            view, self.left = view[n:], self.left - n
        return len(data)

    def close(self) -> None:
        self._end_chunk()


def write_bundle(wheels: list[Path], out: Path, chunk_bytes: int) -> tuple[list[tuple[str, str]], str]:
    """The wheels as one tar cut into out/t0..tN, and out/setup-torch.sh with their hashes filled
    in. Returns [(chunk name, sha256)] and the sha256 of the whole payload."""
    for old in out.glob("t[0-9]*"):
        old.unlink()
    sink = Chunks(out, chunk_bytes)
    with tarfile.open(fileobj=sink, mode="w|") as tar:
        for w in wheels:
            tar.add(w, arcname=f"whl/{w.name}")
    sink.close()
    chunks = [(p.name, h) for p, h in zip(sink.paths, sink.hashes, strict=True)]
    payload = sink.total.hexdigest()
    facts = {"TORCH_WHEELS": " ".join(w.name for w in wheels), "TORCH_CHUNKS": " ".join(f"{n}={h}" for n, h in chunks),
             "TORCH_PAYLOAD": payload}
    script = TEMPLATE.read_text()
    for k, v in facts.items():
        script, n = re.subn(rf'^{k}=""$', f'{k}="{v}"', script, flags=re.MULTILINE)
        assert n == 1, k
    (out / "setup-torch.sh").write_text(script)
    (out / "setup-torch.sh").chmod(0o755)
    return chunks, payload


CALL_LIMIT = 64 * 2**20    # what one device call carries: the checkout's tree plus what `carry` names
TREE_MARGIN = 2 * 2**20    # the tree grows between bundling and the calls (results, notes committed)
MAX_CHUNK = 58 * 2**20     # make-bundle's default, kept while the tree is small


def on_disk(size: int) -> int:
    """A file's size in whole 4 KiB blocks, as `du` counts it: the device tool's count matched that
    (58 MiB chunk + 5.8 MiB tree in bytes, 7.1 MiB in blocks: refused), not the bytes."""
    return -(-size // 4096) * 4096


def tree_bytes(root: Path = ROOT) -> int:
    """What every call sends besides `carry`: tracked and untracked-not-ignored files, in blocks."""
    names = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "-co", "--exclude-standard"],
                           capture_output=True, check=True).stdout.split(b"\0")
    return sum(on_disk((root / n.decode()).stat().st_size) for n in names if n and (root / n.decode()).is_file())


def fitting_chunk(tree: int) -> int:
    """The largest chunk (whole MiB) that one call carries beside the tree, with room for it to grow."""
    return min(MAX_CHUNK, (CALL_LIMIT - tree - TREE_MARGIN) // 2**20 * 2**20)


def oversized(calls: list[dict], tree: int, base: Path) -> list[tuple[int, int]]:
    """(call number, bytes sent) for each call that the device tool would refuse."""
    sent = [(i, tree + sum(on_disk((base / c).stat().st_size) for c in call["carry"] if (base / c).exists()))
            for i, call in enumerate(calls, 1)]
    return [(i, n) for i, n in sent if n > CALL_LIMIT]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vllm", required=True, help="vLLM release (a line of VERSIONS)")
    ap.add_argument("--out", type=Path, default=None, help="bundle folder (default .gpu<major><minor>, "
                    "e.g. .gpu33: make-bundle's --out)")
    ap.add_argument("--chunk-mib", type=float, default=None,
                    help="chunk size limit (default: what fits beside the checkout's tree in a 64 MiB call, at most 58)")
    a = ap.parse_args()
    tree = tree_bytes()
    chunk = int(a.chunk_mib * 2**20) if a.chunk_mib else fitting_chunk(tree)
    log(f"tree {tree / 2**20:.1f} MiB: chunks of {chunk / 2**20:.0f} MiB "
        f"(make-bundle needs the same: --chunk-mib {chunk // 2**20})")
    out = a.out or ROOT / (".gpu" + "".join(a.vllm.split(".")[1:2]))
    out.mkdir(parents=True, exist_ok=True)

    torch_whl = download(f"torch=={get_pin(a.vllm).torch}")
    vllm_whl = download(f"vllm=={a.vllm}")
    t_reqs, v_reqs = requires(torch_whl), requires(vllm_whl)
    wheels = [torch_whl, download_or_newer(pinned(t_reqs, "triton")),
              download_or_newer(pinned(t_reqs, "nvidia-nccl-cu13")),
              download_or_newer(pinned(v_reqs, "torchvision"))]
    left_out = [str(r) for r in t_reqs if canonicalize_name(r.name).startswith(("nvidia-", "cuda-"))
                and canonicalize_name(r.name) != "nvidia-nccl-cu13"]
    for w in wheels:
        log(f"carrying {w.name} ({w.stat().st_size / 2**20:.0f} MiB)")
    log("left to the image: " + "; ".join(left_out))

    chunks, payload = write_bundle(wheels, out, chunk)
    rel = out.resolve().relative_to(ROOT) if out.resolve().is_relative_to(ROOT) else out
    mb = json.loads((out / "bundle.json").read_text()) if (out / "bundle.json").exists() else None
    vllm_calls = list((mb or {}).get("calls", []))
    seq = [{"carry": [f"{rel}/{n}"], "command": f"mkdir -p {STAGE} && cp {rel}/{n} {STAGE}/ && ls {STAGE} | wc -l"}
           for n, _ in chunks]
    if vllm_calls:
        seq += vllm_calls[:-1]
        last = dict(vllm_calls[-1])
        last["carry"] = list(last["carry"]) + [f"{rel}/setup-torch.sh"]
        last["command"] = f"bash {rel}/setup-torch.sh && " + last["command"]
        seq.append(last)
    else:
        log(f"no {rel}/bundle.json: run ../shared/gpu/make-bundle --vllm {a.vllm} --out {rel} first for vLLM's calls")
    (out / "torch-bundle.json").write_text(json.dumps({"vllm": a.vllm, "wheels": [w.name for w in wheels],
                                                        "left_to_image": left_out, "chunks": chunks,
                                                        "payload_sha256": payload, "calls": seq}, indent=1))
    too_big = oversized(seq, tree, ROOT)
    for i, n in too_big:
        log(f"call {i} would send {n / 2**20:.1f} MiB (limit 64 MiB with the tree): "
            f"re-run make-bundle and this with --chunk-mib {fitting_chunk(tree) // 2**20}")
    if too_big:
        sys.exit(6)
    total = sum((out / n).stat().st_size for n, _ in chunks)
    log(f"{len(chunks)} torch chunks, {total / 2**20:.1f} MiB; {len(seq)} calls in all (torch's first), back to back:")
    for i, c in enumerate(seq, 1):
        print(f"  {i:2d}  carry {json.dumps(c['carry'])}\n      {c['command']}")
    # 2026-12-03: a batch sent while no machine could be started lost 556 s of a 1,800 s lease (the
    # first call ~180 s, then 15 s for each refused call of the batch)
    log("send call 1 alone and read its answer first: when no machine could be started, the device tool "
        "refuses every call for about 10 minutes and still charges 15 s of device time for each; "
        "once call 1 has run, send the rest back to back")


if __name__ == "__main__":
    main()
