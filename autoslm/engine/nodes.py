"""Which pod of a replica this worker runs on (``compute.nodes = K > 1``), read once from the variables
the provider (or the vendor itself) puts in each pod's container.

Every pod of a group runs the same worker with the same AUTOSLM_* environment, plus:

    NODE_RANK, NUM_NODES      this pod's index (0..K-1) and K, which must equal compute.nodes
    MASTER_ADDR, MASTER_PORT  the primary pod (node 0), where the nodes meet; RunPod's Instant Clusters
                              also name it PRIMARY_ADDR, PRIMARY_PORT
    AUTOSLM_PRIMARY_ALIAS     on Hugging Face Jobs: node 0's alias in the network group; the primary is
                              then ``${HF_NETWORK_GROUP_PREFIX}<alias>`` (the platform sets the prefix)

A spec with one node reads none of these (a single pod runs as it always has). A variable that is
missing or disagrees with the spec is one fatal error naming it: a node that guessed would wait for
peers that never come, or join another run's rendezvous.

Pure: no I/O, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autoslm.errors import FatalWorkerError

HINT = "each pod of a group needs NODE_RANK, NUM_NODES and the primary's address; launch with `autoslm launch`, which sets them"


@dataclass(frozen=True)
class Node:
    """This pod's place in its replica. ``Node()`` is the single pod."""

    rank: int = 0
    count: int = 1
    addr: str = "127.0.0.1"
    port: int = 0

    @classmethod
    def from_env(cls, env: Mapping[str, str], spec) -> "Node":
        nodes = spec.compute.nodes
        if nodes <= 1:
            return cls()
        count = _int(env, "NUM_NODES")
        if count != nodes:
            raise FatalWorkerError(f"NUM_NODES = {count} in this pod's environment, but compute.nodes = {nodes}", hint=HINT)
        rank = _int(env, "NODE_RANK")
        if not 0 <= rank < nodes:
            raise FatalWorkerError(f"NODE_RANK = {rank} is not a node of compute.nodes = {nodes} (0..{nodes - 1})", hint=HINT)
        return cls(rank, nodes, primary_addr(env), _port(env))

    @property
    def several(self) -> bool:
        return self.count > 1

    @property
    def primary(self) -> bool:
        """Node 0: it holds rank 0, the one that talks to the store."""
        return self.rank == 0

    @property
    def endpoint(self) -> str:
        return f"{self.addr}:{self.port}"

    @property
    def loopback(self) -> bool:
        """The nodes meet on this machine (the local provider's K processes share its cores)."""
        return self.addr in ("localhost", "::1") or self.addr.startswith("127.")

    def __str__(self) -> str:
        return f"node {self.rank} of {self.count}"


def primary_addr(env: Mapping[str, str]) -> str:
    alias = (env.get("AUTOSLM_PRIMARY_ALIAS") or "").strip()
    if alias:
        prefix = (env.get("HF_NETWORK_GROUP_PREFIX") or "").strip()
        if not prefix:
            raise FatalWorkerError(
                f"AUTOSLM_PRIMARY_ALIAS = {alias!r} but HF_NETWORK_GROUP_PREFIX is not in this pod's environment",
                hint="the job must run in a network group (run_job's network_group)",
            )
        return prefix + alias
    addr = (env.get("MASTER_ADDR") or env.get("PRIMARY_ADDR") or "").strip()
    if not addr:
        raise FatalWorkerError("no primary address: MASTER_ADDR (or PRIMARY_ADDR) is not in this pod's environment", hint=HINT)
    return addr


def _port(env: Mapping[str, str]) -> int:
    name = "MASTER_PORT" if env.get("MASTER_PORT") else "PRIMARY_PORT"
    port = _int(env, name, missing="MASTER_PORT (or PRIMARY_PORT)")
    if not 0 < port < 65536:
        raise FatalWorkerError(f"{name} = {port} is not a port", hint=HINT)
    return port


def _int(env: Mapping[str, str], name: str, missing: str | None = None) -> int:
    raw = (env.get(name) or "").strip()
    if not raw:
        raise FatalWorkerError(f"compute.nodes > 1 but {missing or name} is not in this pod's environment", hint=HINT)
    try:
        return int(raw)
    except ValueError:
        raise FatalWorkerError(f"{name} = {raw!r} in this pod's environment is not a number", hint=HINT) from None
