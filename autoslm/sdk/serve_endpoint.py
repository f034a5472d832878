"""Where a serve answers and how to talk to it: its OpenAI endpoint (the URL its pod's heartbeat names,
or, for a vendor whose status names it, the provider's), the token it needs, a ready `curl` line, and
one chat request. It reads the registry, the store and the provider's status; it starts nothing.
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

from autoslm.controller.status import RunStatus
from autoslm.errors import UsageError
from autoslm.layout import endpoint_of


class Endpoint(NamedTuple):
    """A serve's OpenAI endpoint: its base URL (None until the server answers), the LoRA module's name,
    and the variable whose token a request must carry as a bearer (None: the URL needs none)."""

    url: str | None
    model: str
    token_env: str | None = None

    def headers(self, environ=None) -> dict[str, str]:
        """The request headers: the bearer from the environment where the endpoint needs one."""
        import os

        if not self.token_env:
            return {}
        token = (environ if environ is not None else os.environ).get(self.token_env)
        if not token:
            raise UsageError(
                f"the serve at {self.url} answers only with a token, and {self.token_env} is not set",
                hint=f"export {self.token_env}=... (the token the serve was launched with)",
            )
        return {"Authorization": f"Bearer {token}"}


def endpoint(client, serve_run_id: str, st: RunStatus | None = None) -> Endpoint:
    """The serve's endpoint once its server answers: the URL the pod's heartbeat names, or, for a vendor
    whose status names it (``Capabilities.endpoint_from``), the URL the provider's status of the pod gives.
    ``st``: the serve's status, where the caller has just read it."""
    from autoslm.providers import VENDORS

    st = st if st is not None else client.status(serve_run_id)
    spec = client.resolve(serve_run_id).spec  # a ServeSpec
    model = spec.adapter.lora_name
    url = endpoint_of(st.first_seed.message) if st.first_seed and st.state.live else None
    reps = client.registry.replicas(serve_run_id)
    vendor = VENDORS.get(reps[0].provider or "") if reps else None
    if url is None or vendor is None or vendor.capabilities.endpoint_from != "status":
        return Endpoint(url, model)
    return Endpoint(provider_url(client, reps[0], spec.port), model, vendor.capabilities.endpoint_token_env)


def as_reached(client, st: RunStatus) -> RunStatus:
    """``st`` as `status` shows it: a live serve whose vendor names its endpoint in the provider's status
    (``Capabilities.endpoint_from``: Jobs) says that URL, and the token it needs, instead of the address
    the server has inside its pod, which nothing outside reaches."""
    import dataclasses

    from autoslm.errors import ProviderError

    first = st.first_seed
    inside = endpoint_of(first.message) if first is not None and st.state.live else None
    if inside is None:
        return st
    try:
        found = endpoint(client, st.run_id, st)
    except ProviderError:
        return st
    if found.url is None or found.url == inside:
        return st
    token = f"; requests send ${found.token_env} as a bearer token" if found.token_env else ""
    said = dataclasses.replace(first, message=f"serving {found.url} (model {found.model}{token})")
    serve = None if st.serve is None else dataclasses.replace(st.serve, endpoint=found.url)
    return dataclasses.replace(st, seeds=(said, *st.seeds[1:]), serve=serve)


def provider_url(client, rep, port: int) -> str | None:
    """The OpenAI base URL of ``port`` as the provider's status of the replica's pod names it (None: none yet)."""
    from autoslm.providers.base import PodHandle

    if not rep.pod_id:
        return None
    urls = client.providers(rep.provider).status(PodHandle(rep.provider, rep.pod_id)).urls
    named = [u for u in urls if re.search(rf"--{port}(?:[./]|$)", u)] or (list(urls) if len(urls) == 1 else [])
    return named[0].rstrip("/") + "/v1" if named else None


def wait_endpoint(client, run_id: str, *, timeout_s: float, poll_s: float = 1.0) -> tuple[Endpoint | None, RunStatus]:
    """(the endpoint once it answers, else None; the serve's last status): returns when it answers, when
    the serve is no longer live, or after ``timeout_s``."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        st = client.status(run_id)
        found = endpoint(client, run_id, st)
        if found.url or not st.state.live or time.monotonic() >= deadline:
            return (found if found.url else None), st
        time.sleep(poll_s)


def curl_line(url: str, model: str, token_env: str | None = None) -> str:
    """A ready `curl` for the endpoint; where it needs a token, the variable's name (never the token)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 64})
    auth = f' -H "Authorization: Bearer ${token_env}"' if token_env else ""
    return f"curl -s {url}/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'"


def chat_remote(
    url: str,
    model: str,
    messages: list[dict],
    *,
    temperature: float,
    max_tokens: int,
    timeout: float = 600,
    headers: dict[str, str] | None = None,
) -> str:
    """One answer from a serve's endpoint (OpenAI chat/completions); ``headers``: ``Endpoint.headers()``."""
    import httpx

    from autoslm.errors import ProviderUnavailable

    try:
        r = httpx.post(
            f"{url}/chat/completions",
            timeout=timeout,
            headers=headers or {},
            json={"model": model, "messages": messages, "temperature": temperature, "max_tokens": max_tokens},
        )
        r.raise_for_status()
        return r.json()["choices"][0]["message"]["content"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise ProviderUnavailable(f"the serve at {url} did not answer: {type(e).__name__}: {e}") from None
