"""Hugging Face Jobs as a compute provider: a pod is a job, its GPU a flavor (``data.FLAVORS``).

``HFJobsProvider`` turns ``client.JobsClient`` into the Provider contract (``autoslm.providers.base``).

How it differs from RunPod and Vast, and what it does about it:

- The token that holds the run's store (``HF_TOKEN``) rents the GPU. It reaches the job as a job
  secret, never in its environment (which the API echoes to anyone who reads the job); so do the
  other secrets the pod needs (``autoslm.secrets.SECRET_ENV_VARS``).
- One price per flavor (``list_jobs_hardware``: per minute, shown per hour), billed while the job runs:
  its status's durations say from when and how long (``client.billed``), so the time it waits for a machine
  (SCHEDULING) is not billed, and the worker's money clock starts when its command does (the job gets no
  ``AUTOSLM_BILLED_FROM``). No interruptible machines, no bids, no hosts, no disk choice
  (``data.NOT_APPLICABLE``).
- A job ends when its command exits (nothing restarts it, nothing is left to bill): the worker does
  not end it itself. A job has no exit code: the store's heartbeats and DONE decide success.
- Every job carries ``timeout``: the run's time left (``PodRequest.deadline``) plus a margin, so the platform ends a job the
  in-pod watchdog could not end (the Jobs default of 30 minutes would end a training run).
- A serve's port is exposed through the Jobs proxy (``run_job(expose=...)``), behind the Hub token:
  its URL (``https://<job id>--<port>.hf.jobs``) comes from the job's status (``PodStatus.urls``),
  and the job's timeout is the serve's TTL (a request with ``serving``: its deadline) plus
  ``data.SERVE_TIMEOUT_MARGIN_S``.
- Labels carry the pod name, run id, home and attempt: create-once (``providers/createonce.py``) and
  ``gc`` find jobs by label, since job names need not be unique.
- A replica of several pods (``compute.nodes``) is that many jobs in one network group (``group.py``):
  one handle for all of them, whose id is theirs joined by ``+``, node 0 first.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from autoslm import catalog
from autoslm.errors import NoCapacity, ProviderAuthError, ProviderError, ProvisioningFailed
from autoslm.layout import ENV_BILLED_FROM, ENV_PRICE_PER_HOUR
from autoslm.providers.base import (
    POD_LABEL,
    GpuWish,
    Offer,
    PodHandle,
    PodRequest,
    PodStatus,
    check_pod_name,
    planned_offers,
)
from autoslm.providers.createonce import CreateOnce, window_s
from autoslm.providers.hfjobs import group
from autoslm.providers.hfjobs.client import JobsClient, billed
from autoslm.providers.http import DEFAULT_RETRY, ApiStatusError, RetryPolicy, check_pod_env
from autoslm.vendors.hfjobs import data

_POD_NAME = re.compile(rf"^{POD_LABEL}-(?P<run>.+)-s(?P<seed>\d+)-a(?P<attempt>\d+)(?:-h(?P<home>[0-9a-f]{{8}}))?$")


class HFJobsProvider:
    """Jobs on the Hub. Construct with ``from_env()`` in the product; tests pass ``base_url``, ``sleep``, ``clock``."""

    name = data.NAME

    def __init__(
        self,
        token: str,
        base_url: str = data.DEFAULT_URL,
        *,
        namespace: str | None = None,
        timeout_s: float = 30.0,
        retry: RetryPolicy = DEFAULT_RETRY,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        timeout_margin_s: float = data.TIMEOUT_MARGIN_S,
        min_timeout_s: float = data.MIN_TIMEOUT_S,
    ):
        self._token = token
        self._wall = wall
        self.timeout_margin_s = timeout_margin_s
        self.min_timeout_s = min_timeout_s
        self.client = JobsClient(base_url, token, namespace=namespace, timeout_s=timeout_s, retry=retry, sleep=sleep, clock=clock)
        self.create_window_s = window_s(retry, timeout_s)
        self.once = CreateOnce(
            data.TITLE,
            retry,
            sleep,
            self._live_named,
            lambda j: str(j["id"]),
            lambda jid: self.terminate(PodHandle(self.name, jid)),
        )
        self._prices: dict[str, float] = {}  # flavor -> $/h, as last listed

    @classmethod
    def from_env(cls, **kwargs: Any) -> "HFJobsProvider":
        """Token from HF_TOKEN (or credentials.toml [huggingface], or the Hub login); the Jobs API at
        AUTOSLM_HFJOBS_URL, else the Hub endpoint (HF_ENDPOINT)."""
        token = hub_token()
        if not token:
            raise ProviderAuthError(
                f"no {data.TITLE} token: set {data.KEY_ENV}", hint=f"create a token with the Jobs permission at {data.KEY_WHERE}"
            )
        kwargs.setdefault("base_url", jobs_url())
        return cls(token, **kwargs)

    @classmethod
    def keyless(cls) -> "HFJobsListPrices":
        """Without a token, for `plan`: the flavors at their list prices (``Capabilities.keyless``)."""
        return HFJobsListPrices()

    def close(self) -> None:
        pass

    # -- Provider ----------------------------------------------------------------------------------

    def offers(self, wish: GpuWish, *, lookup: bool = False) -> list[Offer]:
        """One offer per GPU flavor with ``wish.gpu_count`` GPUs that matches the wishes, cheapest first."""
        listed = []
        for hw in self.client.hardware(lookup=lookup):
            known = data.FLAVORS.get(hw["name"])
            if not hw["gpu"] and known is None:
                continue  # a CPU flavor
            per_hour = hw["unit_cost_usd"] * {"minute": 60.0, "second": 3600.0}.get(hw["unit_label"], 1.0)
            count = hw["count"] or (known.count if known else 1)
            gpu = known.gpu if known else data.ACCELERATOR_NAMES.get(hw["gpu"], hw["gpu"])
            vram = known.vram_gb if known else (hw["vram_gb"] or 0) / max(1, count)
            listed.append((data.Flavor(hw["name"], gpu, count, vram, round(per_hour, 4)), hw["ram_gb"]))
        self._prices.update({f.name: f.price_per_hour for f, _ in listed})
        return flavor_offers(wish, listed)

    def launch(self, request: PodRequest, offers: tuple[Offer, ...] | None = None) -> PodHandle:
        """Create the attempt's job on the first of ``offers`` (the plan's flavors) that can be had, or of its
        own where there is no plan, and return at once; called again with the same ``request.name``, the same job.
        ``request.wish.nodes`` jobs in one network group where it asks for several (``group.launch_group``)."""
        self._check_request(request)
        if request.wish.nodes > 1:
            return group.launch_group(self, request, offers)
        existing = self.once.existing(request.name)
        if existing is not None:
            return self._handle(existing)
        refused: list[str] = []
        for offer in self._candidates(request, offers):
            flavor = offer.offer_id or ""
            send = self._sender(request, offer)
            try:
                answer, found, unsure = self.once.create(request.name, send, f"creating job {request.name}")
            except ApiStatusError as e:
                if e.status in (400, 404, 422) and "flavor" in e.detail.lower():
                    refused.append(f"{flavor}: {e.detail}")
                    continue  # this flavor cannot be had now: the next one
                raise ProviderError(
                    f"{data.TITLE} refused job {request.name}: {e.detail}", hint="check compute.image and compute.gpu"
                ) from None
            job = found if found is not None else answer
            if job["stage"] in ("ERROR", "CANCELED", "DELETED"):
                self._try_cancel(job["id"])
                raise ProvisioningFailed(
                    f"{data.TITLE} job {job['id']} ({request.name}) failed as it was created: "
                    f"{job['message'] or job['stage'].lower()}",
                    pod_id=job["id"],
                )
            if unsure:
                self.once.drop_duplicates(request.name, keep=job["id"])
            handle = self._handle(job)
            if not handle.price_per_hour:
                handle = PodHandle(
                    self.name,
                    handle.pod_id,
                    price_per_hour=offer.price_per_hour,
                    gpu=offer.gpu,
                    name=request.name,
                    price_source="offer at launch",
                    created_at=handle.created_at,
                )
            return handle
        raise NoCapacity(
            f"{data.TITLE} could not start {request.name}: " + "; ".join(refused)[:500],
            hint="try again later, or add GPU types to compute.gpu",
        )

    def status(self, handle: PodHandle) -> PodStatus:
        """The job's status; a group's (several ids, or one job of a group) over every node's job."""
        ids = group.member_ids(handle.pod_id)
        jobs = {pid: self.client.inspect(pid) for pid in ids}
        known = [j for j in jobs.values() if j is not None]
        if len(ids) == 1 and not (known and group.size_of(known[0]) > 1):
            if not known:
                return PodStatus("terminated", f"{data.TITLE} no longer knows job {handle.pod_id}")
            return self._status(known[0])
        nodes = max([len(ids), *(group.size_of(j) for j in known)])
        by_node = group.by_node(known)
        return group.status_of(nodes, by_node, dict(enumerate(ids)), self._group_price(known), self._message)

    def terminate(self, handle: PodHandle) -> None:
        """Cancel the job, or every job of a group; one that is gone or finished is success. Each is asked
        even when one is refused; the first refusal is raised then."""
        refused: list[ProviderError] = []
        for pid in group.member_ids(handle.pod_id):
            try:
                self.client.cancel(pid)
            except ProviderError as e:
                refused.append(e)
        if refused:
            raise refused[0]

    def list_pods(self, label: str = POD_LABEL) -> list[PodHandle]:
        """autoslm's jobs that are scheduling or running (a finished job bills nothing and needs no end); a
        group once, named as it was created, while any of its jobs is."""
        jobs = [
            j for j in self.client.list({data.LABEL_APP: POD_LABEL}) if _has_label(j["labels"].get(data.LABEL_POD, ""), label)
        ]
        singles, groups = group.split(jobs)
        out = [self._handle(j) for j in singles if j["stage"] in data.BILLED_STAGES]
        for name, members in groups.items():
            if any(j["stage"] in data.BILLED_STAGES for j in members.values()):
                out.append(group.handle(self, name, members))
        return out

    def statuses(self, label: str = POD_LABEL) -> dict[str, PodStatus]:
        """Every autoslm job's status from one list call; a group's under its id (its jobs' ids joined)."""
        jobs = [
            j for j in self.client.list({data.LABEL_APP: POD_LABEL}) if _has_label(j["labels"].get(data.LABEL_POD, ""), label)
        ]
        singles, groups = group.split(jobs)
        out = {j["id"]: self._status(j) for j in singles}
        for members in groups.values():
            nodes = max(group.size_of(j) for j in members.values())
            ids = {n: j["id"] for n, j in members.items()}
            out[group.group_id(members)] = group.status_of(
                nodes, members, ids, self._group_price(members.values()), self._message
            )
        return out

    def pod_logs(self, name: str, *, follow: bool = False) -> Iterator[str]:
        """The log of the attempt's job (``Capabilities.pod_logs``), every job of that name oldest first;
        ``follow``: on until the job ends. Nothing for a name no job has, nor (unless followed) for a job
        still waiting for a machine. A group's: its node 0's job's (rank 0 writes what the run says), after
        a line that says so and names the other nodes' jobs."""
        jobs = sorted(self.client.list({data.LABEL_POD: name}), key=lambda j: j["created_at"] or 0.0)
        others = [j for j in jobs if (group.node_of(j) or 0) > 0]
        for job in jobs:
            if job in others or not (follow or job["stage"] != "SCHEDULING"):
                continue
            if others:
                ids = ", ".join(f"node {group.node_of(j)}: {j['id']}" for j in others)
                yield f"[autoslm] {name}: node 0's log (job {job['id']}); the other nodes' jobs: {ids}"
            yield from self.client.logs(job["id"], follow=follow)

    # -- helpers -----------------------------------------------------------------------------------

    def _check_request(self, request: PodRequest) -> None:
        check_pod_name(request.name)
        if request.wish.nodes > 1 and request.serving is not None:
            raise ProviderError(f"{data.TITLE} serves from one job, but {request.name} asks for {request.wish.nodes}")
        if request.wish.interruptible:
            # NoCapacity (not a plain ProviderError) so a failover list moves on to a vendor that has them.
            raise NoCapacity(data.NOT_INTERRUPTIBLE_WHY, hint='set compute.interruptible = false, or use provider = "vast"')
        if not request.wish.gpu_types:
            raise ProviderError(f"{data.TITLE} needs a GPU type", hint='set compute.gpu, e.g. gpu = "L4"')
        env, _ = split_secrets(request.env)
        check_pod_env(env, self._token, data.TITLE)

    def _candidates(self, request: PodRequest, offers: tuple[Offer, ...] | None) -> list[Offer]:
        planned = planned_offers(request, offers, data.TITLE)
        if planned is not None:
            return planned
        wish = request.wish
        found = sorted(self.offers(wish), key=lambda o: (o.extra.get("preference", 0), o.price_per_hour))
        if not found:
            raise NoCapacity(
                f"{data.TITLE} has no usable flavor for {request.name} ({wish.gpu_count}x {'/'.join(wish.gpu_types)})",
                hint=f"flavors: {', '.join(data.FLAVORS)}; `autoslm plan` says why",
            )
        return found

    def _sender(
        self,
        request: PodRequest,
        offer: Offer,
        *,
        env: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        network: tuple[str, str | None] | None = None,
    ) -> Callable[[], dict]:
        """The create of one job of the attempt; a group's node passes its own ``env`` and ``labels`` (added
        to the attempt's) and its ``network`` (the group, and the alias it claims)."""
        env, secrets = split_secrets(request.env if env is None else env)
        env.setdefault(ENV_PRICE_PER_HOUR, f"{offer.price_per_hour:.4f}")
        # Billed from when the job runs, not from the create: the worker counts its money from its own start.
        env.pop(ENV_BILLED_FROM, None)
        secrets.setdefault(data.KEY_ENV, self._token)
        image = data.BOOTSTRAP_IMAGE if request.bootstrap else request.image or catalog.default_worker_image()
        labels = {**job_labels(request.name), **(labels or {})}
        timeout_s = self.job_timeout_s(request)
        ports = list(request.serving.ports) if request.serving is not None else []
        joins = {"network_group": network[0], "network_aliases": [network[1]] if network[1] else None} if network else {}

        def send() -> dict:
            return self.client.run(
                image=image,
                command=list(request.command),
                env=env,
                secrets=secrets,
                flavor=offer.offer_id or "",
                timeout_s=timeout_s,
                labels=labels,
                expose=ports,
                **joins,
            )

        return send

    def job_timeout_s(self, request: PodRequest) -> int:
        """The job's own timeout: the run's time left (``request.deadline``) plus a margin; at least
        ``min_timeout_s``. A run without a deadline gets a day: a job is never left with the platform's
        30-minute default. A serve (``request.serving``) has no end to save: its TTL plus
        ``data.SERVE_TIMEOUT_MARGIN_S``."""
        if request.serving is not None:
            margin = floor = float(data.SERVE_TIMEOUT_MARGIN_S)
        else:
            margin, floor = self.timeout_margin_s, self.min_timeout_s
        left = request.deadline - self._wall() if request.deadline else 24 * 3600.0
        return int(max(floor, left + margin))

    def _try_cancel(self, job_id: str) -> None:
        try:
            self.client.cancel(job_id)
        except ProviderError:
            pass  # gc finds it by label

    def _live_named(self, name: str) -> list[dict]:
        """The attempt's jobs that are not cancelled or deleted, oldest first (for ``CreateOnce``)."""
        jobs = [j for j in self.client.list({data.LABEL_POD: name}) if j["stage"] not in ("CANCELED", "DELETED")]
        return sorted(jobs, key=lambda j: j["created_at"] or 0.0)

    def _price(self, flavor: str) -> float | None:
        if flavor in self._prices:
            return self._prices[flavor]
        known = data.FLAVORS.get(flavor)
        return known.price_per_hour if known else None

    def _handle(self, job: dict) -> PodHandle:
        flavor = data.FLAVORS.get(job["flavor"])
        price = self._price(job["flavor"])
        return PodHandle(
            self.name,
            job["id"],
            price_per_hour=price,
            gpu=flavor.gpu if flavor else job["flavor"] or None,
            name=job["labels"].get(data.LABEL_POD),
            price_source="provider" if price else None,
            created_at=job["created_at"],
        )

    def _group_price(self, jobs) -> float | None:
        """One job's price for a group's jobs (they share a flavor)."""
        return next((self._price(j["flavor"]) for j in jobs), None)

    @staticmethod
    def _message(job: dict) -> str:
        return f"Hugging Face job {job['stage'].lower() or 'unknown'}" + (f": {job['message']}" if job["message"] else "")

    def _status(self, job: dict) -> PodStatus:
        stage = job["stage"]
        message = self._message(job)
        price = self._price(job["flavor"]) if stage in data.BILLED_STAGES else None
        urls = tuple(job["urls"]) if stage == "RUNNING" else ()  # the exposed ports answer only while it runs
        return PodStatus(data.flavor_stage(stage), message, price_per_hour=price, urls=urls, billed=billed(job))


