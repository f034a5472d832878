"""RunPod as a compute provider, through its REST v2 API (https://api.runpod.io, paths under /v2).

``RunPodApi`` (client.py) speaks RunPod's JSON; ``RunPodProvider`` turns it into the Provider contract
(``autoslm.providers.base``) and ``autoslm.errors``. Vendor JSON never leaves this module.

It must never: create a second pod for one attempt (``providers/createonce.py``: launch is idempotent
by pod name, and a create whose answer was lost is looked up before it is sent again); put the account key into a pod's
environment (RunPod injects a pod-scoped RUNPOD_API_KEY itself, which the worker uses to terminate
its own pod); ask for an interruptible pod (RunPod's v2 API has none: launch raises NoCapacity so a
failover list moves on, and placement marks RunPod unusable for interruptible runs); leave a pod it
could not use running without saying so.

Its own JobSpec setting, ``[compute.options.runpod] cloud`` (``options.RunPodOptions``), reaches it in the
wish: the clouds whose offers it lists.

How the worker starts: the pod runs the image's ENTRYPOINT (worker_image/boot.sh) with
``PodRequest.command`` as its arguments, sent as the create body's ``args`` string (v2 has no separate
command field and no entrypoint override). RunPod splits that string like a shell would, so it is
built with ``shlex.join``. A bootstrap pod (``PodRequest.bootstrap``) runs ``BOOTSTRAP_IMAGE``, which has
no ENTRYPOINT, so ``args`` is the whole command: ``sh -c <boot.sh> ...``, which installs autoslm first.
"""

from __future__ import annotations

import shlex
from typing import Any

from autoslm import catalog
from autoslm.errors import NoCapacity, ProviderAuthError, ProviderError, ProviderRefused, ProvisioningFailed
from autoslm.providers.base import (
    POD_LABEL,
    GpuWish,
    Offer,
    PodHandle,
    PodRequest,
    PodStatus,
    check_pod_name,
    launch_price,
    planned_offers,
)
from autoslm.providers.http import ApiStatusError, check_pod_env
from autoslm.providers.rest import RestProvider
from autoslm.providers.runpod.client import RunPodApi, epoch
from autoslm.providers.runpod.clusters import Clusters
from autoslm.vendors.runpod import BOOTSTRAP_IMAGE, DEFAULT_URL, KEY_ENV, URL_ENV, VENDOR

_STATES = {
    "PROVISIONING": "pending",
    "STARTING": "pending",
    "RUNNING": "running",
    "EXITED": "exited",
    "ERROR": "exited",  # unrecoverable container error: the pod still exists (and bills disk) until terminated
    "TERMINATED": "terminated",
}
_CLOUDS = {"secure": ("SECURE",), "community": ("COMMUNITY",), "all": ("SECURE", "COMMUNITY")}
_USABLE = {"LOW", "MEDIUM", "HIGH"}


