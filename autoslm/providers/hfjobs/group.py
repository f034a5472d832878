"""A replica of several pods on Hugging Face Jobs (``compute.nodes = K > 1``): K jobs in one network group.

``run_job(network_group=, network_aliases=)`` (both pinned huggingface_hub versions): the jobs of one
group reach each other on every port. Node 0 claims an alias; each job is told its node (``NODE_RANK``,
``NUM_NODES``), the rendezvous port (``MASTER_PORT``) and that alias (``AUTOSLM_PRIMARY_ALIAS``), from
which its worker builds node 0's address as ``${HF_NETWORK_GROUP_PREFIX}<alias>`` (engine/nodes.py).

- Names: the group and the alias are the attempt's pod name within the platform's limits (lowercase
  alphanumerics and dashes; 46 and 34 characters), shortened with a hash of the whole name where it does
  not fit as it is: one group per attempt (a relaunch's jobs never join a group still ending), and an
  alias as unique as the group, whatever the scope of the prefix.
- Each job carries the attempt's labels and its node's (``data.LABEL_NODE``, ``data.LABEL_NODES``):
  create-once finds a node's job by them, `gc` and adoption find the group by its pod name.
- The jobs are created one node at a time, each through create-once (a lost answer is looked up by the
  node's labels before a second send). A node that cannot be created cancels those that were, and the
  create fails as one: never a half group left running. A group an earlier launch began is finished, not
  created again.
- The handle: ``pod_id`` is the jobs' ids joined by ``+`` (node 0 first), the price K times the flavor's.
  The status is ``base.group_status`` over the jobs (a job has no exit code: COMPLETED reads as 0, ERROR as
  1), billed from the first job's start to the last one's end where their durations say; a node with no
  job (never created, or no longer known to the API) is a lost node.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from typing import Any

from autoslm.errors import (
    NoCapacity,
    ProviderAuthError,
    ProviderError,
    ProviderRateLimited,
    ProviderRefused,
    ProviderUnavailable,
    ProvisioningFailed,
)
from autoslm.providers.base import Billed, NodeStatus, Offer, PodHandle, PodRequest, PodStatus, group_status
from autoslm.providers.createonce import CreateOnce
from autoslm.providers.hfjobs.client import billed
from autoslm.providers.http import ApiStatusError
from autoslm.vendors.hfjobs import data

# ``p`` below is the HFJobsProvider whose group it is (its client, create-once policy, prices and sender).
HFJobsProvider = Any

GONE = ("CANCELED", "DELETED")


def network_name(text: str, limit: int) -> str:
    """``text`` as a network group's or alias's name: itself where it keeps the rule (lowercase
    alphanumerics and dashes, within ``limit``), else its first characters and a hash of the whole."""
    clean = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if clean == text and len(clean) <= limit:
        return clean
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    head = clean[: limit - len(digest) - 1].strip("-")
    return f"{head}-{digest}" if head else digest


def network_names(pod_name: str) -> tuple[str, str]:
    """The attempt's network group and the alias its node 0 claims."""
    return network_name(pod_name, data.GROUP_NAME_MAX), network_name(f"{pod_name}-n0", data.ALIAS_MAX)


def primary_port(pod_name: str) -> int:
    low, high = data.PRIMARY_PORTS
    return low + int(hashlib.sha256(pod_name.encode()).hexdigest()[:8], 16) % (high - low)


def member_ids(pod_id: str) -> list[str]:
    return pod_id.split(data.GROUP_SEP)


def node_of(job: dict) -> int | None:
    try:
        return int(job["labels"].get(data.LABEL_NODE, ""))
    except ValueError:
        return None


def size_of(job: dict) -> int:
    """How many jobs the job's group has (1: a job of its own)."""
    try:
        return max(1, int(job["labels"].get(data.LABEL_NODES) or 1))
    except ValueError:
        return 1


def by_node(jobs: Iterable[dict]) -> dict[int, dict]:
    """Each node's job among an attempt's: its oldest live one, else its newest."""
    grouped: dict[int, list[dict]] = {}
    for job in sorted(jobs, key=lambda j: j["created_at"] or 0.0):
        node = node_of(job)
        if node is not None:
            grouped.setdefault(node, []).append(job)
    out = {}
    for node, jobs_of in grouped.items():
        live = [j for j in jobs_of if j["stage"] not in GONE]
        out[node] = live[0] if live else jobs_of[-1]
    return out


def group_id(members: dict[int, dict]) -> str:
    return data.GROUP_SEP.join(members[n]["id"] for n in sorted(members))


