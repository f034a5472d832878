"""The nodes of a replica of several pods (``compute.nodes``), as the registry keeps them and `status`,
`watch` and the report show them. Pure: no I/O.

A replica of K pods is supervised as one pod through its group handle (``providers/base.group_status``);
each look's ``PodStatus.nodes`` (each node's pod id, state, message and exit code, by node rank) is kept on
the replica's record as JSON (``ReplicaRecord.nodes``: ``recorded``), so that a status read without
asking the vendor still says which node is doing what. Node 0 holds training rank 0 (the one that
reports to the store); node i holds ranks i x gpu_count to (i + 1) x gpu_count - 1. A group ended here
keeps its last look, its live nodes marked terminated (``ended``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NodeRow:
    """One node of a seed, as ``status --json`` lists it under the seed's ``nodes``: its node rank, the
    training ranks it holds, and what the last look saw of its pod (None before any look)."""

    node: int
    ranks: tuple[int, ...]
    pod_id: str | None = None
    state: str | None = None
    message: str | None = None
    exit_code: int | None = None

    def to_json(self) -> dict:
        return {
            "node": self.node,
            "ranks": list(self.ranks),
            "pod_id": self.pod_id,
            "state": self.state,
            "message": self.message,
            "exit_code": self.exit_code,
        }


def recorded(nodes) -> str | None:
    """A look's ``PodStatus.nodes`` as the replica's record keeps them (None for one pod)."""
    if not nodes:
        return None
    return json.dumps(
        [
            {"node": n.node, "pod_id": n.pod_id, "state": n.state, "message": n.message or None, "exit_code": n.exit_code}
            for n in nodes
        ]
    )


def _read(text: str | None) -> list[dict[str, Any]]:
    try:
        found = json.loads(text) if text else []
    except ValueError:
        return []  # a record this version cannot read: said as "not looked at yet"
    return [n for n in found if isinstance(n, dict) and isinstance(n.get("node"), int)] if isinstance(found, list) else []


def ended(text: str | None) -> str | None:
    """The record of a group this controller ended: its nodes that still lived at the last look are
    terminated now (those that exited keep their exit code)."""
    found = _read(text)
    if not found:
        return text
    for n in found:
        if n.get("state") in ("pending", "running", "unknown"):
            n["state"], n["message"] = "terminated", "ended with its group"
    return json.dumps(found)


def node_rows(text: str | None, nodes: int, gpu_count: int) -> tuple[NodeRow, ...]:
    """Every node of a replica of ``nodes`` pods (() for one pod), each with what its record says."""
    if nodes <= 1:
        return ()
    by_node = {n["node"]: n for n in _read(text)}
    rows = []
    for i in range(nodes):
        n = by_node.get(i, {})
        rows.append(
            NodeRow(
                node=i,
                ranks=tuple(range(i * gpu_count, (i + 1) * gpu_count)),
                pod_id=n.get("pod_id"),
                state=n.get("state"),
                message=n.get("message"),
                exit_code=n.get("exit_code"),
            )
        )
    return tuple(rows)


def node_words(n: NodeRow) -> str:
    """One node as a line says it: "node 0 (rank 0): running", "node 1 (ranks 2-3): exited 137"."""
    lo, hi = n.ranks[0], n.ranks[-1]
    ranks = f"rank {lo}" if lo == hi else f"ranks {lo}-{hi}"
    state = n.state or "not looked at yet"
    if n.state == "exited" and n.exit_code is not None:
        state = f"exited {n.exit_code}"
    elif n.state == "terminated" and n.message:
        state = f"terminated ({n.message})"
    return f"node {n.node} ({ranks}): {state}"
