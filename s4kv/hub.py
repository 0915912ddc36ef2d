"""Fetching a model's config from the Hugging Face Hub for `s4kv validate`, with failures told apart.

vLLM's own config loading turns every hub failure (a 503, a rate limit, no DNS, a missing repo)
into one ``ValueError("Invalid repository ID or local directory ...")``, so a caller cannot tell
"try again later" from "this model does not exist". The validator's callers must (the deploy
launcher retries the first, exit 75, and refuses the second, exit 78), so the config is fetched
here first, with huggingface_hub (which caches it where vLLM then finds it), and the failure is
classified by the exception chain:

* :class:`HubUnavailable` (transient): an HTTP 429 or 5xx, or the connection itself failing
  (DNS, refused, timeout);
* :class:`ConfigNotFound` (permanent): the hub answered 4xx (no such repo or file, gated,
  private), offline mode with nothing cached, or a local directory without a config.
"""

from __future__ import annotations

import os

CONFIG_FILES = ("config.json", "params.json")  # Hugging Face, Mistral


class HubUnavailable(RuntimeError):
    """The hub could not be asked now; the same request may succeed later."""


class ConfigNotFound(RuntimeError):
    """There is no config to validate at this name (as far as the hub or the disk says)."""


def _chain(e: BaseException):
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _status(e: BaseException) -> int | None:
    code = getattr(getattr(e, "response", None), "status_code", None)
    return code if isinstance(code, int) else None


def _http_status(e: BaseException) -> int | None:
    """The first HTTP status anywhere in the exception chain (None: no HTTP answer)."""
    return next((code for c in _chain(e) if (code := _status(c)) is not None), None)


def _connection_failure(e: BaseException) -> bool:
    """A failure to reach the server at all: OS-level (DNS, refused, timeouts) or the HTTP client's
    transport errors (httpx names them *ConnectError, *Timeout*, *NetworkError, *TransportError)."""
    import socket

    if isinstance(e, (socket.gaierror, ConnectionError, TimeoutError)):
        return True
    name = type(e).__name__
    return name.endswith(("ConnectError", "NetworkError", "TransportError")) or "Timeout" in name


def classify(e: BaseException, model: str) -> Exception:
    """The HubUnavailable or ConfigNotFound that `e` (raised while fetching `model`'s config) means;
    ConfigNotFound for anything unrecognized (fail closed: a refusal, not a retry loop)."""
    from huggingface_hub.errors import OfflineModeIsEnabled

    hint = "pass a local directory with its config.json instead"
    for c in _chain(e):
        if isinstance(c, OfflineModeIsEnabled):
            return ConfigNotFound(f"{model}: HF_HUB_OFFLINE is set and its config is not in the local cache; {hint}")
        code = _status(c)
        if code is not None:
            if code == 429 or code >= 500:
                return HubUnavailable(f"{model}: the Hugging Face Hub answered {code}; try again later")
            return ConfigNotFound(f"{model}: the Hugging Face Hub answered {code} (no such model, gated or private; "
                                  f"set HF_TOKEN for a private one, or {hint})")
        if _connection_failure(c):
            return HubUnavailable(f"{model}: the Hugging Face Hub cannot be reached ({type(c).__name__}: {c}); try "
                                  f"again later, or {hint}")
    return ConfigNotFound(f"{model}: its config could not be fetched ({type(e).__name__}: {str(e).splitlines()[0]})")


def ensure_config(model: str, revision: str | None = None) -> None:
    """Make `model`'s config readable by vLLM: a local directory must hold one, a hub id is fetched
    into the local cache. Raises HubUnavailable or ConfigNotFound."""
    if not os.path.isdir(model) and model.startswith(("/", "./", "../", "~")):
        # a path (hub ids are `name` or `org/name`): the hub would only call it an invalid repo id
        raise ConfigNotFound(f"{model}: no such local directory")
    if os.path.isdir(model):
        if not any(os.path.isfile(os.path.join(model, f)) for f in CONFIG_FILES):
            raise ConfigNotFound(f"{model}: a local directory without {' or '.join(CONFIG_FILES)}")
        return
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import logging as hub_logging

    # its retries (429/5xx, backing off for ~25 s) log one warning each; the answer is one line
    hub_logging.set_verbosity_error()
    missing = None
    for name in CONFIG_FILES:
        try:
            hf_hub_download(model, name, revision=revision)
            return
        except Exception as e:
            err = classify(e, model)
            if isinstance(err, HubUnavailable) or _http_status(e) not in (404, None):
                raise err from e
            missing = missing or (err, e)  # a repo without config.json may still have params.json
    raise missing[0] from missing[1]
