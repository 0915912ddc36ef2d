"""`s4kv demo` (s4kv/demo.py): end to end with the real servers in this venv (the answer, the capacity
ratio the engines report, no server process left afterwards, Ctrl-C while a server starts), and
its parts without an engine (the /metrics parser, stopping a process group that ignores signals)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from serve_harness import needs_smollm2, needs_vllm

from s4kv import demo
from s4kv import format as fmt

DEMO = [sys.executable, "-m", "s4kv.demo"]
DEMO_TIMEOUT = 900  # two server starts (about 30-45 s each on CI's 2 cores) and two short answers
SMOLLM2_HEAD_DIM = 64



# ------------------------------------------------------------------------------ without an engine

METRICS = textwrap.dedent('''\
    # HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
    # TYPE vllm:cache_config_info gauge
    vllm:cache_config_info{block_size="128",cache_dtype="int4_kivi",engine="0",kv_cache_max_concurrency="19.85",\
kv_cache_size_tokens="162635",num_gpu_blocks="1350",num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256"} 1.0
    # HELP vllm:num_requests_running Number of requests in model execution batches.
    vllm:num_requests_running{engine="0",model_name="smollm2"} 0.0
    ''')


def test_cache_config_info_parsed_from_metrics():
    assert demo.parse_cache_config_info(METRICS) == {
        "num_gpu_blocks": 1350, "block_size": 128, "pool_tokens": 172_800, "kv_cache_size_tokens": 162_635,
        "cache_dtype": "int4_kivi"}


def test_metrics_without_blocks_is_an_error():
    with pytest.raises(demo.DemoError, match="no vllm:cache_config_info"):
        demo.parse_cache_config_info("vllm:num_requests_running 0.0\n")
    with pytest.raises(demo.DemoError, match="no block count"):
        demo.parse_cache_config_info(METRICS.replace('num_gpu_blocks="1350"', 'num_gpu_blocks="None"'))


# A stand-in server: a main process and a child in its process group that both ignore the signals
# named on its command line, as a hung engine would; each says "ready" once its handlers are set.
STUBBORN = textwrap.dedent('''\
    import signal, subprocess, sys, time
    ignored = [name for name in sys.argv[1].split(",") if name]
    for name in ignored:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    code = f"import signal, time\\nfor s in {ignored!r}: signal.signal(getattr(signal, s), signal.SIG_IGN)\\n" \\
           "print('child ready', flush=True)\\ntime.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", code])
    print("main ready", flush=True)
    time.sleep(600)
    ''')


@pytest.mark.parametrize(("ignores", "ended_by"), [
    ("", "SIGINT"),
    ("SIGINT", "SIGTERM"),
    ("SIGINT,SIGTERM", "SIGKILL"),
])
def test_stop_escalates_until_the_whole_group_is_gone(tmp_path, ignores, ended_by):
    server = demo.Server("stub", "auto", "unused", tmp_path, kv_cache_bytes=1, max_model_len=None)
    server.argv = [sys.executable, "-c", STUBBORN, ignores]
    # an ignored signal's wait runs out whatever its length (1 s); the one that works gets 60 s
    server.stop_steps = tuple((sig, 1.0 if sig.name in ignores.split(",") else 60.0)
                              for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL))
    # started from a process that ignores SIGINT (a background job of a script does): the server
    # must not inherit that, or SIGINT would never stop it (s4kv.demo._WITH_PDEATHSIG)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        server.start()
    finally:
        signal.signal(signal.SIGINT, previous)
    deadline = time.monotonic() + 60
    while not ("main ready" in server.log_text() and "child ready" in server.log_text()):
        assert time.monotonic() < deadline, server.log_text()
        time.sleep(0.1)
    assert len(demo.group_members(server.pgid)) == 2, server.log_text()
    how, _, left = server.stop()
    assert (how, left) == (ended_by, [])
    assert demo.group_members(server.pgid) == []


# ---------------------------------------------------------------------------------- end to end

def engine(test):
    return pytest.mark.engine(needs_vllm(needs_smollm2(test)))


def server_groups(stdout: str) -> list[int]:
    return [int(g) for g in re.findall(r"server: starting on \S+ \(process group (\d+),", stdout)]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """`python -m s4kv.demo` in this venv, once for the module."""
    workdir = tmp_path_factory.mktemp("demo")
    t0 = time.monotonic()
    r = subprocess.run([*DEMO, "--workdir", str(workdir)], capture_output=True, text=True, timeout=DEMO_TIMEOUT,
                       check=False)
    print(f"s4kv demo: exit {r.returncode} after {time.monotonic() - t0:.0f} s\n{r.stdout}\n{r.stderr[-3000:]}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r.stdout


@engine
@pytest.mark.parametrize("label", ["int4_kivi", "bf16"])
def test_demo_answers(demo_run, label):
    answer = re.search(rf"^A \({label} KV cache\): (.*)$", demo_run, re.MULTILINE)
    assert answer and answer.group(1).strip(), demo_run


@engine
def test_demo_capacity_ratio_is_the_engines(demo_run):
    """The ratio printed is the engines' own numbers (their /metrics), and those pools are the format's
    density at equal KV bytes: 69 B per token and kv head for int4_kivi at head_dim 64, 256 B for bf16."""
    pools = re.search(r"^KV cache of 1 GiB each, as the engines report it: int4_kivi ([\d,]+) tokens, "
                      r"bf16 ([\d,]+) tokens$", demo_run, re.MULTILINE)
    ratio = re.search(r"^int4_kivi holds (\d+\.\d\d)x the tokens of bf16$", demo_run, re.MULTILINE)
    assert pools and ratio, demo_run
    int4, bf16 = (int(x.replace(",", "")) for x in pools.groups())
    assert float(ratio.group(1)) == round(int4 / bf16, 2)
    for label, tokens in (("int4_kivi", int4), ("bf16", bf16)):
        assert re.search(rf"{label} server: the engine reports [\d,]+ KV blocks of 128 tokens = {tokens:,} tokens",
                         demo_run)
    assert int4 / bf16 == pytest.approx(fmt.density_vs(SMOLLM2_HEAD_DIM), rel=0.01)


@engine
def test_demo_leaves_no_server_process(demo_run):
    groups = server_groups(demo_run)
    assert len(groups) == 2, demo_run
    for pgid in groups:
        assert f"no process of group {pgid} left" in demo_run
        assert demo.group_members(pgid) == []


ENGINE_CORE_COMM = "VLLM::EngineCor"  # the engine core's process title, as /proc/PID/comm cuts it


def _engine_core_in(pgid: int) -> bool:
    for pid in demo.group_members(pgid):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == ENGINE_CORE_COMM:
                return True
        except OSError:
            continue
    return False


@engine
def test_ctrl_c_while_the_server_starts_stops_its_whole_group(tmp_path):
    """SIGINT (Ctrl-C) once the int4_kivi server's engine core runs: the demo exits 130 and leaves no
    process of the server's group (API server, engine core, its workers)."""
    out = tmp_path / "demo.out"
    with open(out, "w") as f:
        proc = subprocess.Popen([*DEMO, "--workdir", str(tmp_path)], stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        groups: list[int] = []
        while not (groups and _engine_core_in(groups[0])):
            assert proc.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(0.5)
            groups = server_groups(out.read_text())
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 128 + signal.SIGINT, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    text = out.read_text()
    assert "interrupted (SIGINT)" in text and f"no process of group {groups[0]} left" in text, text
    assert demo.group_members(groups[0]) == []


def test_a_server_outlives_no_demo_killed_by_sigkill(tmp_path):
    """The server's main process gets SIGTERM when the demo dies, even by SIGKILL (PR_SET_PDEATHSIG)."""
    parent = textwrap.dedent(f'''\
        import sys, time
        from pathlib import Path
        from s4kv import demo
        server = demo.Server("stub", "auto", "unused", Path({str(tmp_path)!r}), kv_cache_bytes=1, max_model_len=None)
        server.argv = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(600)"]
        server.start()
        print(server.pgid, flush=True)
        time.sleep(600)
        ''')
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    try:
        pgid = int(proc.stdout.readline())
        deadline = time.monotonic() + 30
        while "ready" not in (tmp_path / "server-stub.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert demo.group_members(pgid), "the stand-in server did not start"
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 10
        while demo.group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert demo.group_members(pgid) == []
    finally:
        proc.kill()
