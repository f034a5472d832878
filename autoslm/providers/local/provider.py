"""The local provider: the worker runs as a subprocess on this machine. No account, no GPU needed.

The worker is started in its own session (so Ctrl-C in the terminal that launched it does not kill
it), its output goes to a log file, and a small shell wrapper records its exit code beside the log.
The pod id is ``local-<pid>-<start time>``: the start time guards against a reused pid.
``compute.gpu_count = N > 1`` starts N training processes (the worker launches them): one per GPU
where this machine has NVIDIA GPUs, else N CPU processes over gloo; ``status`` shows which.

``compute.nodes = K > 1`` starts K node processes of the worker, joined over 127.0.0.1 as a vendor's
pods are over their private network: each in its own session, with its own working directory
(``<home>/pods/<name>/node<i>``: nodes share no disk), log, exit record and the node's environment
(``NODE_RANK``, ``NUM_NODES``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT``: a free port). One handle
stands for the group: its id is the members' ids joined by "+", node 0 first, and it lives, ends and
is listed as one pod (``base.group_status``). Node 0 (training rank 0, the one that reports) writes to
the run's log, which `autoslm logs` shows; node i to ``<log>.node<i>.log`` beside it (``base.node_log_path``:
`autoslm logs --node i`).
Where this machine has a GPU for every rank, each node gets its own (``CUDA_VISIBLE_DEVICES``); else
every node trains on CPU processes over gloo.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from autoslm.errors import ProviderError
from autoslm.layout import ENV_PRICE_PER_HOUR
from autoslm.procs import DEAD, GONE, Starting, group_alive, pid_state
from autoslm.providers.base import (
    POD_LABEL,
    GpuWish,
    NodeStatus,
    Offer,
    PodHandle,
    PodRequest,
    PodStatus,
    group_status,
    is_label,
    node_log_path,
)
from autoslm.secrets import autoslm_home

GROUP_SEP = "+"  # between the member ids of a group's pod id


def _proc_start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    return pid_state(pid) not in (GONE, DEAD)  # a zombie (exited, not yet reaped) counts as gone


def _same_process(pid: int, started: str) -> bool:
    """Alive and the very process we started (not a later one that reused the pid)."""
    if not _alive(pid):
        return False
    now = _proc_start_time(pid)
    return now == started if now is not None else started == "0"  # no /proc (macOS): trust the pid


def local_gpu_count() -> int:
    """NVIDIA GPUs the driver shows (no torch import: the control plane stays light)."""
    try:
        return len(list(Path("/proc/driver/nvidia/gpus").iterdir()))
    except OSError:
        return 0


def _visible_gpus() -> list[str]:
    """The GPUs a worker started here may use: CUDA_VISIBLE_DEVICES where it is set, else every one."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    return [str(i) for i in range(local_gpu_count())]


def node_devices(nodes: int, per_node: int) -> list[str]:
    """Each node's CUDA_VISIBLE_DEVICES: its own ``per_node`` GPUs where there are enough for every node
    (node ranks on one machine would otherwise all take GPU 0), else none: every node on CPU over gloo."""
    gpus = _visible_gpus()
    if len(gpus) >= nodes * per_node:
        return [",".join(gpus[i * per_node : (i + 1) * per_node]) for i in range(nodes)]
    return [""] * nodes


def describe_processes(n: int, nodes: int = 1) -> str | None:
    """What ``gpu_count = n`` (on each of ``nodes`` nodes) runs on here (None for one process, the plain case)."""
    if nodes > 1:
        cuda = len(_visible_gpus()) >= n * nodes
        each = f"{n} GPU{'s' * (n > 1)}" if cuda else f"{n} CPU process{'es' * (n > 1)}"
        return f"{nodes} nodes of {each} ({'nccl' if cuda else 'gloo'})"
    if n <= 1:
        return None
    return f"{n} GPUs ({n} processes, nccl)" if local_gpu_count() >= n else f"{n} CPU processes (gloo)"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now: node 0's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def members(pod_id: str) -> list[str]:
    """The member pod ids of a pod id (one for a single pod; node 0 first for a group)."""
    return pod_id.split(GROUP_SEP)


