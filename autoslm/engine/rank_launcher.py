"""The launcher: ``compute.gpu_count = N > 1`` (or ``compute.nodes = K > 1``) turns the worker the
provider started into the process that starts the ranks of its own pod (engine/distributed.py says what
each rank does) and waits for them.

It starts them through torch's elastic launcher (the engine behind ``torchrun`` and ``accelerate
launch``): one rank per GPU, or N CPU processes over gloo on a machine without CUDA. On one pod: a
private rendezvous on 127.0.0.1 and one working directory the ranks share. On K pods (engine/nodes.py):
every pod's worker is its pod's launcher, and the K launchers meet at the primary (node 0) in a static
rendezvous, so global rank = NODE_RANK x gpu_count + local rank and rank 0 is on node 0; each pod keeps
its own working directory. When a rank fails, the elastic agent stops every other one of its pod; the
launcher's error names the first rank that failed for a reason of its own, its node, and its message,
which each rank leaves in its elastic error file (``record_failure``, with ``is_follower``: whether it
failed only because another rank did; both ends of that file are here). A pod whose ranks only
followed another pod's failure raises ``PeerNodeFailed``: that pod's launcher reports the cause.
SIGTERM (a preempted pod) stops the ranks and raises the runner's ``Preempted``.

It must never import transformers: the launcher only starts processes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from autoslm.engine.distributed import FollowerError, world_size
from autoslm.engine.nodes import Node
from autoslm.errors import FatalWorkerError, WorkerError

# Exit codes of a rank (the runner's): 0 done, 1 retryable, 2 fatal, 143 SIGTERM.
_FATAL_EXIT = 2
# Seconds the elastic agent waits for ranks to stop after SIGTERM before it kills them.
SHUTDOWN_TIMEOUT_S = 60
# Seconds the nodes of a group wait for each other at the primary: a vendor starts pods minutes apart
# (an image pulled on one, cached on another).
NODES_TIMEOUT_S = 1800


class PeerNodeFailed(WorkerError):
    """This pod's ranks failed only because a rank on another pod did (a peer's socket closed): the
    failing rank's own pod reports why, so this one writes nothing to the run's error record."""


def describe(n: int, cuda_devices: int, node: Node = Node()) -> str:
    here = f"{n} training processes on {n} GPUs (nccl)" if cuda_devices else f"{n} CPU training processes (gloo)"
    if not node.several:
        return here
    return f"{here} on {node}, {n * node.count} in all, meeting at {node.endpoint}"


def cuda_device_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def launch_ranks(ctx, spec, log: Callable[[str], None], preempted: type[BaseException], node: Node = Node()) -> None:
    """Start this pod's ranks of the worker (``compute.gpu_count``; on one pod of one GPU, none: it is
    not called) and wait for them. Returns when all succeeded; raises (naming the first failing rank)
    when one failed, ``preempted`` on SIGTERM."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import elastic_launch

    n = int(spec.compute.gpu_count) if node.several else world_size(spec)
    gpus = cuda_device_count()
    if gpus and gpus < n:
        raise FatalWorkerError(
            f"compute.gpu_count = {n} but this machine has {gpus} GPU(s)",
            hint="the pod was given fewer GPUs than asked; relaunch or lower compute.gpu_count",
        )
    log(f"[autoslm] starting {describe(n, gpus, node)}")
    rank_dir = ctx.workdir / "ranks"
    rank_dir.mkdir(parents=True, exist_ok=True)
    config = launch_config(f"{ctx.run_id}-s{ctx.seed}-a{ctx.attempt}", n, node)
    # The ranks inherit this process's environment; they share one working directory.
    saved = {k: os.environ.get(k) for k in ("AUTOSLM_WORKDIR", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "OMP_NUM_THREADS")}
    os.environ["AUTOSLM_WORKDIR"] = str(rank_dir)
    os.environ["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(SHUTDOWN_TIMEOUT_S)
    if not gpus and not saved["OMP_NUM_THREADS"]:
        # CPU ranks share the cores (all nodes' ranks, when the nodes are processes of this machine):
        # without this each would start a thread per core and thrash.
        sharing = n * (node.count if node.loopback else 1)
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // sharing))
    previous = signal.getsignal(signal.SIGTERM)
    try:
        elastic_launch(config, sys.executable)("-m", "autoslm.engine")
    except ChildFailedError as e:
        raise rank_failure(e.failures, n * node.count, node) from None
    except SignalException as e:
        if e.sigval == signal.SIGTERM:
            raise preempted() from None
        raise WorkerError(f"the launcher was stopped by {signal.Signals(e.sigval).name}") from None
    except (RendezvousError, RuntimeError) as e:
        if not node.several or isinstance(e, ChildFailedError):
            raise
        # The nodes never met (one did not start, or died first): the primary says so, the others only log it.
        text = f"{node} could not meet the other nodes at {node.endpoint}: {type(e).__name__}: {e}"
        raise WorkerError(text) if node.primary else PeerNodeFailed(text) from None
    finally:
        signal.signal(signal.SIGTERM, previous)  # the elastic agent installs its own handlers
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def launch_config(run_id: str, n: int, node: Node = Node()):
    """The elastic launcher's configuration: one pod's private rendezvous, or K pods' static one at the
    primary (node 0's agent holds the store there; every node's agent names its own rank)."""
    from torch.distributed.launcher.api import LaunchConfig

    common = {"nproc_per_node": n, "run_id": run_id, "max_restarts": 0, "monitor_interval": 0.5}
    # max_restarts = 0: a failed rank ends the attempt; the controller relaunches from the checkpoint.
    if not node.several:
        # torchrun --standalone: a private rendezvous on a free local port.
        return LaunchConfig(
            min_nodes=1, max_nodes=1, rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", local_addr="127.0.0.1", **common
        )
    return LaunchConfig(
        min_nodes=node.count,
        max_nodes=node.count,
        rdzv_backend="static",
        rdzv_endpoint=node.endpoint,
        rdzv_configs={"rank": node.rank, "timeout": NODES_TIMEOUT_S},
        local_addr="127.0.0.1" if node.loopback else None,
        **common,
    )


def rank_failure(failures: dict, world: int, node: Node = Node()) -> WorkerError:
    """The error of the first rank that failed for a reason of its own (not because another did); on
    one of several pods whose ranks all only followed, ``PeerNodeFailed``."""

    def key(item):
        rank, f = item
        data = (getattr(f, "error_file_data", None) or {}).get("autoslm") or {}
        # A rank's own error first, then a rank that died without one (killed, crashed), then the
        # ranks that failed because a peer did; the earliest of a kind.
        kind = 0 if data and not data.get("follower") else 2 if data else 1
        return kind, data.get("time", getattr(f, "timestamp", 0)), rank

    rank, f = min(failures.items(), key=key)
    data = (getattr(f, "error_file_data", None) or {}).get("autoslm") or {}
    message = f.message if isinstance(f.message, str) else json.dumps(f.message)[:2000]
    if not data:  # no error file: the rank died (a signal, the OOM killer, a crash in native code)
        message = f"exited with code {f.exitcode}" + (f": {message}" if f.exitcode < 0 else "")
    retryable = data.get("retryable", f.exitcode != _FATAL_EXIT)
    where = f" on node {node.rank}" if node.several else ""
    text = f"rank {rank} of {world}{where} failed: {message}"
    if node.several and data.get("follower"):  # the best this pod has is a rank that only followed
        return PeerNodeFailed(text)
    return WorkerError(text) if retryable else FatalWorkerError(text)


def record_failure(env: dict[str, str], message: str, retryable: bool, follower: bool = False) -> None:
    """Leave this rank's error where the elastic agent hands it to the launcher (its error file)."""
    path = env.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(
            json.dumps(
                {
                    "message": message,
                    "timestamp": int(time.time()),
                    "autoslm": {"retryable": retryable, "follower": follower, "time": time.time()},
                }
            )
        )
    except OSError:
        pass


# How gloo and NCCL fail on a rank whose peer died first: a consequence, not a cause.
_PEER_FAILURE = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "remote process exited",
    "Socket Timeout",
    "NCCL communicator was aborted",
    "ProcessGroupNCCL",
)


def is_follower(e: BaseException) -> bool:
    """This rank failed because another one did (rank 0's error broadcast, or a dead peer's socket)."""
    if isinstance(e, FollowerError):
        return True
    try:
        import torch.distributed as td

        if isinstance(e, td.DistError):
            return True
    except (ImportError, AttributeError):
        pass
    return any(p in str(e) for p in _PEER_FAILURE)