def node_env(env: dict[str, str], node: int, nodes: int, alias: str, port: int) -> dict[str, str]:
    """A node's job's environment: the pod's, with its node and where node 0 waits."""
    out = dict(env)
    out.setdefault(data.ENV_MASTER_PORT, str(port))
    out.update({data.ENV_NODE_RANK: str(node), data.ENV_NUM_NODES: str(nodes), data.ENV_PRIMARY_ALIAS: alias})
    return out


# -- status ----------------------------------------------------------------------------------------


def status_of(
    nodes: int, jobs: dict[int, dict], ids: dict[int, str], price: float | None, message: Callable[[dict], str]
) -> PodStatus:
    """The group's status from its jobs by node (``ids``: the ids the handle names, for a node whose job
    the API no longer knows). ``price``: one job's, while it may bill."""
    out = []
    for node in range(nodes):
        job = jobs.get(node)
        if job is None:
            pid = ids.get(node, "")
            said = f"{data.TITLE} no longer knows job {pid}" if pid else "no job was created for this node"
            out.append(NodeStatus(node, pid, "terminated", said))
            continue
        code = {"COMPLETED": 0, "ERROR": 1}.get(job["stage"])
        out.append(NodeStatus(node, job["id"], data.flavor_stage(job["stage"]), message(job), exit_code=code))
    billing = any(j["stage"] in data.BILLED_STAGES for j in jobs.values())
    return group_status(out, price_per_hour=nodes * price if billing and price else None, billed=billed_group(jobs.values()))


def billed_group(jobs: Iterable[dict]) -> Billed | None:
    """The group is billed from its first job's start to its last job's end: K jobs' price over that time
    (an upper bound where they start apart). None where a job's durations are not given."""
    jobs = list(jobs)
    each = [billed(j) for j in jobs]
    if not each or any(b is None for b in each):
        return None
    ran = [b for b in each if b is not None and b.since is not None]
    if not ran:
        return Billed(None)
    ended = all(j["stage"] in data.FINISHED_STAGES for j in jobs)  # a node with no job bills nothing
    until = [b.until for b in ran if b.until is not None]
    return Billed(min(b.since for b in ran if b.since is not None), max(until) if ended and len(until) == len(ran) else None)


# -- launch ----------------------------------------------------------------------------------------


def launch_group(p: HFJobsProvider, request: PodRequest, offers: tuple[Offer, ...] | None) -> PodHandle:
    """Create the attempt's K jobs in one network group on the first of the offers that has them all, or
    find the group an earlier call created (finishing it where that call was cut short)."""
    k = request.wish.nodes
    found = p._live_named(request.name)
    have = {n: j for n, j in by_node(found).items() if n < k}
    chosen = {j["id"] for j in have.values()}
    for job in found:  # a node's second job (a create that landed after its retry's): ended
        if job["id"] not in chosen:
            p._try_cancel(job["id"])
    if len(have) == k:
        return handle(p, request.name, have, nodes=k)
    candidates = p._candidates(request, offers)
    if have:  # finished on the flavor it began on
        flavor = next(iter(have.values()))["flavor"]
        candidates = [o for o in candidates if o.offer_id == flavor] or [_offer_of(p, flavor)]
    refused: list[str] = []
    for offer in candidates:
        try:
            members = _create_all(p, request, offer, dict(have))
        except _FlavorRefused as e:
            refused.append(f"{offer.offer_id}: {e}")
            have = {}
            continue
        return handle(p, request.name, members, offer, nodes=k)
    raise NoCapacity(
        f"{data.TITLE} could not start the {k} jobs of {request.name}: " + "; ".join(refused)[:500],
        hint="try again later, or add GPU types to compute.gpu",
    )


class _FlavorRefused(Exception):
    """A flavor that cannot be had now (the group's jobs created on it were cancelled): try the next."""