class RunPodProvider(RestProvider):
    """RunPod pods. Construct with ``from_env()`` in the product; tests pass ``base_url``, ``sleep``, ``clock``."""

    name = "runpod"
    vendor, title, api_class = VENDOR, "RunPod", RunPodApi
    default_url, key_env, url_env = DEFAULT_URL, KEY_ENV, URL_ENV

    # -- Provider ----------------------------------------------------------------------------------

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.clusters = Clusters(self)

    def launch(self, request: PodRequest, offers: tuple[Offer, ...] | None = None) -> PodHandle:
        """Request a pod (several pods of one replica: one Instant Cluster, ``clusters.py``) and return at
        once, on the first of ``offers`` (the plan's) that RunPod places, or of its own where there is no
        plan. Calling it again with the same ``request.name`` returns the same pod (or cluster)."""
        self._check_request(request)
        group = request.wish.nodes > 1
        existing = (self.clusters.once if group else self.once).existing(request.name)
        if existing is not None:
            # An earlier call created it and its answer was lost (or the caller crashed before recording
            # the handle): adopting it is what keeps "one attempt = one paid pod" true.
            return self.clusters.handle(existing) if group else self._handle(existing)

        candidates = self._candidates(request, offers)
        refused: list[str] = []
        last: ApiStatusError | None = None
        for offer in candidates:
            cloud = offer.extra["cloud"]
            try:
                return self._create(request, offer, group)
            except ApiStatusError as e:
                last = e
                if e.status == 400:
                    # "Could not be placed" (no capacity) or a rule the request breaks: the API
                    # reference says to try the next candidate either way (decided after the loop).
                    refused.append(f"{offer.gpu} ({cloud.lower()}): {e.detail}")
                    continue
                if e.status == 403:
                    refused.append(f"{offer.gpu} ({cloud.lower()}): your account cannot use this pool")
                    continue
                if e.status == 422:
                    raise ProviderError(
                        f"RunPod rejected the pod request as invalid: {e.detail}",
                        hint="this is a bug in autoslm: please report it",
                    ) from None
                raise

        if last is not None and last.status == 400 and not _means_no_capacity(last.detail):
            # RunPod's reference: when every candidate answers 400, read the last detail as a problem
            # with the request (it fails the same on every GPU), not as absent capacity.
            raise ProviderError(
                f"RunPod refused the pod request for {request.name}: {last.detail}",
                hint="check compute.image, compute.disk_gb and the JobSpec's size",
            )
        if last is not None and last.status == 403 and all("cannot use" in r for r in refused):
            raise ProviderAuthError(
                f"RunPod refused every GPU pool for {request.name}: your key cannot create pods there",
                hint=f"check {KEY_ENV}'s permissions",
            )
        raise NoCapacity(
            f"RunPod could not place {_shape(request.wish)}: " + "; ".join(refused)[:500],
            hint='try again later, add GPU types to compute.gpu, or add "vast" to compute.provider',
        )

    def status(self, handle: PodHandle) -> PodStatus:
        """A pod's status; a cluster's (a handle names one by its id) is its members' as one pod's."""
        if handle.pod_id in self.clusters.known:
            return self.clusters.status(handle.pod_id) or PodStatus(
                "terminated", f"RunPod no longer knows cluster {handle.pod_id}"
            )
        try:
            pod = self.api.get_pod(handle.pod_id)
        except ApiStatusError as e:
            if e.status == 404:  # no such pod: a cluster's id, or gone
                return self.clusters.status(handle.pod_id) or PodStatus(
                    "terminated", f"RunPod no longer knows pod {handle.pod_id}"
                )
            raise
        return self._status(pod)

    def terminate(self, handle: PodHandle) -> None:
        """End the pod, or the cluster (all its pods) the handle names. Idempotent."""
        if handle.pod_id in self.clusters.known:
            self.clusters.terminate(handle.pod_id)
            return
        try:
            self.api.delete_pod(handle.pod_id)
        except ApiStatusError as e:
            if e.status == 404:  # no such pod: a cluster's id, or already gone (terminate is idempotent)
                self.clusters.terminate(handle.pod_id)
                return
            if e.status == 409:
                raise ProviderError(
                    f"RunPod will not terminate pod {handle.pod_id} through the pod API: {e.detail}",
                    hint=f"terminate pod {handle.pod_id} manually in the RunPod console",
                ) from None
            raise

    def list_pods(self, label: str = POD_LABEL) -> list[PodHandle]:
        """Every pod of the label, and every cluster of it as one handle named as it was created."""
        singles, members = self._every_pod()
        out = [self._handle(p) for p in singles if _has_label(p.get("name") or "", label) and p.get("status") != "TERMINATED"]
        return out + [self.clusters.handle(c, ms) for c, ms in self.clusters.listed(label, members, _has_label)]

    def statuses(self, label: str = POD_LABEL) -> dict[str, PodStatus]:
        """Every autoslm pod's and cluster's status from two list calls (a supervisor ticking many runs shares them)."""
        singles, members = self._every_pod()
        out = {str(p["id"]): self._status(p) for p in singles if _has_label(p.get("name") or "", label)}
        return out | {str(c["id"]): self.clusters.group(c, ms) for c, ms in self.clusters.listed(label, members, _has_label)}

    def offers(self, wish: GpuWish, *, lookup: bool = False) -> list[Offer]:
        """GPU types in stock that match the wishes, cheapest first. RunPod quotes one price per GPU type and cloud.
        ``lookup``: only a look at prices (`autoslm plan`): tried once, no back-off. Several pods of one
        replica: an Instant Cluster's stock and prices (``clusters.py``), one pod's price each."""
        wanted = self._wanted_ids(wish)
        if wish.nodes > 1:
            if VENDOR.options_in(wish).cloud == "community":
                return []  # clusters are in RunPod's secure cloud only (_check_request says so at launch)
            return self.clusters.offers(wish, wanted, lookup=lookup)
        out: list[Offer] = []
        for cloud in _CLOUDS.get(VENDOR.options_in(wish).cloud, ("SECURE",)):
            for g in self.api.gpu_types(cloud=cloud, count=wish.gpu_count, min_cuda=self.min_cuda, lookup=lookup):
                gid = g.get("id")
                if gid not in wanted or g.get("availability", "HIGH") not in _USABLE:
                    continue
                if (
                    not g.get(cloud.lower(), True)
                    or (g.get("maxCount") or {}).get(cloud.lower(), wish.gpu_count) < wish.gpu_count
                ):
                    continue
                unit = (g.get("price") or {}).get(cloud.lower())
                if unit is None:
                    continue
                price = float(unit) * wish.gpu_count
                if wish.max_price_per_hour is not None and price > wish.max_price_per_hour:
                    continue
                info = catalog.gpu_info(gid)
                out.append(
                    Offer(
                        provider=self.name,
                        gpu=info.name if info else str(g.get("name") or gid),
                        gpu_count=wish.gpu_count,
                        vram_gb=float(g.get("memory") or (info.vram_gb if info else 0)),
                        price_per_hour=round(price, 4),
                        interruptible=False,
                        offer_id=f"{gid}|{cloud}",
                        location=cloud.lower(),
                        extra={"gpu_id": gid, "cloud": cloud, "availability": g.get("availability"), "preference": wanted[gid]},
                    )
                )
        return sorted(out, key=lambda o: (o.price_per_hour, o.extra["preference"]))

    # -- helpers -----------------------------------------------------------------------------------

    def _check_request(self, request: PodRequest) -> None:
        check_pod_name(request.name)
        if request.wish.nodes > 1 and VENDOR.options_in(request.wish).cloud == "community":
            raise ProviderError(
                f"RunPod's Instant Clusters (compute.nodes = {request.wish.nodes}) run in its secure cloud only",
                hint='set [compute.options.runpod] cloud = "secure" (or "all")',
            )
        if request.wish.interruptible:
            # NoCapacity (not a plain ProviderError) so a failover list ["runpod", "vast"] moves on to Vast.
            raise NoCapacity(
                VENDOR.capabilities.not_interruptible,
                hint='set compute.interruptible = false, or use provider = "vast" for interruptible GPUs',
            )
        if not request.wish.gpu_types:
            raise ProviderError("RunPod needs a GPU type", hint='set compute.gpu, e.g. gpu = "RTX 4090"')
        check_pod_env(request.env, self._key, "RunPod")

    def _wanted_ids(self, wish: GpuWish) -> dict[str, int]:
        """RunPod GPU ids in preference order (id -> rank)."""
        out: dict[str, int] = {}
        for rank, name in enumerate(wish.gpu_types):
            gid = catalog.gpu_id("runpod", name)
            if gid and gid not in out:
                out[gid] = rank
        return out

    def _candidates(self, request: PodRequest, offers: tuple[Offer, ...] | None) -> list[Offer]:
        """What to try, in order: the offers the run's plan found usable, else every offer in stock in the
        user's preference order (the catalog already filtered by the ceiling)."""
        planned = planned_offers(request, offers, VENDOR.title)
        if planned is not None:
            return planned
        wish = request.wish
        cloud = VENDOR.options_in(wish).cloud
        found = self.offers(wish)
        if not found:
            ceiling = f" under ${wish.max_price_per_hour:g}/h" if wish.max_price_per_hour is not None else ""
            raise NoCapacity(
                f"RunPod has no {wish.gpu_count}x {'/'.join(wish.gpu_types)} in stock ({cloud} cloud){ceiling}",
                hint='try again later, add GPU types to compute.gpu, raise compute.max_price_per_hour, or add "vast" to compute.provider',
            )
        order = {c: i for i, c in enumerate(_CLOUDS.get(cloud, ("SECURE",)))}
        return sorted(found, key=lambda o: (o.extra["preference"], order[o.extra["cloud"]]))

    def _create(self, request: PodRequest, offer: Offer, group: bool) -> PodHandle:
        """One create on ``offer`` (a pod, or a cluster for a group), never sent twice while its answer may be lost."""
        if group:
            body, once, noun = self.clusters.body(request, offer), self.clusters.once, "cluster"
            send = lambda: self.api.create_cluster(body)  # noqa: E731
        else:
            body, once, noun = self._create_body(request, offer), self.once, "pod"
            send = lambda: self.api.create_pod(body)  # noqa: E731
        answer, found, was_unsure = once.create(body["name"], send, f"creating {noun} {body['name']}", refusal=_refusal)
        made = found if found is not None else answer
        handle = self.clusters.accept(made, request, offer) if group else self._accept(made, request, offer)
        if was_unsure:
            once.drop_duplicates(request.name, keep=handle.pod_id)
        return handle

    def image_of(self, request: PodRequest) -> str:
        return BOOTSTRAP_IMAGE if request.bootstrap else request.image or catalog.default_worker_image()

    def _every_pod(self) -> tuple[list[dict], list[dict]]:
        """(the pods, the clusters' member pods) from one listing."""
        pods = self.api.list_pods(cluster_pods=True)
        return [p for p in pods if not p.get("cluster")], [p for p in pods if p.get("cluster")]

    def _create_body(self, request: PodRequest, offer: Offer) -> dict:
        cloud = offer.extra["cloud"]
        gpu: dict[str, Any] = {"id": offer.extra["gpu_id"], "count": request.wish.gpu_count}
        if self.min_cuda:
            gpu["minCudaVersion"] = self.min_cuda
        env = dict(request.env)
        # The in-pod watchdog enforces limits.max_usd from this: only the provider knows the price here.
        env.setdefault("AUTOSLM_PRICE_PER_HOUR", f"{offer.price_per_hour:.4f}")
        body: dict[str, Any] = {
            "name": request.name,
            "image": self.image_of(request),
            "gpu": gpu,
            "cloud": cloud,
            "disk": request.wish.disk_gb,
            "env": env,
        }
        if request.command:
            body["args"] = shlex.join(request.command)
        if request.serving is not None:  # reached through RunPod's proxy: https://<pod id>-<port>.proxy.runpod.net
            body["ports"] = [f"{p}/http" for p in request.serving.ports]
        return body

    def _accept(self, pod: dict, request: PodRequest, offer: Offer) -> PodHandle:
        pod_id = pod.get("id")
        if not pod_id:
            found = self.once.existing(request.name)
            if found is None:
                raise ProvisioningFailed(
                    f"RunPod accepted pod {request.name} but returned no id and lists no such pod",
                    hint=f"check the RunPod console for a pod named {request.name} and terminate it manually",
                )
            pod = found
            pod_id = pod["id"]
        if pod.get("status") in ("ERROR", "TERMINATED"):
            cleaned = self._try_terminate(pod_id)
            raise ProvisioningFailed(
                f"RunPod pod {pod_id} ({request.name}) failed as it was created (status {pod.get('status')})",
                pod_id=pod_id,
                hint=f"pod {pod_id} was terminated" if cleaned else None,
            )
        handle = self._handle(pod)
        if handle.price_per_hour is None or handle.price_per_hour == 0:
            handle = PodHandle(
                self.name, handle.pod_id, price_per_hour=offer.price_per_hour, gpu=handle.gpu or offer.gpu, name=handle.name
            )
        return handle

    def _try_terminate(self, pod_id: str) -> bool:
        try:
            self.terminate(PodHandle(self.name, pod_id))
            return True
        except ProviderError:
            return False

    def _live_named(self, name: str) -> list[dict]:
        """The live pods with this name, oldest first (for ``CreateOnce``)."""
        pods = [p for p in self.api.list_pods() if p.get("name") == name and p.get("status") != "TERMINATED"]
        return sorted(pods, key=lambda p: str(p.get("createdAt") or ""))

    def _handle(self, pod: dict) -> PodHandle:
        gpu = (pod.get("gpu") or {}).get("id")
        info = catalog.gpu_info(gpu) if gpu else None
        cost = pod.get("cost")
        # A stopped pod's list entry says cost 0: its price is then the offer's, written into its env at launch.
        price, source = (float(cost), "provider") if cost else (launch_price(pod.get("env")), "offer at launch")
        return PodHandle(
            self.name,
            str(pod["id"]),
            price_per_hour=price,
            gpu=info.name if info else gpu,
            name=pod.get("name"),
            price_source=source if price else None,
            created_at=epoch(pod.get("createdAt")),
        )

    def _status(self, pod: dict) -> PodStatus:
        raw = str(pod.get("status") or "")
        state = _STATES.get(raw, "unknown")
        where = pod.get("dataCenterId") or ""
        message = f"RunPod {raw.lower() or 'unknown'}" + (f" in {where}" if where else "")
        if raw == "ERROR":
            message = "RunPod reports the container in an unrecoverable error state"
        cost = pod.get("cost")
        return PodStatus(state, message, price_per_hour=float(cost) if cost is not None else None)


