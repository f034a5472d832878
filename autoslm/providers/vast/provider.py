"""Vast.ai as a compute provider, through its REST API (https://console.vast.ai, /api/v0 and /api/v1).

``VastApi`` (client.py) speaks Vast's JSON; ``VastProvider`` turns it into the Provider contract
(``autoslm.providers.base``) and ``autoslm.errors``. Vendor JSON never leaves this module.

It must never: rent a second instance for one attempt (``providers/createonce.py``: launch is
idempotent by label: every instance carries its pod name as its Vast label, and a create whose answer
was lost is looked up before it is sent again); leave the stopped instance that a refused bid can leave behind (it is found by label
and destroyed); put the account key into an instance's environment (Vast injects CONTAINER_ID and an
instance-scoped CONTAINER_API_KEY itself); print an instance's JSON (it echoes the environment,
secrets included, in ``extra_env``).

How the worker starts: ``runtype = "args"`` -- Vast runs the image's ENTRYPOINT
(worker_image/boot.sh) with ``PodRequest.command`` as its argument list, and injects no SSH or Jupyter
wrapper; the worker stays the container's main process, so the container ends when the worker does.
For an args launch, ``onstart`` replaces the image's ENTRYPOINT (the official CLI sends its
``--entrypoint`` there). A bootstrap pod (``PodRequest.bootstrap``) uses that: ``BOOTSTRAP_IMAGE`` (vLLM's
image, whose ENTRYPOINT is its server) with ``onstart = "sh"`` and ``args = ["-c", <boot.sh>, ...]``.

Its own JobSpec setting, ``[compute.options.vast] min_reliability`` (``options.VastOptions``), reaches it
in the wish: the host reliability an offer must have.

Interruptible instances are bids: we offer ``min_bid`` plus ``BID_MARGIN`` (capped by
``max_price_per_hour``). An outbid instance is stopped by Vast; ``status`` reports it as "exited".
"""

from __future__ import annotations

import math
import os
from typing import Any

from autoslm import catalog
from autoslm.errors import NoCapacity, ProviderError, ProviderRefused, ProvisioningFailed
from autoslm.providers.base import (
    POD_LABEL,
    GpuWish,
    Offer,
    PodHandle,
    PodRequest,
    PodStatus,
    check_pod_name,
    launch_price,
    one_pod,
    planned_offers,
)
from autoslm.providers.http import ApiStatusError, check_pod_env
from autoslm.providers.rest import RestProvider
from autoslm.providers.vast.client import VastApi
from autoslm.vendors.vast import BOOTSTRAP_IMAGE, DEFAULT_URL, KEY_ENV, URL_ENV, VENDOR

BID_MARGIN = 0.10  # bid 10% over the current minimum: fewer outbids for a few cents an hour

_STATES = {
    None: "pending",  # being provisioned
    "": "pending",
    "created": "pending",
    "loading": "pending",
    "rebooting": "pending",
    "running": "running",
    "exited": "exited",
    "stopped": "exited",  # stopped by us, by its own exit, or outbid: the instance still exists and bills disk
    "frozen": "exited",
    # An instance whose host went unknown or offline never reaches running (SkyPilot destroys and
    # retries too): "exited" makes the controller replace it instead of waiting until max_hours.
    "unknown": "exited",
    "offline": "exited",
}


