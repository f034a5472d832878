"""The local provider: the worker runs as a subprocess on this machine. No account, no GPU needed.

The worker is started in its own session (so Ctrl-C in the terminal that launched it does not kill
it), its output goes to a log file, and a small shell wrapper records its exit code beside the log.
The pod id is ``local-<pid>-<start time>``: the start time guards against a reused pid.
``compute.gpu_count = N > 1`` starts N training processes (the worker launches them): one per GPU
where this machine has NVIDIA GPUs, else N CPU processes over gloo; ``status`` shows which.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from autoslm.layout import ENV_PRICE_PER_HOUR
from autoslm.procs import DEAD, GONE, pid_state
from autoslm.providers.base import POD_LABEL, GpuWish, Offer, PodHandle, PodRequest, PodStatus, one_pod
from autoslm.secrets import autoslm_home


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


def _group_alive(pgid: int) -> bool:
    """Any live (non-zombie) process left in the worker's process group."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return True
        except (ProcessLookupError, PermissionError):
            return False
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def local_gpu_count() -> int:
    """NVIDIA GPUs the driver shows (no torch import: the control plane stays light)."""
    try:
        return len(list(Path("/proc/driver/nvidia/gpus").iterdir()))
    except OSError:
        return 0


def describe_processes(n: int) -> str | None:
    """What ``gpu_count = n`` runs on here (None for one process, the plain case)."""
    if n <= 1:
        return None
    return f"{n} GPUs ({n} processes, nccl)" if local_gpu_count() >= n else f"{n} CPU processes (gloo)"


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
        """Start the worker as a process of this machine (no market: ``offers`` is None, nothing to pick)."""
        one_pod(request, "this machine")
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        log_path = Path(request.log_path) if request.log_path else self.home / "logs" / f"{request.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        exit_file = self.pods_dir / f"{request.name}.exit"
        exit_file.unlink(missing_ok=True)
        command = [self.python if c in ("python", "python3") else c for c in request.command]
        wrapped = f"{shlex.join(command)}; echo $? > {shlex.quote(str(exit_file))}"
        env = {**os.environ, **request.env}
        env[ENV_PRICE_PER_HOUR] = "0"  # this machine costs nothing per hour: the in-pod money guard has its price
        # The worker runs the autoslm this controller is (a checkout need not be the installed one).
        root = str(Path(__file__).resolve().parents[3])
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root])
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", wrapped],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=str(self.home),
            )
        started = _proc_start_time(proc.pid) or "0"
        pod_id = f"local-{proc.pid}-{started}"
        (self.pods_dir / f"{pod_id}.json").write_text(
            f'{{"name": "{request.name}", "label": "{POD_LABEL}", "exit_file": "{exit_file}", "log": "{log_path}"}}'
        )
        return PodHandle(self.name, pod_id, price_per_hour=0.0, gpu=describe_processes(request.wish.gpu_count), name=request.name)

    def _parse(self, pod_id: str) -> tuple[int, str]:
        _, pid, started = pod_id.split("-", 2)
        return int(pid), started

    def _meta(self, pod_id: str) -> dict:
        import json

        try:
            return json.loads((self.pods_dir / f"{pod_id}.json").read_text())
        except (OSError, ValueError):
            return {}

    def status(self, handle: PodHandle) -> PodStatus:
        pid, started = self._parse(handle.pod_id)
        meta = self._meta(handle.pod_id)
        if _same_process(pid, started):
            return PodStatus("running", price_per_hour=0.0)
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
        pid, started = self._parse(handle.pod_id)
        if not _same_process(pid, started) and not _group_alive(pid):
            return
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        # Give the worker a moment to write its last heartbeat, then make sure it is gone.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _group_alive(pid):
            time.sleep(0.1)
        if _group_alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def list_pods(self, label: str = POD_LABEL) -> list[PodHandle]:
        if not self.pods_dir.is_dir():
            return []
        out = []
        for meta_file in self.pods_dir.glob("local-*.json"):
            pod_id = meta_file.stem
            meta = self._meta(pod_id)
            handle = PodHandle(self.name, pod_id, name=meta.get("name"))
            if meta.get("label") == label and self.status(handle).state == "running":
                out.append(handle)
        return out

    def offers(self, wish: GpuWish, *, lookup: bool = False) -> list[Offer]:
        return []
