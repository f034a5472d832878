"""RunPod Instant Clusters: one replica of K pods (``GpuWish.nodes``) as one cluster, for ``provider.py``.

One ``POST /v2/clusters`` (type TRAINING) makes K identical pods of ``gpu_count`` GPUs in one data center
on a private network; RunPod sets the node variables in each (PRIMARY_ADDR/MASTER_ADDR, PRIMARY_PORT/
MASTER_PORT, NODE_RANK, NUM_NODES, NUM_TRAINERS, WORLD_SIZE), which the worker reads; one
``DELETE /v2/clusters/{id}`` ends them all. The replica's handle is the cluster: its id, its name (the
request's), K times one pod's price. Its status is ``base.group_status`` of its members by node rank
(``Pod.cluster.rank``), read from ``GET /v2/clusters/{id}/pods``; a rank the listing no longer has is a
lost pod. The API leaves members out of ``GET /v2/pods`` unless asked, refuses to end them through the
pod endpoints (409), and has no cluster-wide price: the price is the members' ``cost`` summed, else
the one written into their environment at the create.

It must never: create a second cluster for one attempt (the create is looked up by name before it is
sent again, ``createonce.py``, as for a pod); leave members running when the cluster is ended (only the
cluster's DELETE ends them); name a cluster outside the label rule (it is the request's name).
"""

from __future__ import annotations

import shlex
from typing import Any

from autoslm import catalog
from autoslm.providers.base import GpuWish, NodeStatus, Offer, PodHandle, PodRequest, PodStatus, group_status, launch_price
from autoslm.providers.createonce import CreateOnce
from autoslm.providers.http import ApiStatusError
from autoslm.providers.runpod.client import epoch

CLOUD = "SECURE"  # Instant Clusters run in RunPod's own data centers: its create takes no cloud
_USABLE = {"LOW", "MEDIUM", "HIGH"}