class VastProvider(RestProvider):
    """Vast.ai instances. Construct with ``from_env()`` in the product; tests pass ``base_url``, ``sleep``, ``clock``."""

    name = "vast"
    vendor, title, api_class = VENDOR, "Vast", VastApi
    default_url, key_env, url_env = DEFAULT_URL, KEY_ENV, URL_ENV

    def __init__(self, api_key: str, base_url: str | None = None, *, max_offer_tries: int = 3, verified_only: bool = True, **kw):
        super().__init__(api_key, base_url, **kw)
        self.max_offer_tries = max_offer_tries
        self.verified_only = verified_only

    @classmethod
    def keyless(cls, **kwargs):
        """Without a key, for `plan`: Vast's offer search is public (``Capabilities.keyless``)."""
        kwargs.setdefault("base_url", os.environ.get(URL_ENV) or DEFAULT_URL)
        return cls("", **kwargs)

    # -- Provider ----------------------------------------------------------------------------------

    def launch(self, request: PodRequest, offers: tuple[Offer, ...] | None = None) -> PodHandle:
        """Rent an instance and return at once, on the first of ``offers`` (the plan's) that Vast rents, or of its
        own where there is no plan. Calling it again with the same ``request.name`` returns the same instance."""
        self._check_request(request)
        for inst in self._find_by_label(request.name):
            if _is_leftover(inst):
                # A stopped instance under this attempt's name is a refused bid from an earlier call:
                # it would bill disk forever, and it is not the worker we want.
                self._destroy_or_fail(inst, request.name, "left stopped by an earlier refused request")
                continue
            return self._handle(inst)

        # The offers the run's plan found usable, in its order, else every matching one.
        wish = request.wish
        planned = planned_offers(request, offers, VENDOR.title)
        candidates = planned if planned is not None else self.offers(wish)
        if not candidates:
            raise NoCapacity(
                f"Vast has no {'interruptible' if wish.interruptible else 'on-demand'} offer for "
                f"{wish.gpu_count}x {'/'.join(wish.gpu_types) or 'any GPU'}" + self._limits_text(wish),
                hint="try again later, add GPU types to compute.gpu, raise compute.max_price_per_hour, or lower min_reliability in [compute.options.vast]",
            )
        refused: list[str] = []
        for offer in candidates[: self.max_offer_tries]:
            body = self._create_body(request, offer)
            try:
                answer, found, was_unsure = self.once.create(
                    request.name,
                    lambda: self.api.create_instance(offer.offer_id, body),  # noqa: B023 - called in this iteration
                    f"renting offer {offer.offer_id} for {request.name}",
                    refusal=_refusal,
                )
                if found is not None:
                    answer = {"success": True, "new_contract": found["id"]}
            except ApiStatusError as e:
                # Offer taken, bid too low, host gone... A refused create can still have left an
                # instance behind (a stopped one, for a low bid): destroy it before the next offer.
                self._cleanup_after_refusal(request.name)
                refused.append(f"offer {offer.offer_id} ({offer.gpu}, ${offer.price_per_hour:.3f}/h): {e.detail}")
                continue
            if answer.get("success") is False or not answer.get("new_contract"):
                found = [i for i in self._find_by_label(request.name) if not _is_leftover(i)]
                if answer.get("success") is not False and found:
                    return self._handle(found[0], offer)
                if answer.get("new_contract"):
                    # A refused bid can still have made an instance: destroy it by the id the create
                    # returned (as dstack does), not only by a label search that may lag behind.
                    self._destroy_or_fail({"id": answer["new_contract"]}, request.name, "left behind by a refused request")
                self._cleanup_after_refusal(request.name)
                refused.append(f"offer {offer.offer_id} ({offer.gpu}): {_vast_reason(answer)}")
                continue
            handle = PodHandle(
                self.name, str(answer["new_contract"]), price_per_hour=offer.price_per_hour, gpu=offer.gpu, name=request.name
            )
            if was_unsure:
                self.once.drop_duplicates(request.name, keep=handle.pod_id)
            return handle
        raise NoCapacity(
            f"Vast refused {len(refused)} offer(s) for {request.name}: " + "; ".join(refused)[:500],
            hint="try again (offers change by the minute), or raise compute.max_price_per_hour",
        )

    def status(self, handle: PodHandle) -> PodStatus:
        try:
            inst = self.api.get_instance(handle.pod_id)
        except ApiStatusError as e:
            if e.status == 404:
                return PodStatus("terminated", f"Vast no longer knows instance {handle.pod_id}")
            raise
        if not inst:
            return PodStatus("terminated", f"Vast no longer knows instance {handle.pod_id}")
        return self._status(inst)

    def terminate(self, handle: PodHandle) -> None:
        """Destroy (not stop: a stopped instance keeps billing its disk). A missing instance is success."""
        try:
            answer = self.api.destroy_instance(handle.pod_id)
        except ApiStatusError as e:
            if e.status == 404:
                return
            raise
        if answer.get("success") is False and not _means_missing(answer):
            raise ProviderError(
                f"Vast did not destroy instance {handle.pod_id}: {_vast_reason(answer)}",
                hint=f"destroy instance {handle.pod_id} manually at https://cloud.vast.ai/instances/",
            )

    def list_pods(self, label: str = POD_LABEL) -> list[PodHandle]:
        return [self._handle(i) for i in self.api.list_instances() if _has_label(i.get("label") or "", label)]

    def statuses(self, label: str = POD_LABEL) -> dict[str, PodStatus]:
        """Every autoslm instance's status from one listing (a supervisor ticking many runs shares it)."""
        return {str(i["id"]): self._status(i) for i in self.api.list_instances() if _has_label(i.get("label") or "", label)}

    def offers(self, wish: GpuWish, *, lookup: bool = False) -> list[Offer]:
        """Rentable offers matching the wishes, cheapest first (for interruptible: by the bid we would place).
        ``lookup``: only a look at prices (`autoslm plan`): tried once, no back-off."""
        names = self._wanted_names(wish)
        query = self._query(wish, names)
        out: list[Offer] = []
        for o in self.api.search_offers(query, lookup=lookup):
            offer = self._offer(o, wish, names)
            if offer is not None:
                out.append(offer)
        return sorted(out, key=lambda o: (o.price_per_hour, o.extra["preference"]))

    # -- helpers -----------------------------------------------------------------------------------

    def _check_request(self, request: PodRequest) -> None:
        check_pod_name(request.name)
        one_pod(request, "Vast")
        check_pod_env(request.env, self._key, "Vast")

    def _wanted_names(self, wish: GpuWish) -> dict[str, int]:
        out: dict[str, int] = {}
        for rank, name in enumerate(wish.gpu_types):
            vname = catalog.gpu_id("vast", name)
            if vname and vname not in out:
                out[vname] = rank
        return out

    def _query(self, wish: GpuWish, names: dict[str, int]) -> dict:
        q: dict[str, Any] = {
            "rentable": {"eq": True},
            "rented": {"eq": False},
            "external": {"eq": False},  # as the official CLI searches: offers Vast itself can rent out
            "num_gpus": {"eq": wish.gpu_count},
            "disk_space": {"gte": wish.disk_gb},
            "order": [["dph_total", "asc"]],
            "type": "bid" if wish.interruptible else "on-demand",
            "limit": 50,
            "allocated_storage": wish.disk_gb,
        }
        if self.verified_only:
            q["verified"] = {"eq": True}
        if names:
            q["gpu_name"] = {"in": list(names)}
            vrams = [g.mem_gib for n in names if (g := catalog.gpu_info(n))]
            if vrams:
                q["gpu_ram"] = {"gte": int(min(vrams) * 1024 * 0.95)}  # MiB; tells a 40 GB A100 from an 80 GB one
        q["reliability"] = {"gte": VENDOR.options_in(wish).min_reliability}
        if self.min_cuda:
            q["cuda_max_good"] = {"gte": float(self.min_cuda)}
        if wish.max_price_per_hour is not None and not wish.interruptible:
            q["dph_total"] = {"lte": wish.max_price_per_hour}
        return q

    def _offer(self, o: dict, wish: GpuWish, names: dict[str, int]) -> Offer | None:
        """One vendor offer as an Offer, or None when it does not really match (the server's filter is not trusted)."""
        gname = o.get("gpu_name")
        if names and gname not in names:
            return None
        if int(o.get("num_gpus") or 0) != wish.gpu_count or o.get("rentable") is False:
            return None
        if o.get("rented") or o.get("external") is True:
            return None  # the official CLI drops rented offers locally too: the server filter lags
        ram_gib = float(o.get("gpu_ram") or 0) / 1024  # Vast reports MiB per GPU
        info = catalog.gpu_info(gname or "", ram_gib)  # Vast lists a 40 GB A100 under the 80 GB one's name
        if info and ram_gib and ram_gib < info.mem_gib * 0.95:
            return None
        wanted = {g.name for n in wish.gpu_types if (g := catalog.gpu_info(n))}
        if info and wanted and info.name not in wanted:
            return None  # the other card of a shared name
        vram_gb = info.vram_gb if info else ram_gib
        reliability = o.get("reliability2", o.get("reliability"))
        if reliability is not None and float(reliability) < VENDOR.options_in(wish).min_reliability:
            return None
        extra: dict[str, Any] = {"preference": names.get(gname, 0), "machine_id": o.get("machine_id")}
        if wish.interruptible:
            min_bid = o.get("min_bid")
            if min_bid is None:
                return None
            # Round up to a tenth of a cent; round() first so 0.2 * 1.1 stays 0.220, not 0.221.
            bid = math.ceil(round(float(min_bid) * (1 + BID_MARGIN) * 1000, 6)) / 1000
            if wish.max_price_per_hour is not None:
                if float(min_bid) > wish.max_price_per_hour:
                    return None
                bid = min(bid, wish.max_price_per_hour)
            price = bid
            extra["bid"] = bid
            extra["min_bid"] = float(min_bid)
        else:
            price = float(o.get("dph_total") or 0)
            if price <= 0 or (wish.max_price_per_hour is not None and price > wish.max_price_per_hour):
                return None
        return Offer(
            provider=self.name,
            gpu=info.name if info else str(gname),
            gpu_count=wish.gpu_count,
            vram_gb=vram_gb,
            price_per_hour=round(price, 4),
            interruptible=wish.interruptible,
            offer_id=str(o.get("id") or o.get("ask_contract_id")),  # the official CLI creates with the offer's id
            location=str(o.get("geolocation") or ""),
            reliability=float(reliability) if reliability is not None else None,
            extra=extra,
            ram_gb=float(o["cpu_ram"]) / 1024 if o.get("cpu_ram") else None,  # MiB: the host RAM this offer rents
        )

    def _limits_text(self, wish: GpuWish) -> str:
        parts = []
        if wish.max_price_per_hour is not None:
            parts.append(f"under ${wish.max_price_per_hour:g}/h")
        parts.append(f"reliability >= {VENDOR.options_in(wish).min_reliability:g}")
        return f" ({', '.join(parts)})" if parts else ""

    def _create_body(self, request: PodRequest, offer: Offer) -> dict:
        body: dict[str, Any] = {
            "client_id": "me",
            "image": request.image or catalog.default_worker_image(),
            # The in-pod watchdog enforces limits.max_usd from this: only the provider knows the price here.
            "env": {**request.env, "AUTOSLM_PRICE_PER_HOUR": f"{offer.price_per_hour:.4f}"},
            "disk": request.wish.disk_gb,
            "label": request.name,
            "runtype": "args",
            "args": list(request.command),
            # Ask Vast to fail rather than park a stopped instance when the host cannot start it now;
            # we still look for such a leftover after every refusal, in case it is ignored.
            "cancel_unavail": True,
        }
        if request.bootstrap and request.command:
            body["image"] = BOOTSTRAP_IMAGE
            body["onstart"], body["args"] = request.command[0], list(request.command[1:])
        if request.wish.interruptible:
            body["price"] = offer.extra["bid"]
        for port in (
            request.serving.ports if request.serving is not None else ()
        ):  # Vast maps it to a public port (the pod reads VAST_TCP_PORT_<port>)
            body["env"][f"-p {port}:{port}"] = "1"
        return body

    def _cleanup_after_refusal(self, name: str) -> None:
        for inst in self._find_by_label(name):
            self._destroy_or_fail(inst, name, "left behind by a refused request")

    def _destroy_or_fail(self, inst: dict, name: str, why: str) -> None:
        iid = str(inst.get("id"))
        try:
            self.terminate(PodHandle(self.name, iid))
        except ProviderError as e:
            raise ProvisioningFailed(
                f"Vast instance {iid} ({name}) was {why} and could not be destroyed: {e.message}",
                pod_id=iid,
            ) from None

    def _find_by_label(self, name: str) -> list[dict]:
        found = [i for i in self.api.list_instances({"label": {"in": [name]}}) if i.get("label") == name]
        return [i for i in found if i.get("cur_state") != "unloaded"]

    def _live_named(self, name: str) -> list[dict]:
        """The instances with this label that may run the worker, oldest first (for ``CreateOnce``)."""
        return sorted((i for i in self._find_by_label(name) if not _is_leftover(i)), key=lambda i: int(i.get("id") or 0))

    def _handle(self, inst: dict, offer: Offer | None = None) -> PodHandle:
        gname = inst.get("gpu_name")
        info = catalog.gpu_info(gname, float(inst.get("gpu_ram") or 0) / 1024) if gname else None
        price, source = inst.get("dph_total"), "provider"
        if not price:
            # A stopped instance lists dph_total 0: bill it at the price it was rented at (its env says).
            env = (
                {k: v for k, v in (inst.get("extra_env") or []) if isinstance(k, str)}
                if isinstance(inst.get("extra_env"), list)
                else {}
            )
            price, source = (offer.price_per_hour, "offer at launch") if offer else (launch_price(env), "offer at launch")
        start = inst.get("start_date")
        return PodHandle(
            self.name,
            str(inst["id"]),
            price_per_hour=float(price) if price else None,
            gpu=info.name if info else (gname or (offer.gpu if offer else None)),
            name=inst.get("label"),
            price_source=source if price else None,
            created_at=float(start) if isinstance(start, (int, float)) else None,
        )

    def _status(self, inst: dict) -> PodStatus:
        if inst.get("cur_state") == "unloaded":
            return PodStatus("terminated", f"Vast released instance {inst.get('id')}")
        actual = inst.get("actual_status")
        state = _STATES.get(actual, "unknown")
        msg = f"Vast {actual or 'provisioning'}"
        status_msg = (inst.get("status_msg") or "").strip()
        if status_msg:
            msg += f": {status_msg[:200]}"
        price = inst.get("dph_total")
        return PodStatus(state, msg, price_per_hour=float(price) if price is not None else None)


