#!/usr/bin/env python3
"""Write the hashed constraints of the S4 KV image: every Python distribution the image's venv
gets besides the two wheels of dist/, pinned to one version and its sha256.

    python deploy/image/constraints.py --wheels dist --vllm-version 0.24.0 \\
        [--vllm-dist vllm] [--out deploy/image/constraints/vllm-0.24.0.txt] \\
        [--python-version 3.11] [--glibc 2.34] [--expect torch==2.11.0] [-- PIP OPTIONS...]

(`nox -s image-constraints` runs it for every CUDA release of VERSIONS.) It resolves the patched
vLLM wheel and the s4kv wheel the way the image's pip will (`pip install --dry-run --report`, for
CPython X.Y on manylinux x86_64 up to glibc 2.34, Amazon Linux 2023's), downloads each resolved
distribution (`pip download --no-deps`) and hashes the file itself. provision.sh installs exactly
this set with `pip install --require-hashes --no-deps` and checks it with `pip check`.

The file is a pip requirements file (`name==version --hash=sha256:...`), named a constraints file
because it constrains the image to these builds: pip ignores hashes in files given with `-c`, so
provision.sh passes it with `-r`. Markers are evaluated by pip for the running interpreter, so this
runs under the image's Python version on Linux x86_64 and refuses anything else.

Only the Python standard library and the running interpreter's pip. PIP OPTIONS go to both pip
calls (e.g. --no-index --find-links DIR for a local wheel set).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REQUIRE_LINE = "{name}=={version} \\\n    --hash=sha256:{sha256}"


def normalize(name: str) -> str:
    """PEP 503 name: what pip compares."""
    return re.sub(r"[-_.]+", "-", name).lower()


def version_key(v: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.+]", v))


def find_wheel(wheels: Path, dist: str, version: str | None) -> Path:
    """The newest <dist>-<version>+s4kv.N wheel (or s4kv-*.whl), as provision.sh picks it."""
    stem = dist.replace("-", "_")
    pattern = f"{stem}-{version}+s4kv.*.whl" if version else f"{stem}-*.whl"
    found = sorted(wheels.glob(pattern), key=lambda p: version_key(p.name.split("-")[1]))
    if not found:
        sys.exit(f"constraints.py: no {pattern} in {wheels} (nox -s build-vllm-s4kv)")
    return found[-1]


def platforms(glibc: str) -> list[str]:
    """Every manylinux tag a pip on that glibc accepts (pip --platform does not expand them)."""
    major, minor = (int(x) for x in glibc.split("."))
    tags = [f"manylinux_{major}_{m}_x86_64" for m in range(minor, 4, -1)]
    legacy = {17: "manylinux2014_x86_64", 12: "manylinux2010_x86_64", 5: "manylinux1_x86_64"}
    return tags + [tag for m, tag in legacy.items() if m <= minor]


def pip(*args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    if r.returncode != 0:
        sys.exit(f"constraints.py: pip {args[0]} failed:\n{r.stdout[-4000:]}")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pip_extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, pip_extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(prog="constraints.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--wheels", type=Path, required=True)
    ap.add_argument("--vllm-version", required=True)
    ap.add_argument("--vllm-dist", default="vllm")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--python-version", default="3.11", help="the image's Python (default 3.11)")
    ap.add_argument("--glibc", default="2.34", help="the image's glibc (default 2.34, Amazon Linux 2023)")
    ap.add_argument("--expect", action="append", default=[], metavar="NAME==VERSION",
                    help="fail unless the resolution pins this (e.g. VERSIONS' torch)")
    args = ap.parse_args(argv)

    running = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if running != args.python_version or sys.platform != "linux" or platform.machine() != "x86_64":
        sys.exit(f"constraints.py: run this with Python {args.python_version} on Linux x86_64 (pip evaluates "
                 f"markers for the running interpreter; this is Python {running} on {sys.platform} "
                 f"{platform.machine()})")
    vllm_whl = find_wheel(args.wheels, args.vllm_dist, args.vllm_version)
    s4kv_whl = find_wheel(args.wheels, "s4kv", None)
    out = args.out or Path(__file__).resolve().parent / "constraints" / f"{args.vllm_dist}-{args.vllm_version}.txt"
    target = ["--only-binary=:all:", *[f"--platform={p}" for p in platforms(args.glibc)]]

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        report = tmp / "report.json"
        pip("install", "--dry-run", "--ignore-installed", "--quiet", "--report", str(report),
            "--target", str(tmp / "target"), *target, *pip_extra, str(vllm_whl), str(s4kv_whl))
        resolved = {}
        for item in json.loads(report.read_text())["install"]:
            if item.get("is_direct"):
                continue  # the two wheels of dist/: provision.sh hashes them itself
            name, version = normalize(item["metadata"]["name"]), item["metadata"]["version"]
            hashes = item.get("download_info", {}).get("archive_info", {}).get("hashes", {})
            resolved[name] = (version, hashes.get("sha256"))
        for want in args.expect:
            name, _, version = want.partition("==")
            got = resolved.get(normalize(name), (None,))[0]
            if got != version:
                sys.exit(f"constraints.py: expected {want}, the resolution has {name}=={got}")
        pins = [f"{n}=={v}" for n, (v, _) in sorted(resolved.items())]
        files = {}
        if pins:
            pip("download", "--no-deps", "--quiet", "--dest", str(tmp / "dl"), *target, *pip_extra, *pins)
            for f in (tmp / "dl").iterdir():
                files[normalize(f.name.split("-")[0])] = f
        lines = []
        for name, (version, reported) in sorted(resolved.items()):
            f = files.get(name)
            if f is None:
                sys.exit(f"constraints.py: pip download gave no file for {name}=={version}")
            digest = sha256(f)
            if reported and reported != digest:
                sys.exit(f"constraints.py: {f.name}: sha256 {digest}, the index said {reported}")
            lines.append(REQUIRE_LINE.format(name=name, version=version, sha256=digest))

    header = [
        f"# Hashed constraints of the S4 KV image: {args.vllm_dist} {args.vllm_version}",
        f"# resolved from {vllm_whl.name} and {s4kv_whl.name} by deploy/image/constraints.py",
        "# (nox -s image-constraints); provision.sh installs exactly these with",
        "# pip install --require-hashes --no-deps, plus the two wheels with their own sha256.",
        f"# python: {args.python_version}",
        f"# platform: manylinux x86_64, glibc {args.glibc}",
    ]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(header + lines) + "\n")
    print(f"constraints.py: {out}: {len(lines)} distributions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
