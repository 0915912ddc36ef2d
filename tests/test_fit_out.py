"""tools/gpu/fit_out.sh: a device call's $OUT never holds more files than the device tool brings
back (8), and packing it loses nothing: every file comes back out of what is left, byte for byte."""

import subprocess
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "gpu" / "fit_out.sh"


def _fit(out: Path, max_files: int = 8) -> str:
    return subprocess.run(["bash", str(SCRIPT), str(out), str(max_files)], check=True, capture_output=True,
                          text=True).stdout


def _contents(root: Path) -> dict[str, bytes]:
    """Every file under root, archives unpacked recursively (as a person fetching them would)."""
    got = {}
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = str(f.relative_to(root))
        if f.name in ("logs.tgz", "results.tar"):
            dest = root.parent / (root.name + "-" + f.name + "-x")
            with tarfile.open(f) as t:
                t.extractall(dest, filter="data")
            got.update(_contents(dest))
        else:
            got[rel] = f.read_bytes()
    return got


def _populate(out: Path, logs: int, archives: int) -> dict[str, bytes]:
    out.mkdir()
    want = {}
    for i in range(logs):
        name = f"step-{i}.log" if i % 2 else f"variant-{i}.json"
        want[name] = f"record {i}\n".encode() * (i + 1)
        (out / name).write_bytes(want[name])
    (out / "throughput").mkdir()  # a step still writing its folder
    (out / "throughput" / "W3.json").write_bytes(b'{"requests_per_second": 1.21}')
    want["throughput/W3.json"] = b'{"requests_per_second": 1.21}'
    for i in range(archives):
        name = f"step{i}.tgz"
        want[name] = bytes([i]) * 100  # the test only moves them: any bytes
        (out / name).write_bytes(want[name])
    return want


def test_few_files_are_left_as_they_are(tmp_path):
    want = _populate(tmp_path / "out", logs=4, archives=2)
    assert _fit(tmp_path / "out") == ""
    assert _contents(tmp_path / "out") == want


def test_logs_and_records_go_into_one_archive_beside_the_steps_archives(tmp_path):
    out = tmp_path / "out"
    want = _populate(out, logs=16, archives=3)
    said = _fit(out)
    assert "17 logs and records packed" in said  # 16 files and the folder
    assert sorted(p.name for p in out.iterdir()) == ["logs.tgz", "step0.tgz", "step1.tgz", "step2.tgz"]
    assert _contents(out) == want


def test_too_many_archives_go_into_one_tar(tmp_path):
    out = tmp_path / "out"
    want = _populate(out, logs=3, archives=9)
    _fit(out)
    assert [p.name for p in out.iterdir()] == ["results.tar"]
    assert _contents(out) == want