def flavor_offers(wish: GpuWish, flavors: list[tuple[data.Flavor, float | None]], *, location: str = "hf") -> list[Offer]:
    """Offers for the flavors with ``wish.gpu_count`` GPUs that match the wishes (a catalog GPU name or a
    flavor name), under the price ceiling, cheapest first."""
    out = []
    for flavor, ram in flavors:
        rank = wish_rank(wish.gpu_types, flavor)
        if rank is None or flavor.count != wish.gpu_count:
            continue
        if wish.max_price_per_hour is not None and flavor.price_per_hour > wish.max_price_per_hour:
            continue
        out.append(
            Offer(
                provider=data.NAME,
                gpu=flavor.gpu,
                gpu_count=flavor.count,
                vram_gb=float(flavor.vram_gb),
                price_per_hour=flavor.price_per_hour,
                interruptible=data.INTERRUPTIBLE,
                offer_id=flavor.name,
                location=location,
                ram_gb=ram,
                extra={"flavor": flavor.name, "preference": rank},
            )
        )
    return sorted(out, key=lambda o: (o.price_per_hour, o.extra["preference"]))


def wish_rank(wishes: tuple[str, ...], flavor: data.Flavor) -> int | None:
    """Where a flavor stands in the wishes (0 first); None when no wish names it. No wishes: any GPU."""
    if not wishes:
        return 0
    for rank, wish in enumerate(wishes):
        if wish.strip().lower() == flavor.name or _norm(wish) == _norm(flavor.gpu):
            return rank
        info = catalog.gpu_info(wish)
        if info is not None and info.name == flavor.gpu:
            return rank
    return None