class LocalProvider:
    name = "local"

    def __init__(self, home: Path | None = None, python: str | None = None):
        self.home = Path(home) if home else autoslm_home()
        self.python = python or sys.executable
        self.pods_dir = self.home / "pods"

    @classmethod
    def from_env(cls, **kwargs) -> "LocalProvider":
        """No key, no URL: this machine, under $AUTOSLM_HOME."""
        return cls(**kwargs)

    def launch(self, request: PodRequest, offers: tuple[Offer, ...] | None = None) -> PodHandle:
        """Start the worker as a process of this machine, or ``wish.nodes`` of them joined as one group
        (no market: ``offers`` is None, nothing to pick)."""
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        log_path = Path(request.log_path) if request.log_path else self.home / "logs" / f"{request.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        k = request.wish.nodes
        if k > 1:
            pod_id = self._launch_group(request, log_path)
        else:
            pod_id = self._start(request, {}, log_path, self.pods_dir / f"{request.name}.exit", self.home, [])
        gpu = describe_processes(request.wish.gpu_count, k)
        return PodHandle(self.name, pod_id, price_per_hour=0.0, gpu=gpu, name=request.name)

    def _launch_group(self, request: PodRequest, log_path: Path) -> str:
        """Start the K nodes; a node that cannot start ends those started before it (no half group)."""
        k, port = request.wish.nodes, free_port()
        devices = node_devices(k, request.wish.gpu_count)
        started: list[str] = []
        try:
            for i in range(k):
                workdir = self.pods_dir / request.name / f"node{i}"
                workdir.mkdir(parents=True, exist_ok=True)
                env = {
                    "NODE_RANK": str(i),
                    "NUM_NODES": str(k),
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "AUTOSLM_WORKDIR": str(workdir),
                    "CUDA_VISIBLE_DEVICES": devices[i],
                }
                exit_file = self.pods_dir / f"{request.name}.node{i}.exit"
                self._start(request, env, node_log_path(log_path, i), exit_file, workdir, started, node=i)
        except BaseException as e:
            self._end(started)
            if isinstance(e, OSError):
                raise ProviderError(f"this machine could not start node {len(started)} of {request.name}: {e}") from None
            raise
        group = GROUP_SEP.join(started)
        for pod_id in started:  # the group's id in each member's record: listed once, as the group
            self._write_meta(pod_id, {**self._meta(pod_id), "group": group})
        return group

    def _start(
        self, request: PodRequest, extra: dict[str, str], log_path: Path, exit_file: Path, cwd: Path, into: list[str], node=None
    ) -> str:
        """One process of the worker in its own session, its exit code recorded in ``exit_file``; its pod id
        appended to ``into`` once its record is written (also when an interruption came mid-start)."""
        exit_file.unlink(missing_ok=True)
        command = [self.python if c in ("python", "python3") else c for c in request.command]
        wrapped = f"{shlex.join(command)}; echo $? > {shlex.quote(str(exit_file))}"
        env = {**os.environ, **request.env, **extra}
        env[ENV_PRICE_PER_HOUR] = "0"  # this machine costs nothing per hour: the in-pod money guard has its price
        # The worker runs the autoslm this controller is (a checkout need not be the installed one).
        root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root])
        meta = {"name": request.name, "label": POD_LABEL, "exit_file": str(exit_file), "log": str(log_path)}
        meta = meta if node is None else {**meta, "node": node}
        with open(log_path, "ab") as log:
            starting = self._starting(
                ["/bin/sh", "-c", wrapped],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=str(cwd),
            )
            try:
                starting.begin().started()  # raises what Popen raised, or a Ctrl-C that came meanwhile
            finally:
                # A Ctrl-C can land after the fork, inside Popen (procs.Starting): the worker runs on, so it
                # is recorded as any other (`cancel` and `gc` find it, a group's start ends it) before the
                # interruption goes on.
                proc = starting.process()
                if proc is not None:
                    into.append(self._record(proc, meta))
        return into[-1]

    def _starting(self, argv: list[str], **kwargs) -> Starting:
        """The worker's process, held before it starts (procs.Starting)."""
        return Starting(argv, **kwargs)

    def _record(self, proc: subprocess.Popen, meta: dict) -> str:
        pod_id = f"local-{proc.pid}-{_proc_start_time(proc.pid) or '0'}"
        self._write_meta(pod_id, meta)
        return pod_id

    def _parse(self, pod_id: str) -> tuple[int, str]:
        _, pid, started = pod_id.split("-", 2)
        return int(pid), started

    def _meta(self, pod_id: str) -> dict:
        try:
            return json.loads((self.pods_dir / f"{pod_id}.json").read_text())
        except (OSError, ValueError):
            return {}

    def _write_meta(self, pod_id: str, meta: dict) -> None:
        path = self.pods_dir / f"{pod_id}.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, path)  # list_pods never reads half a record

    def status(self, handle: PodHandle) -> PodStatus:
        ids = members(handle.pod_id)
        if len(ids) == 1:
            return self._status(ids[0])
        nodes = []
        for i, pod_id in enumerate(ids):
            st = self._status(pod_id)
            nodes.append(NodeStatus(i, pod_id, st.state, st.message, st.exit_code))
        return group_status(nodes, price_per_hour=0.0)

    def _status(self, pod_id: str) -> PodStatus:
        """One process's: running, exited with its recorded code, or terminated (killed: no code)."""
        pid, started = self._parse(pod_id)
        if _same_process(pid, started):
            return PodStatus("running", price_per_hour=0.0)
        meta = self._meta(pod_id)
        exit_code = None
        if meta.get("exit_file"):
            try:
                exit_code = int(Path(meta["exit_file"]).read_text().strip())
            except (OSError, ValueError):
                exit_code = None
        if exit_code is None:
            return PodStatus("terminated", "process is gone (killed)", price_per_hour=0.0)
        return PodStatus("exited", f"exit code {exit_code}", price_per_hour=0.0, exit_code=exit_code)

    def terminate(self, handle: PodHandle) -> None:
        """End the pod's process, or every node of a group at once; what is gone already is success. A
        group's working directories go with it (a worker removes its own as it exits; a killed one cannot)."""
        ids = members(handle.pod_id)
        self._end(ids)
        if len(ids) > 1:
            name = self._meta(ids[0]).get("name")
            if name and is_label(name):  # a name this provider made its directory of, never a path
                shutil.rmtree(self.pods_dir / name, ignore_errors=True)

    def _end(self, pod_ids: list[str]) -> None:
        live = []
        for pod_id in pod_ids:
            pid, started = self._parse(pod_id)
            if _same_process(pid, started) or group_alive(pid):
                live.append(pid)
        for pid in live:
            try:
                os.killpg(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        # Give the workers a moment to write their last heartbeat, then make sure they are gone.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(group_alive(pid) for pid in live):
            time.sleep(0.1)
        for pid in live:
            if group_alive(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def list_pods(self, label: str = POD_LABEL) -> list[PodHandle]:
        """This home's pods that still run: a group once (while any of its nodes runs), by its name."""
        if not self.pods_dir.is_dir():
            return []
        out, seen = [], set()
        for meta_file in self.pods_dir.glob("local-*.json"):
            meta = self._meta(meta_file.stem)
            pod_id = meta.get("group") or meta_file.stem
            if pod_id in seen or meta.get("label") != label:
                continue
            seen.add(pod_id)
            if any(self._status(m).state == "running" for m in members(pod_id)):
                out.append(PodHandle(self.name, pod_id, name=meta.get("name")))
        return out

    def offers(self, wish: GpuWish, *, lookup: bool = False) -> list[Offer]:
        return []
