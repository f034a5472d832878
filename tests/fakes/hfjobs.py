"""A fake Hugging Face Jobs API on 127.0.0.1, whose jobs are local processes running the job's command.

    with FakeHFJobs(api_key=hf_token, workdir=tmp_path) as fake:   # or the ``fake_hfjobs`` fixture
        provider = HFJobsProvider(fake.api_key, base_url=fake.url, sleep=...)
        env_for_cli = fake.env()                                  # AUTOSLM_HFJOBS_URL (+ HF_TOKEN)

Serves the routes huggingface_hub's Jobs API calls, in its JSON shapes (``_jobs_api.JobInfo``,
``JobHardwareInfo``): GET /api/whoami-v2, GET /api/jobs/hardware, POST /api/jobs/{ns} (the job spec
``_create_job_spec`` builds: dockerImage, command, arguments, environment, secrets, flavor,
timeoutSeconds, labels), GET /api/jobs/{ns} (``label=k=v`` and ``stage=`` filters, one page), GET
/api/jobs/{ns}/{id}, POST /api/jobs/{ns}/{id}/cancel, GET /api/jobs/{ns}/{id}/logs (server-sent events,
``data: {"data": line, "timestamp": ...}``, as ``fetch_job_logs`` reads them). Errors are
``{"error": ...}`` as the Hub's.

A job starts its command at once (``schedule_s`` delays it; ``stuck_scheduling(True)`` keeps new jobs
in SCHEDULING) with its environment and secrets as variables; COMPLETED when the command exits 0, ERROR
otherwise; ``timeoutSeconds`` after it started the process group is killed and the job is ERROR with
"Job timed out". Cancel kills it (CANCELED); a finished job's cancel is a no-op. The API echoes
secrets' names only. Labels are held to Kubernetes' rule (63 characters of [A-Za-z0-9_.-], alphanumeric
at both ends: 400 otherwise), which huggingface_hub does not check. A job's exposed ports (the spec's ``expose``: ``ports``, ``portsPublic``) are
named in its status (``exposeUrls``) and reached through the fake's proxy, ``/jobs-proxy/<id>--<port>/...``
on this server, forwarded to the job's process on 127.0.0.1:<port> while the job runs: a port that is
not public answers only with the Hub token as a bearer (401 without it).

Network groups (``run_job(network_group=, network_aliases=)``: the spec's ``network``, ``{"group": ...,
"aliases": [...]}``, echoed in the job as ``network``): a group's name is 1 to 46 characters of lowercase
alphanumerics and dashes, an alias 1 to 34, unique within its job, and aliases need a group (400
otherwise, as the documented limits say; the fake also refuses a dash at either end, as a host name
would). Each job of a group is its own process in its own working directory (no shared disk), given the
platform's ``HF_NETWORK_GROUP_PREFIX`` (``hfnet-<8 hex of the group>-``) and ``HF_NETWORK_GROUP_HOSTNAME``
(``hfnet-<8 hex>``). Every job of a group runs in a mount namespace of its own (``unshare --mount``) whose
``/etc/hosts`` is the group's: this machine's hosts plus the group's host name and
``${HF_NETWORK_GROUP_PREFIX}<alias>`` for each alias a job of the group claims, all 127.0.0.1, written as
each job starts (a name resolves once the job claiming it runs, as a cluster's DNS answers). So a worker
that builds the primary's address from the prefix and the alias reaches it through the ordinary resolver
(Python's and torch's C++ store alike); one that ignores the prefix does not.
``network_groups_resolve()`` says whether this machine allows it (a mount namespace needs privileges);
where it does not, a group's jobs run without it and its names do not resolve.

Test API: ``no_credits(True)`` (creates answer 402), ``no_job_rights(True)`` (every Jobs route
answers 403, as for a read-only token), ``stuck_scheduling``, ``release_scheduling``, ``fail_next``/``hang_next``
(tests/fakes/cloud.py), ``jobs()``, ``job(id)``, ``log(id)``, ``expose_url(id, port)``, ``crash(id)`` (the host dies: the
process is killed, the job shows ERROR), ``launch_calls`` (create bodies).

Fidelity gaps: the proxy is a path on this server, not a host of its own per job and port, and it
forwards JSON bodies only; no image is pulled (the command runs directly, as in the other fakes); the log
stream ends with what there is instead of waiting for more (a follower reconnects, as it does when the real
one ends), its timestamps are the request's; no metrics stream; no pagination; no real flavor capacity. A group's members
all run on this machine, so they reach each other on 127.0.0.1 (every port is shared between them, where
each real job has its own: a port one member listens on is taken for the others), and nothing places a
group's jobs together or starts them together: each starts when it is created. Durations are whole seconds, as the API's:
scheduling and running only once a job has run (``JobInfo.durations``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import secrets as _secrets
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.cloud import LABEL_RULE, FakeCloud, PodProcess, Request, Response, label_ok

NAMESPACE = "fake-user"
PROXY = "jobs-proxy"  # the path of the fake's stand-in for the Jobs proxy (https://<job id>--<port>.hf.jobs)

# name, accelerator model, quantity, total VRAM GB, $ per minute (the API's unit)
DEFAULT_HARDWARE = [
    ("cpu-basic", None, 0, 0, 0.0001667),
    ("t4-small", "T4", 1, 16, 0.40 / 60),
    ("l4x1", "L4", 1, 24, 0.80 / 60),
    ("l4x4", "L4", 4, 96, 3.80 / 60),
    ("l40sx1", "L40S", 1, 48, 1.80 / 60),
    ("a100-large", "A100", 1, 80, 2.50 / 60),
    ("h200", "H200", 1, 141, 5.00 / 60),
]


@dataclass
class FakeJob:
    id: str
    image: str
    command: list[str]
    env: dict[str, str]
    secrets: dict[str, str]
    flavor: str
    timeout_s: int | None
    labels: dict[str, str]
    expose: list[int] = field(default_factory=list)
    expose_public: list[int] = field(default_factory=list)
    created_at: float = field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    stage: str = "SCHEDULING"
    message: str | None = None
    process: PodProcess | None = None
    timer: threading.Timer | None = None
    ending: bool = False  # stopped by the platform: its stage says so once its process is gone
    network_group: str | None = None
    network_aliases: list[str] = field(default_factory=list)


class FakeHFJobs(FakeCloud):
    vendor = "hfjobs"

    def __init__(self, *, hardware: list[tuple] | None = None, schedule_s: float = 0.0, **kw):
        super().__init__(**kw)
        self.hardware = list(hardware or DEFAULT_HARDWARE)
        self.schedule_s = schedule_s
        self._jobs: dict[str, FakeJob] = {}
        self._no_credits = False
        self._no_rights = False
        self._stuck = False

    def env(self) -> dict[str, str]:
        return {"AUTOSLM_HFJOBS_URL": self.url, "HF_TOKEN": self.api_key}

    # -- test API ----------------------------------------------------------------------------------

    def no_credits(self, flag: bool = True) -> None:
        self._no_credits = flag

    def no_job_rights(self, flag: bool = True) -> None:
        self._no_rights = flag

    def stuck_scheduling(self, flag: bool = True) -> None:
        """New jobs stay in SCHEDULING (no machine of the flavor comes free)."""
        self._stuck = flag

    def release_scheduling(self) -> None:
        """Every job waiting for a machine gets one now and runs (new ones too, from now on)."""
        self._stuck = False
        for job in self.jobs():
            self._start(job)

    def jobs(self) -> list[FakeJob]:
        with self.lock:
            return list(self._jobs.values())

    def job(self, job_id: str) -> FakeJob:
        return self._jobs[job_id]

    def log(self, job_id: str) -> str:
        j = self._jobs[job_id]
        return j.process.output() if j.process else ""

    def existing_pods(self) -> list[FakeJob]:
        """The jobs not cancelled or deleted (what "the pod exists" means for a job)."""
        return [j for j in self.jobs() if self._stage(j) not in ("CANCELED", "DELETED")]

    def running_jobs(self) -> list[FakeJob]:
        return [j for j in self.jobs() if j.process is not None and j.process.alive()]

    def crash(self, job_id: str) -> None:
        """The job's machine fails: its process dies at once and the job shows ERROR."""
        self._finish(self._jobs[job_id], "ERROR", "the job's machine failed")

    def kill_all(self) -> None:
        for j in self.jobs():
            if j.timer:
                j.timer.cancel()
            if j.process:
                j.process.kill()

    # -- vendor API --------------------------------------------------------------------------------

    def error_body(self, status: int, message: str) -> Any:
        return {"error": message}

    def expose_url(self, job_id: str, port: int) -> str:
        """Where the fake's proxy reaches ``port`` of a job (the real one: ``https://<id>--<port>.hf.jobs``)."""
        return f"{self.url}/{PROXY}/{job_id}--{port}"

    def handle(self, req: Request) -> Response:
        if req.path.startswith(f"/{PROXY}/"):
            return self._proxy(req)
        if req.token != self.api_key:
            return Response(401, {"error": "Invalid credentials in Authorization header"})
        s = [p for p in req.path.split("/") if p]
        if s == ["api", "whoami-v2"]:
            return Response(200, {"type": "user", "name": NAMESPACE, "fullname": "Fake User", "orgs": []})
        if s[:2] != ["api", "jobs"]:
            return Response(404, {"error": "not found"})
        if self._no_rights:
            return Response(403, {"error": "This token does not have the permission to run jobs (job.write)"})
        if s == ["api", "jobs", "hardware"] and req.method == "GET":
            return Response(200, [self._hardware_json(h) for h in self.hardware])
        if len(s) >= 3 and s[2] != NAMESPACE:
            return Response(403, {"error": f"you cannot run jobs in namespace {s[2]}"})
        if len(s) == 3 and req.method == "POST":
            return self._create(req.body)
        if len(s) == 3 and req.method == "GET":
            wanted = [tuple(v.split("=", 1)) for v in req.query.get("label", [])]
            stages = {v.upper() for v in req.query.get("stage", [])}
            return Response(
                200,
                [
                    self._job_json(j)
                    for j in self.jobs()
                    if all(j.labels.get(k) == v for k, v in wanted) and (not stages or self._stage(j) in stages)
                ],
            )
        job = self._jobs.get(s[3]) if len(s) >= 4 else None
        if job is None:
            return Response(404, {"error": "Job not found"})
        if len(s) == 4 and req.method == "GET":
            return Response(200, self._job_json(job))
        if s[4:] == ["logs"] and req.method == "GET":
            return self._logs(job)
        if s[4:] == ["cancel"] and req.method == "POST":
            if self._stage(job) in ("SCHEDULING", "RUNNING"):
                self._finish(job, "CANCELED", "canceled by the user", grace=self.terminate_grace_s)
            return Response(200, None)
        return Response(404, {"error": "not found"})

    def _create(self, body: Any) -> Response:
        with self.lock:
            self.launch_calls.append(body if isinstance(body, dict) else {"__body__": body})
        if self._no_credits:
            return Response(402, {"error": "You need prepaid credits to run jobs: add credits in your billing settings"})
        if not isinstance(body, dict) or not body.get("dockerImage") or not isinstance(body.get("command"), list):
            return Response(400, {"error": "dockerImage and command are required"})
        names = {h[0] for h in self.hardware}
        if body.get("flavor") not in names:
            return Response(400, {"error": f"unknown flavor {body.get('flavor')!r}"})
        network, refused = _network(body.get("network"))
        if refused:
            return Response(400, {"error": refused})
        bad = [f"{k}={v}" for k, v in (body.get("labels") or {}).items() if not (label_ok(k) and label_ok(str(v)))]
        if bad:
            # As Kubernetes holds labels: a job's labels are stored as its pod's.
            return Response(400, {"error": f"invalid labels {bad}: a key and a value must be {LABEL_RULE}"})
        env, secrets = body.get("environment") or {}, body.get("secrets") or {}
        if not all(isinstance(v, str) for v in {**env, **secrets}.values()):
            return Response(400, {"error": "environment and secrets values must be strings"})
        expose = body.get("expose") or {}
        ports, public = list(expose.get("ports") or []), list(expose.get("portsPublic") or [])
        if not all(isinstance(p, int) and 0 < p < 65536 for p in ports) or not set(public) <= set(ports):
            return Response(400, {"error": "expose.ports must be ports, expose.portsPublic a subset of them"})
        job = FakeJob(
            id=_secrets.token_hex(12),
            expose=ports,
            expose_public=public,
            image=body["dockerImage"],
            command=list(body["command"]) + list(body.get("arguments") or []),
            env=dict(env),
            secrets=dict(secrets),
            flavor=body["flavor"],
            timeout_s=body.get("timeoutSeconds"),
            labels=dict(body.get("labels") or {}),
            network_group=network.get("group"),
            network_aliases=list(network.get("aliases") or []),
        )
        with self.lock:
            self._jobs[job.id] = job
        created = self._job_json(job)  # the create answers with the job as made, before its machine runs anything
        if not self._stuck:
            if self.schedule_s > 0:
                threading.Timer(self.schedule_s, self._start, (job,)).start()
            else:
                self._start(job)
        return Response(200, created)

    def _start(self, job: FakeJob) -> None:
        with self.lock:
            if job.stage != "SCHEDULING" or job.ending or self._closing.is_set():
                return
            job.stage, job.started_at = "RUNNING", time.time()
            injected, wrap = {"JOB_ID": job.id}, None
            if job.network_group is not None:
                injected.update(network_env(job.network_group))
                wrap = self._in_group(job)
            job.process = self.start_pod_process(job.id, job.command, {**job.env, **job.secrets}, injected, wrap=wrap)
            if job.timeout_s:
                job.timer = threading.Timer(job.timeout_s, self._finish, (job, "ERROR", "Job timed out"))
                job.timer.daemon = True
                job.timer.start()

    def _finish(self, job: FakeJob, stage: str, message: str, grace: float = 0.0) -> None:
        """End the job as the platform does: its machine is stopped first, and only then does its stage
        say how it ended (a job shown ended runs nothing); billed to when the platform decided."""
        with self.lock:
            if job.stage in ("COMPLETED", "ERROR", "CANCELED", "DELETED") or job.ending:
                return
            job.ending, decided = True, time.time()
            if job.timer:
                job.timer.cancel()
        if job.process:
            job.process.kill(grace)
        with self.lock:
            job.stage, job.message, job.finished_at = stage, message, decided

    def _stage(self, job: FakeJob) -> str:
        """The live stage: a running job whose process exited is COMPLETED (exit 0) or ERROR."""
        if job.stage == "RUNNING" and not job.ending and job.process is not None and not job.process.alive():
            code = job.process.returncode
            with self.lock:
                if job.stage == "RUNNING" and not job.ending:
                    job.stage, job.finished_at = ("COMPLETED", time.time()) if code == 0 else ("ERROR", time.time())
                    job.message = None if code == 0 else f"the command exited with code {code}"
                    if job.timer:
                        job.timer.cancel()
        return job.stage

    def _job_json(self, job: FakeJob) -> dict:
        stage = self._stage(job)
        now = job.finished_at or time.time()
        return {
            "id": job.id,
            "createdAt": _iso(job.created_at),
            "startedAt": _iso(job.started_at) if job.started_at else None,
            "finishedAt": _iso(job.finished_at) if job.finished_at else None,
            "dockerImage": job.image,
            "command": job.command,
            "arguments": [],
            "environment": dict(job.env),  # the API echoes the environment: never a secret there
            "secrets": {k: None for k in job.secrets},
            "flavor": job.flavor,
            "labels": dict(job.labels),
            "status": {
                "stage": stage,
                "message": job.message,
                "exposeUrls": [self.expose_url(job.id, p) for p in job.expose] if job.expose else None,
            },
            "expose": {"ports": job.expose, "portsPublic": job.expose_public} if job.expose else None,
            # As the API computes them, in whole seconds: scheduling and running only once the job has run.
            "durations": {
                "schedulingSecs": int(job.started_at - job.created_at) if job.started_at else None,
                "runningSecs": int(now - job.started_at) if job.started_at else None,
                "totalSecs": int(now - job.created_at),
            },
            "network": {"group": job.network_group, "aliases": list(job.network_aliases)} if job.network_group else None,
            "owner": {"id": "0" * 24, "name": NAMESPACE, "type": "user"},
            "timeoutSeconds": job.timeout_s,
        }

    def _in_group(self, job: FakeJob):
        """How a group's job is started: in its own mount namespace, with the group's hosts file as its
        /etc/hosts (its names written first: the file is rewritten in place, so members already running see
        the new names); None where this machine allows no mount namespace."""
        group = job.network_group or ""
        hosts = self.workdir / "networks" / f"{group}.hosts"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        with self.lock:
            aliases = sorted(
                {a for j in self._jobs.values() if j.network_group == group and j.started_at for a in j.network_aliases}
            )
            env = network_env(group)
            names = [env["HF_NETWORK_GROUP_HOSTNAME"]] + [env["HF_NETWORK_GROUP_PREFIX"] + a for a in aliases]
            text = _MACHINE_HOSTS + "".join(f"127.0.0.1 {n}\n" for n in names)
            with open(hosts, "a+") as f:  # in place: a bind mount holds the file, not its name
                f.seek(0)
                f.truncate()
                f.write(text)
        if not network_groups_resolve():
            return None
        python = self.python

        def wrap(argv: list[str]) -> list[str]:
            argv = [python, *argv[1:]] if argv and argv[0] in ("python", "python3") else list(argv)
            script = 'mount --bind "$0" /etc/hosts && exec "$@"'
            return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(hosts), *argv]

        return wrap

    def _logs(self, job: FakeJob) -> Response:
        """The job's log as the API streams it (server-sent events, ``data: {"data", "timestamp"}``): once
        the job runs, a "Job started" line, then each line its command has written, then each new one as it
        is written; the stream ends when the job does (a client that does not follow stops reading
        sooner)."""

        def events() -> Iterator[bytes]:
            sent = 0
            while not self._closing.is_set():
                ended = self._stage(job) not in ("SCHEDULING", "RUNNING", "UPDATING")  # read before the output
                if job.started_at is not None:
                    text = job.process.output() if job.process else ""
                    whole = text.splitlines() if ended else text.split("\n")[:-1]  # a line still being written waits
                    lines = [f"===== Job started at {_iso(job.started_at)} ====="] + whole
                    for line in lines[sent:]:
                        yield f"data: {json.dumps({'data': line, 'timestamp': _iso(time.time())})}\n\n".encode()
                    sent = max(sent, len(lines))
                if ended:
                    return
                time.sleep(0.05)

        return Response(200, stream=events, content_type="text/event-stream")

    def _proxy(self, req: Request) -> Response:
        """The Jobs proxy: ``/<PROXY>/<job id>--<port>/...`` to the job's process on 127.0.0.1:<port>, while
        the job runs and only for a port it exposed; a port not exposed as public needs the Hub token."""
        target, _, rest = req.path[len(PROXY) + 2 :].partition("/")
        job_id, _, port_text = target.rpartition("--")
        job = self._jobs.get(job_id)
        port = int(port_text) if port_text.isdigit() else 0
        if job is None or port not in job.expose:
            return Response(404, {"error": "no such exposed port"})
        if port not in job.expose_public and req.token != self.api_key:
            return Response(401, {"error": "Invalid credentials in Authorization header"})
        if self._stage(job) != "RUNNING":
            return Response(503, {"error": f"job {job_id} is not running"})
        data = json.dumps(req.body).encode() if req.body is not None else None
        sent = urllib.request.Request(
            f"http://127.0.0.1:{port}/{rest}", data=data, method=req.method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(sent, timeout=30) as r:
                return Response(r.status, json.loads(r.read() or b"null"))
        except urllib.error.HTTPError as e:
            return Response(e.code, json.loads(e.read() or b"null"))
        except OSError as e:
            return Response(502, {"error": f"the job does not answer on port {port}: {e}"})

    @staticmethod
    def _hardware_json(h: tuple) -> dict:
        name, model, count, vram, per_min = h
        return {
            "name": name,
            "prettyName": name,
            "cpu": "8 vCPU",
            "ram": "30 GB",
            "ephemeralStorage": "100 GB",
            "accelerator": {"type": "gpu", "model": model, "quantity": str(count), "vram": f"{vram} GB", "manufacturer": "Nvidia"}
            if model
            else None,
            "unitCostMicroUSD": int(round(per_min * 1e6)),
            "unitCostUSD": per_min,
            "unitLabel": "minute",
        }


GROUP_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?")
GROUP_MAX, ALIAS_MAX = 46, 34  # huggingface_hub's documented limits (run_job's network_group, network_aliases)
try:
    _MACHINE_HOSTS = Path("/etc/hosts").read_text()
except OSError:
    _MACHINE_HOSTS = "127.0.0.1 localhost\n"
_MACHINE_HOSTS = _MACHINE_HOSTS if _MACHINE_HOSTS.endswith("\n") else _MACHINE_HOSTS + "\n"


def network_env(group: str) -> dict[str, str]:
    """The variables the platform sets in each job of a network group (the fake's values)."""
    key = hashlib.sha256(f"{NAMESPACE}/{group}".encode()).hexdigest()[:8]
    return {"HF_NETWORK_GROUP_PREFIX": f"hfnet-{key}-", "HF_NETWORK_GROUP_HOSTNAME": f"hfnet-{key}"}


def _network(spec: Any) -> tuple[dict, str | None]:
    """A create's ``network`` as the service holds it: (the network, or {} for none; why it is refused)."""
    if spec is None:
        return {}, None
    if not isinstance(spec, dict) or not isinstance(spec.get("group"), str):
        return {}, "network.group is required: the network group to join"
    group, aliases = spec["group"], spec.get("aliases") or []
    if len(group) > GROUP_MAX or not GROUP_NAME.fullmatch(group):
        return {}, f"invalid network group {group!r}: lowercase alphanumerics and dashes, {GROUP_MAX} characters max"
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        return {}, "network.aliases must be a list of names"
    for alias in aliases:
        if len(alias) > ALIAS_MAX or not GROUP_NAME.fullmatch(alias):
            return {}, f"invalid network alias {alias!r}: lowercase alphanumerics and dashes, {ALIAS_MAX} characters max"
    if len(set(aliases)) != len(aliases):
        return {}, f"network aliases must be unique within a job, got {aliases}"
    return {"group": group, "aliases": list(aliases)}, None


@functools.cache
def network_groups_resolve() -> bool:
    """Whether this machine lets the fake give a group's jobs their own /etc/hosts (a mount namespace)."""
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".hosts") as f:
            f.write(_MACHINE_HOSTS)
            f.flush()
            probe = ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount --bind "$0" /etc/hosts', f.name]
            return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@pytest.fixture
def fake_hfjobs(tmp_path: Path):
    """A started FakeHFJobs; every job process is killed at teardown."""
    with FakeHFJobs(api_key="hf_FakeJobsToken0123456789abcdef", workdir=tmp_path / "fake-hfjobs") as fake:
        yield fake
