"""What the server says about its KV cache while a benchmark point runs: vLLM's Prometheus /metrics,
sampled in a background thread.

vLLM v1 exports the KV pool's use as a gauge (`vllm:kv_cache_usage_perc`, a fraction 0..1 of the
blocks in use), the scheduler's queues (`vllm:num_requests_running`, `vllm:num_requests_waiting`),
a preemption counter (`vllm:num_preemptions_total`) and the pool itself as labels of
`vllm:cache_config_info` (num_gpu_blocks, block_size). A gauge is an instant, so the sampler keeps
the peak and the mean over the samples taken while requests were running.
"""

from __future__ import annotations

import re
import statistics
import threading
import urllib.request

KV_USAGE = "vllm:kv_cache_usage_perc"
RUNNING = "vllm:num_requests_running"
INTERVAL_S = 0.5  # between samples during a point, unless `s4kv bench serve --metrics-interval` says otherwise
WAITING = "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions_total"
CACHE_INFO = "vllm:cache_config_info"

_RE_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+\d+)?$')
_RE_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Prometheus text format: {metric name: [(labels, value), ...]} (comments skipped)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _RE_SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = dict(_RE_LABEL.findall(m.group(2) or ""))
        out.setdefault(m.group(1), []).append((labels, value))
    return out


def total(samples: dict, name: str) -> float | None:
    """The sum of a metric over its label sets (one engine: one value); None when absent."""
    values = [v for _labels, v in samples.get(name, [])]
    return sum(values) if values else None


def cache_config(samples: dict) -> dict:
    """num_gpu_blocks, block_size and cache_dtype from vllm:cache_config_info's labels (empty if absent)."""
    for labels, _v in samples.get(CACHE_INFO, []):
        out = {}
        for k in ("num_gpu_blocks", "block_size"):
            if labels.get(k, "").isdigit():
                out[k] = int(labels[k])
        if labels.get("cache_dtype"):
            out["cache_dtype"] = labels["cache_dtype"]
        return out
    return {}


def fetch(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return parse(r.read().decode("utf-8", "replace"))


class Sampler:
    """Samples /metrics every `interval` seconds between start() and stop(); stop() returns the summary."""

    def __init__(self, url: str, interval: float = INTERVAL_S):
        self.url, self.interval = url, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples: list[dict] = []
        self.errors = 0
        self.before: dict = {}

    def start(self) -> Sampler:
        self.before = fetch(self.url)
        self._thread = threading.Thread(target=self._run, name="metrics-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.samples.append(fetch(self.url))
            except OSError:
                self.errors += 1

    def stop(self) -> dict:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        after = fetch(self.url)
        return summarize(self.before, self.samples + [after], after, self.errors)


def summarize(before: dict, samples: list[dict], after: dict, errors: int = 0) -> dict:
    """The KV and queue figures of one point from /metrics samples."""
    usage = [total(s, KV_USAGE) for s in samples]
    running = [total(s, RUNNING) for s in samples]
    waiting = [total(s, WAITING) for s in samples]
    busy = [u for u, r in zip(usage, running) if u is not None and r]
    p0, p1 = total(before, PREEMPTIONS), total(after, PREEMPTIONS)
    present = [x for x in usage if x is not None]
    return {
        "kv_cache_usage_max": max(present) if present else None,
        "kv_cache_usage_mean_busy": statistics.fmean(busy) if busy else None,
        "num_requests_running_max": max((x for x in running if x is not None), default=None),
        "num_requests_waiting_max": max((x for x in waiting if x is not None), default=None),
        "num_preemptions": None if p0 is None or p1 is None else p1 - p0,
        "metrics_samples": len(samples),
        "metrics_errors": errors,
    }