def _refusal(e: Exception) -> ProviderRefused | None:
    """A rental's definite no (``CreateOnce``'s rule 5): HTTP 402, or an answer about the account's credit."""
    if isinstance(e, ApiStatusError) and (e.status == 402 or "credit" in e.detail.lower() or "balance" in e.detail.lower()):
        return ProviderRefused(f"Vast refused the rental: {e.detail}", hint="add credit at https://cloud.vast.ai/billing/")
    return None


def _is_leftover(inst: dict) -> bool:
    """An instance that is not going to run the worker: a refused bid, stopped before it ever ran.

    dstack's test is cur_state == intended_status == next_state == "stopped"; a refused bid may also
    show actual_status null (never started) with intended_status "stopped": never adopt that one.
    """
    if inst.get("intended_status") != "stopped":
        return False
    if inst.get("actual_status") in (None, "", "stopped", "exited", "created"):
        return True
    return inst.get("cur_state") == inst.get("next_state") == "stopped"


def _means_missing(answer: dict) -> bool:
    reason = f"{answer.get('error', '')} {answer.get('msg', '')}".lower()
    return "no_such" in reason or "not found" in reason or "does not exist" in reason


def _vast_reason(answer: dict) -> str:
    return str(answer.get("msg") or answer.get("error") or "no reason given")[:300]


def _has_label(name: str, label: str) -> bool:
    return name == label or name.startswith(label + "-")