# RunPod's wording for "nothing free matches" (the create's 400 carries it); anything else a 400 says
# is a rule the request breaks. Assumed from observed answers: the reference documents only "400".
_CAPACITY_WORDS = (
    "no longer any instances available",
    "not enough",
    "no available",
    "capacity",
    "could not find any",
    "unavailable",
)


def _refusal(e: Exception) -> ProviderRefused | None:
    """A create's definite no (``CreateOnce``'s rule 5): HTTP 402, an account without the balance."""
    if isinstance(e, ApiStatusError) and e.status == 402:
        return ProviderRefused(
            "RunPod refused the pod: insufficient balance (HTTP 402)", hint="add credit at https://console.runpod.io"
        )
    return None


def _shape(wish: GpuWish) -> str:
    """What was asked, in words: "1x RTX 4090", or "a cluster of 2 pods of 1x RTX 4090"."""
    one = f"{wish.gpu_count}x {'/'.join(wish.gpu_types)}"
    return f"a cluster of {wish.nodes} pods of {one}" if wish.nodes > 1 else one


def _means_no_capacity(detail: str) -> bool:
    text = (detail or "").lower()
    return any(w in text for w in _CAPACITY_WORDS)


def _has_label(name: str, label: str) -> bool:
    return name == label or name.startswith(label + "-")