class Clusters:
    """The clusters of one ``RunPodProvider`` (its API client, retries and vendor mappings)."""

    def __init__(self, provider: Any):  # the RunPodProvider (provider.py imports this module)
        self.p = provider
        self.api = provider.api
        self.known: set[str] = set()  # ids of clusters this provider made or saw: their handles need no probe
        self.once = CreateOnce(
            "RunPod", provider.retry, provider._sleep, self._live_named, lambda c: str(c["id"]), self._end_quietly
        )

    # -- offers and the create ---------------------------------------------------------------------

    def offers(self, wish: GpuWish, wanted: dict[str, int], *, lookup: bool) -> list[Offer]:
        """GPU types RunPod has in stock for a cluster of ``wish.nodes`` pods, each offer one pod's
        price (a replica costs ``nodes`` times it), with the data centers that have it."""
        out: list[Offer] = []
        gpus = self.api.gpu_types(cloud=CLOUD, count=wish.gpu_count, min_cuda=self.p.min_cuda, lookup=lookup, product="CLUSTER")
        for g in gpus:
            gid = g.get("id")
            if gid not in wanted or g.get("availability", "HIGH") not in _USABLE:
                continue
            unit = (g.get("price") or {}).get("secure")
            if unit is None or (g.get("maxCount") or {}).get("secure", wish.gpu_count) < wish.gpu_count:
                continue
            price = float(unit) * wish.gpu_count
            if wish.max_price_per_hour is not None and price > wish.max_price_per_hour:
                continue
            centers = [d["id"] for d in g.get("dataCenters") or [] if d.get("availability", "HIGH") in _USABLE and d.get("id")]
            info = catalog.gpu_info(gid)
            out.append(
                Offer(
                    provider="runpod",
                    gpu=info.name if info else str(g.get("name") or gid),
                    gpu_count=wish.gpu_count,
                    vram_gb=float(g.get("memory") or (info.vram_gb if info else 0)),
                    price_per_hour=round(price, 4),
                    offer_id=f"{gid}|{CLOUD}",
                    location="secure",
                    extra={"gpu_id": gid, "cloud": CLOUD, "availability": g.get("availability"), "preference": wanted[gid]}
                    | ({"data_centers": centers} if centers else {}),
                )
            )
        return sorted(out, key=lambda o: (o.price_per_hour, o.extra["preference"]))

    def body(self, request: PodRequest, offer: Offer) -> dict:
        """The create: the pod's container settings (image, env, args, ports) for every member."""
        env = dict(request.env)
        # One pod's price, as for a single pod: the worker's guards count compute.nodes of them.
        env.setdefault("AUTOSLM_PRICE_PER_HOUR", f"{offer.price_per_hour:.4f}")
        body: dict[str, Any] = {
            "name": request.name,
            "type": "TRAINING",
            "compute": {
                "gpuTypeId": offer.extra["gpu_id"],
                "gpuCountPerPod": request.wish.gpu_count,
                "podCount": request.wish.nodes,
            },
            "image": self.p.image_of(request),
            "disk": request.wish.disk_gb,
            "env": env,
        }
        if request.command:
            body["args"] = shlex.join(request.command)
        if request.serving is not None:
            body["ports"] = [f"{p}/http" for p in request.serving.ports]
        if offer.extra.get("data_centers"):
            body["dataCenterIds"] = list(offer.extra["data_centers"])
        return body

    def accept(self, cluster: dict | None, request: PodRequest, offer: Offer) -> PodHandle:
        if not (cluster or {}).get("id"):
            cluster = self.once.existing(request.name)
            if cluster is None:
                from autoslm.errors import ProvisioningFailed

                raise ProvisioningFailed(
                    f"RunPod accepted cluster {request.name} but returned no id and lists no such cluster",
                    hint=f"check the RunPod console for a cluster named {request.name} and delete it",
                )
        handle = self.handle(cluster, members=[])
        price = offer.price_per_hour * request.wish.nodes
        return PodHandle(
            handle.provider, handle.pod_id, round(price, 4), handle.gpu or offer.gpu, handle.name, "provider", handle.created_at
        )

    # -- what a cluster is and does ----------------------------------------------------------------

    def handle(self, cluster: dict, members: list[dict] | None = None) -> PodHandle:
        """One handle for the whole cluster; its price from its members (read here when not given)."""
        cid = str(cluster["id"])
        self.known.add(cid)
        if members is None:
            members = self._members(cid) or []
        gid = (cluster.get("compute") or {}).get("gpuTypeId")
        info = catalog.gpu_info(gid) if gid else None
        price, source = _price(members, int((cluster.get("compute") or {}).get("podCount") or len(members) or 1))
        return PodHandle(
            "runpod", cid, price, info.name if info else gid, cluster.get("name"), source, epoch(cluster.get("createdAt"))
        )

    def status(self, cluster_id: str) -> PodStatus | None:
        """The cluster's status as one pod's; None when RunPod knows no cluster by that id."""
        try:
            cluster = self.api.get_cluster(cluster_id)
        except ApiStatusError as e:
            if e.status == 404:
                return None
            raise
        self.known.add(cluster_id)
        return self.group(cluster, self._members(cluster_id) or [])

    def group(self, cluster: dict, members: list[dict]) -> PodStatus:
        k = int((cluster.get("compute") or {}).get("podCount") or len(members))
        by_rank = {(m.get("cluster") or {}).get("rank"): m for m in members}
        nodes = []
        for rank in range(k):
            pod = by_rank.get(rank)
            if pod is None:
                nodes.append(NodeStatus(rank, "", "terminated", f"RunPod lists no pod of rank {rank} in the cluster"))
                continue
            one = self.p._status(pod)
            nodes.append(NodeStatus(rank, str(pod.get("id") or ""), one.state, one.message))
        costs = [float(m["cost"]) for m in members if m.get("cost") is not None]
        return group_status(nodes, price_per_hour=round(sum(costs), 4) if costs else None)

    def terminate(self, cluster_id: str) -> bool:
        """Delete the cluster and with it every member. False when RunPod knows no cluster by that id."""
        try:
            self.api.delete_cluster(cluster_id)
        except ApiStatusError as e:
            if e.status == 404:
                return False
            raise
        return True

    def listed(self, label: str, members: list[dict], has_label) -> list[tuple[dict, list[dict]]]:
        """Every cluster of the label with its members (from one listing of every pod, members included)."""
        of: dict[str, list[dict]] = {}
        for m in members:
            of.setdefault(str((m.get("cluster") or {}).get("id")), []).append(m)
        out = []
        for c in self.api.list_clusters():
            if has_label(str(c.get("name") or ""), label):
                self.known.add(str(c["id"]))
                out.append((c, of.get(str(c["id"]), [])))
        return out

    # -- helpers -----------------------------------------------------------------------------------

    def _members(self, cluster_id: str) -> list[dict] | None:
        try:
            return self.api.cluster_pods(cluster_id)
        except ApiStatusError as e:
            if e.status == 404:
                return None
            raise

    def _live_named(self, name: str) -> list[dict]:
        """The clusters with this name, oldest first (for ``CreateOnce``): a deleted one is no longer listed."""
        return sorted((c for c in self.api.list_clusters() if c.get("name") == name), key=lambda c: str(c.get("createdAt") or ""))

    def _end_quietly(self, cluster_id: str) -> None:
        self.terminate(cluster_id)


def _price(members: list[dict], k: int) -> tuple[float | None, str | None]:
    """The cluster's price: ``k`` times one pod's (its pods are alike), RunPod's quote for a member that
    runs, else the price written into the members' environment at the create (a stopped one quotes 0)."""
    quoted = max((float(m.get("cost") or 0) for m in members), default=0.0)
    if quoted:
        return round(quoted * k, 4), "provider"
    written = next((p for p in (launch_price(m.get("env")) for m in members) if p), None)
    return (round(written * k, 4), "offer at launch") if written else (None, None)
