"""A fake Vast.ai REST API on 127.0.0.1, whose instances are local processes running the pod's command.

    with FakeVast(workdir=tmp_path) as fake:            # or the ``fake_vast`` pytest fixture
        provider = VastProvider(fake.api_key, base_url=fake.url, sleep=...)
        env_for_cli = fake.env()                        # VAST_API_KEY + AUTOSLM_VAST_URL

Endpoints, in Vast's shapes: POST /api/v0/bundles/ (offer search with the filter JSON: eq, neq, gt,
gte, lt, lte, in, notin; ``order``, ``type``, ``limit``), PUT /api/v0/asks/{offer}/ (rent:
``{"success": true, "new_contract": id}``), GET/PUT/DELETE /api/v0/instances/{id}/, GET
/api/v1/instances/ (``select_filters`` label/actual_status, 25 a page, ``next_token``).

Renting with ``runtype = "args"`` starts the ``args`` list as a local process (after ``onstart``, which
for an args launch replaces the image's ENTRYPOINT, as the official CLI's ``--entrypoint`` sends it)
with the instance's env plus what Vast injects: CONTAINER_ID, an instance-scoped CONTAINER_API_KEY (accepted only for that
instance's own read/stop/destroy) and VAST_CONTAINERLABEL. Destroying it kills the process group.

An interruptible rental (``price`` set) below the offer's ``min_bid`` is refused with a 400 AND leaves
a stopped instance under the requested label, as Vast can; ``set_min_bid(..., visible=False)``
raises the price between a search and a rental to provoke that.

Test API: ``preempt(id)`` (kill; a bid instance shows stopped/"outbid", an on-demand one exited),
``no_capacity(True)`` (no offers, rentals refused), ``fail_next``, ``hang_next`` (see cloud.py),
``pods()`` / ``running_pods()`` / ``existing_pods()``, ``instance(id)``, ``log(id)``, ``launch_calls``
(rental bodies), ``requests``.

Fidelity gaps: offers are a fixed table and a rented offer simply disappears; ``dph_total`` is the
listed price (no storage or bandwidth charges); instances go straight to running (``boot_s`` keeps
them "loading"); no SSH/Jupyter runtypes (there ``onstart`` is stored, never run); the failure text of a
refused bid is invented (Vast's exact wording is not documented); no logs endpoint.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.cloud import LABEL_RULE, FakeCloud, PodProcess, Request, Response, label_ok

DEFAULT_OFFERS = [
    # id, gpu_name, num_gpus, gpu_ram MB, dph_total, min_bid, reliability, geolocation[, cpu_ram MB: 32 GB a GPU]
    (101, "RTX 4090", 1, 24564, 0.35, 0.18, 0.995, "Norway, NO"),
    (102, "RTX 4090", 1, 24564, 0.42, 0.20, 0.970, "Texas, US"),
    (103, "RTX 3090", 1, 24576, 0.20, 0.10, 0.960, "Quebec, CA"),
    (104, "L40S", 1, 46068, 0.65, 0.35, 0.990, "Oregon, US"),
    (105, "A100 PCIE", 1, 40960, 0.70, 0.40, 0.985, "Virginia, US"),
    (106, "A100 PCIE", 1, 81920, 0.95, 0.55, 0.990, "Virginia, US"),
    (107, "H100 SXM", 1, 81559, 1.90, 1.10, 0.995, "Finland, FI"),
    (108, "RTX 4090", 2, 24564, 0.70, 0.36, 0.990, "Norway, NO"),
    (109, "RTX 4090", 1, 24564, 0.25, 0.12, 0.700, "Unknown"),
]
_ALIASES = {"reliability": "reliability2", "cuda_vers": "cuda_max_good"}
_RUNTYPES = {"args", "ssh", "ssh_proxy", "ssh_direc ssh_proxy", "jupyter_proxy ssh_proxy", "jupyter_direc ssh_direc ssh_proxy"}


@dataclass
class FakeInstance:
    id: int
    offer: dict
    label: str
    image: str
    env: dict[str, str]  # as sent by the client, without the injected variables
    args: list[str]
    runtype: str
    disk: float
    is_bid: bool
    price: float  # $/h: the bid for interruptible, dph_total otherwise
    container_key: str
    onstart: str | None = None  # an args launch's entrypoint override
    created_at: float = field(default_factory=time.time)
    process: PodProcess | None = None
    actual_status: str | None = "loading"
    intended_status: str = "running"
    status_msg: str = ""
    destroyed: bool = False
    preempted: bool = False


class FakeVast(FakeCloud):
    vendor = "vast"

    def __init__(self, *, offers: list[tuple] | None = None, boot_s: float = 0.0, page_size: int = 25, **kw):
        super().__init__(**kw)
        self.offers = {o[0]: _offer(*o) for o in (offers or DEFAULT_OFFERS)}
        self.boot_s = boot_s
        self.page_size = page_size
        self._instances: dict[int, FakeInstance] = {}
        self._next_id = 9001
        self._no_capacity = False
        self.searches: list[dict] = []  # every offer-search body
        # How a refused bid is answered: 400 (default), or 200 {"success": false, "new_contract": id}
        # with the leftover not yet labelled and actual_status null -- an answer only the id leads to.
        self.bid_refusal = "400"

    def env(self) -> dict[str, str]:
        return {"VAST_API_KEY": self.api_key, "AUTOSLM_VAST_URL": self.url}

    # -- test API ----------------------------------------------------------------------------------

    def no_capacity(self, flag: bool = True) -> None:
        """No offers at all, and rentals of known offers are refused."""
        with self.lock:
            self._no_capacity = flag

    def set_min_bid(self, offer_id: int, min_bid: float, *, visible: bool = True) -> None:
        """Change an offer's minimum bid. ``visible=False``: searches keep showing the old one (someone
        outbid us between our search and our rental), so a rental at the searched price is refused."""
        with self.lock:
            if visible:
                self.offers[offer_id]["min_bid"] = min_bid
                self.offers[offer_id].pop("_real_min_bid", None)
            else:
                self.offers[offer_id]["_real_min_bid"] = min_bid

    def preempt(self, instance_id: int | str, how: str = "auto") -> None:
        """Take the machine away: a bid instance is outbid (stopped), an on-demand one exits (host lost)."""
        inst = self._instances[int(instance_id)]
        if inst.process:
            inst.process.kill()
        with self.lock:
            inst.preempted = True
            if how == "outbid" or (how == "auto" and inst.is_bid):
                inst.actual_status, inst.status_msg = "stopped", "Instance stopped: outbid by a higher bid"
            else:
                inst.actual_status, inst.status_msg = "exited", "host lost"

    def set_status(self, instance_id: int | str, actual_status: str | None) -> None:
        """What the host reports: e.g. "unknown" or "offline" (the host vanished from Vast's view)."""
        with self.lock:
            self._instances[int(instance_id)].actual_status = actual_status

    def pods(self) -> list[FakeInstance]:
        with self.lock:
            return list(self._instances.values())

    def instance(self, instance_id: int | str) -> FakeInstance:
        return self._instances[int(instance_id)]

    def running_pods(self) -> list[FakeInstance]:
        return [i for i in self.pods() if not i.destroyed and i.process is not None and i.process.alive()]

    def existing_pods(self) -> list[FakeInstance]:
        """Instances not destroyed: a stopped one still bills its disk."""
        return [i for i in self.pods() if not i.destroyed]

    def log(self, instance_id: int | str) -> str:
        inst = self._instances[int(instance_id)]
        return inst.process.output() if inst.process else ""

    def status_of(self, inst: FakeInstance) -> str | None:
        """The live ``actual_status`` of an instance."""
        if inst.actual_status in ("loading", "running"):
            if inst.process is not None and not inst.process.alive():
                return "exited"
            return "loading" if time.time() - inst.created_at < self.boot_s else "running"
        return inst.actual_status

    def kill_all(self) -> None:
        for i in self.pods():
            if i.process:
                i.process.kill()

    # -- vendor API --------------------------------------------------------------------------------

    def error_body(self, status: int, message: str) -> Any:
        if status == 429:
            return {"detail": message}
        return {"success": False, "error": message.lower().replace(" ", "_"), "msg": message}

    def _err(self, status: int, error: str, msg: str) -> Response:
        return Response(status, {"success": False, "error": error, "msg": msg})

    def handle(self, req: Request) -> Response:
        if req.path == "/api/v0/bundles/" and req.method == "POST" and not req.token:
            return self._search(req.body or {})  # offer search is public on Vast: no key needed
        scope = self._auth(req)
        if isinstance(scope, Response):
            return scope
        m = re.fullmatch(r"/api/v0/instances/(\d+)/?", req.path)
        if scope != "account":
            # An instance-scoped key may read, stop and destroy its own instance, nothing else.
            if not (m and int(m.group(1)) == scope and req.method in ("GET", "PUT", "DELETE")):
                return self._err(403, "forbidden", "This key may only manage its own instance.")
        if req.path == "/api/v0/bundles/" and req.method == "POST":
            return self._search(req.body or {})
        am = re.fullmatch(r"/api/v0/asks/(\d+)/?", req.path)
        if am and req.method == "PUT":
            return self._rent(int(am.group(1)), req.body or {})
        if req.path.rstrip("/") == "/api/v1/instances" and req.method == "GET":
            return self._list(req)
        if m:
            inst = self._instances.get(int(m.group(1)))
            if req.method == "GET":
                if inst is None or inst.destroyed or req.q("owner") != "me":
                    return Response(200, {"instances": None})
                return Response(200, {"instances": self._inst_json(inst)})
            if inst is None or inst.destroyed:
                return self._err(404, "no_such_instance", f"Instance {m.group(1)} not found.")
            if req.method == "DELETE":
                self._destroy(inst)
                return Response(200, {"success": True})
            if req.method == "PUT":
                body = req.body or {}
                if body.get("state") == "stopped":
                    if inst.process:
                        inst.process.kill(self.terminate_grace_s)
                    inst.actual_status = inst.intended_status = "stopped"
                elif "label" in body:
                    inst.label = str(body["label"])
                return Response(200, {"success": True})
        return self._err(404, "not_found", f"no route for {req.method} {req.path}")

    def _auth(self, req: Request) -> str | int | Response:
        if not req.token:
            return self._err(401, "auth_error", "Authentication required.")
        if secrets.compare_digest(req.token, self.api_key):
            return "account"
        with self.lock:
            for i in self._instances.values():
                if secrets.compare_digest(req.token, i.container_key):
                    return i.id
        return self._err(401, "auth_error", "Invalid API key.")

    def _search(self, q: dict) -> Response:
        with self.lock:
            self.searches.append(q)
            if self._no_capacity:
                return Response(200, {"offers": []})
            rows = [{k: v for k, v in o.items() if not k.startswith("_")} for o in self.offers.values() if not o["rented"]]
        for key, cond in q.items():
            if key in ("order", "type", "limit", "allocated_storage", "disable_bundling") or not isinstance(cond, dict):
                continue
            col = _ALIASES.get(key, key)
            rows = [r for r in rows if _match(r.get(col), cond)]
        for col, direction in reversed(q.get("order") or []):
            rows.sort(
                key=lambda r: (r.get(_ALIASES.get(col, col)) is None, r.get(_ALIASES.get(col, col)) or 0),
                reverse=direction == "desc",
            )
        if q.get("type") == "bid":
            for r in rows:
                r["dph_total"] = r["min_bid"]
        return Response(200, {"offers": rows[: int(q.get("limit") or 64)]})

    def _rent(self, offer_id: int, body: dict) -> Response:
        with self.lock:
            self.launch_calls.append(body)
        if body.get("client_id") != "me" or not body.get("image"):
            return self._err(400, "invalid_args", "client_id 'me' and image are required.")
        if body.get("label") is not None and not label_ok(str(body["label"])):
            return self._err(
                400, "invalid_args", f"label must be {LABEL_RULE} (the rule autoslm keeps for the names a vendor stores)"
            )
        runtype = body.get("runtype", "ssh")
        if runtype not in _RUNTYPES:
            return self._err(400, "invalid_args", f"unknown runtype {runtype!r}")
        args = body.get("args")
        if args is not None and not (isinstance(args, list) and all(isinstance(a, str) for a in args)):
            return self._err(400, "invalid_args", "args must be a list of strings")
        env = body.get("env") or {}
        if not isinstance(env, dict):
            return self._err(400, "invalid_args", "env must be an object")
        with self.lock:
            offer = self.offers.get(offer_id)
            if offer is None or offer["rented"] or self._no_capacity:
                return self._err(400, "no_such_ask", f"Instance type {offer_id} is no longer available.")
            bid = body.get("price")
            is_bid = bid is not None
            inst = FakeInstance(
                id=self._next_id,
                offer=offer,
                label=str(body.get("label") or ""),
                image=body["image"],
                env={str(k): str(v) for k, v in env.items()},
                args=list(args or []),
                runtype=runtype,
                disk=float(body.get("disk") or 10),
                is_bid=is_bid,
                price=float(bid) if is_bid else offer["dph_total"],
                container_key=secrets.token_hex(32),
                onstart=body.get("onstart") or None,
            )
            self._next_id += 1
            self._instances[inst.id] = inst
            floor = offer.get("_real_min_bid", offer["min_bid"])
            if is_bid and float(bid) < floor and self.bid_refusal == "200":
                inst.actual_status, inst.intended_status, inst.label = None, "stopped", ""
                return Response(
                    200,
                    {
                        "success": False,
                        "new_contract": inst.id,
                        "error": "insufficient_bid",
                        "msg": f"Your bid of ${bid}/hr is below the minimum bid of ${floor}/hr.",
                    },
                )
            if is_bid and float(bid) < floor:
                # What makes Vast dangerous: the rental is refused AND a stopped instance stays behind.
                inst.actual_status, inst.intended_status = "stopped", "stopped"
                inst.status_msg = f"bid {bid} below the current minimum {floor}"
                return self._err(
                    400, "insufficient_bid", f"Your bid of ${bid}/hr is below the minimum bid of ${floor}/hr for this machine."
                )
            offer["rented"] = True
        command = ([inst.onstart] if inst.onstart and runtype == "args" else []) + inst.args
        if command:
            injected = {
                "CONTAINER_ID": str(inst.id),
                "CONTAINER_API_KEY": inst.container_key,
                "VAST_CONTAINERLABEL": f"C.{inst.id}",
                "AUTOSLM_VAST_URL": self.url,
            }
            inst.process = self.start_pod_process(str(inst.id), command, inst.env, injected)
        inst.actual_status = "running" if self.boot_s <= 0 else "loading"
        return Response(200, {"success": True, "new_contract": inst.id})

    def _list(self, req: Request) -> Response:
        try:
            filters = json.loads(req.q("select_filters") or "{}")
            limit = int(req.q("limit") or self.page_size)
        except ValueError:
            return self._err(400, "invalid_args", "select_filters must be JSON")
        limit = max(1, min(limit, self.page_size))
        after = int(req.q("after_token") or 0)
        with self.lock:
            rows = [self._inst_json(i) for i in sorted(self._instances.values(), key=lambda i: i.id) if not i.destroyed]
        for col, cond in filters.items():
            if isinstance(cond, dict):
                rows = [r for r in rows if _match(r.get(col), cond)]
        rows = [r for r in rows if r["id"] > after]
        page = rows[:limit]
        more = len(rows) > limit
        labels: dict[str, int] = {}
        for r in rows:
            labels[r["label"] or ""] = labels.get(r["label"] or "", 0) + 1
        return Response(
            200,
            {
                "instances": page,
                "next_token": str(page[-1]["id"]) if more and page else None,
                "total_instances": len(rows),
                "label_counts": labels,
            },
        )

    def _destroy(self, inst: FakeInstance) -> None:
        with self.lock:
            inst.destroyed = True
            inst.offer["rented"] = False  # the machine goes back on the market
        if inst.process:
            inst.process.kill(self.terminate_grace_s)

    def _inst_json(self, inst: FakeInstance) -> dict:
        actual = self.status_of(inst)
        o = inst.offer
        return {
            "id": inst.id,
            "label": inst.label,
            "actual_status": actual,
            "intended_status": inst.intended_status,
            "cur_state": "unloaded" if inst.destroyed else ("running" if actual in ("running", "loading") else "stopped"),
            "status_msg": inst.status_msg,
            "image_uuid": inst.image,
            "image_args": inst.args,
            "extra_env": [[k, v] for k, v in inst.env.items()],  # Vast echoes the env: never print an instance
            "gpu_name": o["gpu_name"],
            "num_gpus": o["num_gpus"],
            "gpu_ram": o["gpu_ram"],
            "dph_total": inst.price if actual in ("running", "loading") else 0.0,
            "is_bid": inst.is_bid,
            "min_bid": o["min_bid"],
            "machine_id": o["machine_id"],
            "geolocation": o["geolocation"],
            "disk_space": inst.disk,
            "start_date": inst.created_at,
        }


def _offer(oid, gpu_name, num_gpus, gpu_ram, dph_total, min_bid, reliability, geolocation, cpu_ram=None) -> dict:
    return {
        "id": oid,
        "ask_contract_id": oid,
        "machine_id": oid * 10,
        "gpu_name": gpu_name,
        "num_gpus": num_gpus,
        "cpu_ram": cpu_ram if cpu_ram is not None else 32768 * num_gpus,  # MiB of host RAM the offer rents
        "gpu_ram": gpu_ram,
        "gpu_total_ram": gpu_ram * num_gpus,
        "dph_total": dph_total,
        "dph_base": dph_total,
        "min_bid": min_bid,
        "reliability2": reliability,
        "reliability": reliability,
        "verified": True,
        "verification": "verified",
        "rentable": True,
        "rented": False,
        "external": False,
        "geolocation": geolocation,
        "disk_space": 500.0,
        "cuda_max_good": 13.0,
        "inet_down": 1000.0,
    }


def _match(value: Any, cond: dict) -> bool:
    for op, want in cond.items():
        if op == "eq" and value != want:
            return False
        if op == "neq" and value == want:
            return False
        if op == "in" and value not in want:
            return False
        if op == "notin" and value in want:
            return False
        if op in ("gt", "gte", "lt", "lte"):
            if value is None:
                return False
            if (
                (op == "gt" and not value > want)
                or (op == "gte" and not value >= want)
                or (op == "lt" and not value < want)
                or (op == "lte" and not value <= want)
            ):
                return False
    return True


@pytest.fixture
def fake_vast(tmp_path: Path):
    """A started FakeVast; every instance process is killed at teardown."""
    with FakeVast(workdir=tmp_path / "fake-vast") as fake:
        yield fake