def split_secrets(env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """A pod's environment as (plain variables, secrets): secrets travel as job secrets only."""
    from autoslm.secrets import SECRET_ENV_VARS

    plain, secret = {}, {}
    for k, v in env.items():
        (secret if k in SECRET_ENV_VARS or k.startswith("AUTOSLM_SECRET_") else plain)[k] = v
    return plain, secret


def job_labels(pod_name: str) -> dict[str, str]:
    """The labels a job carries: autoslm's, the pod name, and its run, home and attempt where the name says."""
    labels = {data.LABEL_APP: POD_LABEL, data.LABEL_POD: pod_name}
    m = _POD_NAME.match(pod_name)
    if m:
        labels[data.LABEL_RUN] = m.group("run")
        labels[data.LABEL_ATTEMPT] = m.group("attempt")
        if m.group("home"):
            labels[data.LABEL_HOME] = m.group("home")
    return labels


def hub_token() -> str | None:
    """HF_TOKEN, else credentials.toml's [huggingface] api_key, else the Hub login (``hf auth login``)."""
    from autoslm.secrets import provider_key

    token = provider_key(data.KEY_ENV, data.KEY_SECTION)
    if token:
        return token
    try:
        from huggingface_hub import get_token

        return get_token()
    except Exception:  # noqa: BLE001 - no login is fine: the caller says what is missing
        return None


def jobs_url() -> str:
    return (os.environ.get(data.URL_ENV) or os.environ.get(data.HUB_ENDPOINT_ENV) or data.DEFAULT_URL).rstrip("/")


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", ""))


def _has_label(name: str, label: str) -> bool:
    return name == label or name.startswith(label + "-")


class HFJobsListPrices:
    """`autoslm plan` without a token: the flavors at their list prices (``data.FLAVORS``), marked as such."""

    name = data.NAME
    note = f"list price ({data.LIST_PRICES_AS_OF}; set {data.KEY_ENV} for the live list)"

    def offers(self, wish: GpuWish, *, lookup: bool = False) -> list[Offer]:
        return flavor_offers(wish, [(f, None) for f in data.FLAVORS.values()], location="catalog")