def _create_all(p: HFJobsProvider, request: PodRequest, offer: Offer, members: dict[int, dict]) -> dict[int, dict]:
    """Create every node's job that ``members`` lacks; any that fails cancels the group's jobs and raises."""
    k, unsure = request.wish.nodes, False
    for node in range(k):
        if node in members:
            continue
        once = CreateOnce(
            data.TITLE,
            p.once.retry,
            p.once.sleep,
            lambda name, node=node: [j for j in p._live_named(name) if node_of(j) == node],
            lambda j: str(j["id"]),
            lambda jid: p.client.cancel(jid),
        )
        what = f"creating job {request.name} (node {node} of {k})"
        try:
            answer, found, lost = once.create(request.name, _sender(p, request, offer, node), what)
        except ApiStatusError as e:
            left = _cancel_group(p, request.name)
            if e.status in (400, 404, 422) and "flavor" in e.detail.lower() and not left:
                raise _FlavorRefused(e.detail) from None
            raise ProviderError(
                f"{data.TITLE} refused job {request.name} (node {node} of {k}): {e.detail}{_left_said(left)}",
                hint="check compute.image and compute.gpu",
            ) from None
        except ProviderError as e:
            raise _failed(e, request.name, node, k, _cancel_group(p, request.name), unsure) from None
        unsure = unsure or lost
        job = found if found is not None else answer
        if lost:
            once.drop_duplicates(request.name, keep=job["id"])
        members[node] = job
        if job["stage"] in ("ERROR", *GONE):
            left = _cancel_group(p, request.name)
            raise ProvisioningFailed(
                f"{data.TITLE} job {job['id']} ({request.name}, node {node} of {k}) failed as it was created: "
                f"{job['message'] or job['stage'].lower()}; the group's other jobs were cancelled{_left_said(left)}",
                pod_id=group_id(members),
            )
    return members


def _failed(e: ProviderError, name: str, node: int, k: int, left: list[str], unsure: bool) -> ProviderError:
    """A node's create failed and the group's jobs were cancelled: the error as one for the whole group. A
    refusal stays one (nothing is left) unless an earlier job's create answer was lost or a job is left."""
    message = f"{e.message} (node {node} of {k} of {name}; the group's other jobs were cancelled){_left_said(left)}"
    if isinstance(e, ProviderRefused) and (unsure or left):
        return ProviderUnavailable(message, hint="a create can still land late: `autoslm gc` ends any job left")
    kinds = (ProviderError, ProviderRefused, ProviderAuthError, ProviderRateLimited, ProviderUnavailable, NoCapacity)
    return type(e)(message, hint=e.hint) if type(e) in kinds else ProviderUnavailable(message, hint=e.hint)


def _left_said(left: list[str]) -> str:
    return f"; {data.TITLE} refused to cancel {', '.join(left)}: `autoslm gc` ends it" if left else ""


def _cancel_group(p: HFJobsProvider, name: str) -> list[str]:
    """Cancel every live job of the attempt; the ids whose cancel was refused (gc finds them by label)."""
    left = []
    for job in p._live_named(name):
        try:
            p.client.cancel(job["id"])
        except ProviderError:
            left.append(job["id"])
    return left


def _sender(p: HFJobsProvider, request: PodRequest, offer: Offer, node: int) -> Callable[[], dict]:
    k = request.wish.nodes
    group, alias = network_names(request.name)
    env = node_env(request.env, node, k, alias, primary_port(request.name))
    labels = {data.LABEL_NODE: str(node), data.LABEL_NODES: str(k)}
    # One job's price (AUTOSLM_PRICE_PER_HOUR is one pod's: the worker counts compute.nodes of them).
    network = (group, alias if node == 0 else None)
    return p._sender(request, offer, env=env, labels=labels, network=network)


def _offer_of(p: HFJobsProvider, flavor: str) -> Offer:
    known = data.FLAVORS.get(flavor)
    price = p._price(flavor) or 0.0
    return Offer(
        data.NAME,
        known.gpu if known else flavor,
        known.count if known else 1,
        known.vram_gb if known else 0,
        price,
        offer_id=flavor,
    )


def handle(p: HFJobsProvider, name: str, members: dict[int, dict], offer: Offer | None = None, nodes: int = 0) -> PodHandle:
    """The group's handle, named as it was created: its jobs by node; priced K times the flavor's (as listed,
    else the ``offer`` it was created at)."""
    first = members[min(members)]
    nodes = nodes or max(size_of(j) for j in members.values())
    listed = p._price(first["flavor"])
    price = listed or (offer.price_per_hour if offer else None)
    created = [j["created_at"] for j in members.values() if j["created_at"] is not None]
    known = data.FLAVORS.get(first["flavor"])
    return PodHandle(
        p.name,
        group_id(members),
        price_per_hour=nodes * price if price else None,
        gpu=known.gpu if known else first["flavor"] or None,
        name=name,
        price_source=("provider" if listed else "offer at launch") if price else None,
        created_at=min(created) if created else None,
    )


def split(jobs: Iterable[dict]) -> tuple[list[dict], dict[str, dict[int, dict]]]:
    """Jobs of their own, and the groups' jobs by pod name, each group's by node (``by_node``)."""
    singles, grouped = [], {}
    for job in jobs:
        if size_of(job) > 1 and node_of(job) is not None:
            grouped.setdefault(job["labels"].get(data.LABEL_POD, ""), []).append(job)
        else:
            singles.append(job)
    return singles, {name: by_node(members) for name, members in grouped.items()}
