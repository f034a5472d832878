"""``compute.nodes = K`` on this machine: K real processes of one replica, joined over 127.0.0.1.

The promises: each node is its own process (own session, working directory and log) with the node's
environment (NODE_RANK, NUM_NODES, MASTER_ADDR, MASTER_PORT: one free port for all); one handle stands
for the group (node 0's id first), listed once by its name; a node lost ends nothing by itself but
makes the group "exited" naming it; terminate ends every node and is idempotent; one pod keeps its id.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from autoslm.providers.base import POD_LABEL
from autoslm.providers.local.provider import LocalProvider, members
from tests.fakes.cloud import wait_for, written_json
from tests.fakes.pods import pod_request

# A node: says what it was given, then waits to be ended (a node 1 told to exit does so).
NODE = [
    "python",
    "-c",
    "import json, os, sys, time; from pathlib import Path; "
    "keys = ('NODE_RANK', 'NUM_NODES', 'MASTER_ADDR', 'MASTER_PORT', 'AUTOSLM_WORKDIR', 'AUTOSLM_RUN_ID'); "
    "said = {k: os.environ.get(k) for k in keys}; said.update(cwd=os.getcwd(), pid=os.getpid(), sid=os.getsid(0)); "
    "Path('said.json.tmp').write_text(json.dumps(said)); os.replace('said.json.tmp', 'said.json'); "
    "print('node', said['NODE_RANK'], 'up', flush=True); "
    "sys.exit(int(os.environ.get('EXIT_NOW', '-1'))) if os.environ.get('EXIT_NOW') else time.sleep(120)",
]


def said(workdir: Path) -> dict:
    path = workdir / "said.json"
    return wait_for(lambda: written_json(path), timeout=30)


def test_two_nodes_are_two_processes_of_one_group(tmp_path):
    provider = LocalProvider(home=tmp_path / "home")
    log = tmp_path / "home" / "logs" / "r1" / "seed0.log"
    request = pod_request("autoslm-r1-s0-a1", NODE, {"AUTOSLM_RUN_ID": "r1"}, log_path=str(log), nodes=2)
    handle = provider.launch(request)
    ids = members(handle.pod_id)
    assert len(ids) == 2 and handle.pod_id == "+".join(ids) and handle.name == "autoslm-r1-s0-a1"
    assert handle.price_per_hour == 0.0 and handle.gpu.startswith("2 nodes of 1 ")

    dirs = [tmp_path / "home" / "pods" / "autoslm-r1-s0-a1" / f"node{i}" for i in range(2)]
    nodes = [said(d) for d in dirs]
    for i, (node, d) in enumerate(zip(nodes, dirs)):
        assert (node["NODE_RANK"], node["NUM_NODES"], node["MASTER_ADDR"]) == (str(i), "2", "127.0.0.1")
        assert node["AUTOSLM_WORKDIR"] == node["cwd"] == str(d) and node["AUTOSLM_RUN_ID"] == "r1"
        assert node["sid"] == int(ids[i].split("-")[1])  # node i's id names its session, node 0 first
    assert nodes[0]["MASTER_PORT"] == nodes[1]["MASTER_PORT"] and int(nodes[0]["MASTER_PORT"]) > 0
    assert os.getsid(0) not in {n["sid"] for n in nodes}  # not this terminal's: Ctrl-C here ends no node
    # Node 0 writes the replica's log (what `autoslm logs` shows), node 1 its own beside it.
    wait_for(lambda: "node 0 up" in log.read_text() and "node 1 up" in (log.parent / "seed0.node1.log").read_text())
    assert "node 1" not in log.read_text()

    st = wait_for(lambda: (s := provider.status(handle)).state == "running" and s)
    assert [(n.node, n.pod_id, n.state) for n in st.nodes] == [(0, ids[0], "running"), (1, ids[1], "running")]
    listed = provider.list_pods(POD_LABEL)
    assert [(h.pod_id, h.name) for h in listed] == [(handle.pod_id, "autoslm-r1-s0-a1")]  # the group, once

    # Node 1's process lost (as the OOM killer would): the group is "exited", naming node 1; node 0 lives on
    # until the controller ends it, and the group is still listed (gc and the supervisor can end it).
    os.kill(nodes[1]["pid"], signal.SIGKILL)
    st = wait_for(lambda: (s := provider.status(handle)).state == "exited" and s)
    assert "node 1 of 2" in st.message and st.exit_code == 137 and st.nodes[0].state == "running"
    assert [h.pod_id for h in provider.list_pods(POD_LABEL)] == [handle.pod_id]

    provider.terminate(handle)
    assert not dirs[0].exists() and not dirs[1].exists()  # the group's working directories went with it
    # Node 0 ended (no exit code: killed), node 1 as it exited: nothing of the group runs.
    assert [(n.state, n.exit_code) for n in provider.status(handle).nodes] == [("terminated", None), ("exited", 137)]
    provider.terminate(handle)  # again: nothing left, no error
    assert provider.list_pods(POD_LABEL) == []


def test_a_node_that_cannot_start_ends_those_started_before_it(tmp_path):
    provider = LocalProvider(home=tmp_path / "home")
    log = tmp_path / "home" / "logs" / "r2" / "seed0.log"
    (log.parent).mkdir(parents=True)
    (log.parent / "seed0.node1.log").mkdir()  # node 1's log cannot be opened
    request = pod_request("autoslm-r2-s0-a1", NODE, log_path=str(log), nodes=2)
    from autoslm.errors import ProviderError

    try:
        provider.launch(request)
    except ProviderError as e:
        assert "could not start node 1 of autoslm-r2-s0-a1" in str(e)
    else:
        raise AssertionError("a half-started group was handed back")
    assert provider.list_pods(POD_LABEL) == []


def test_every_node_exited_0_is_done_and_one_pod_keeps_its_id(tmp_path):
    provider = LocalProvider(home=tmp_path / "home")
    request = pod_request("autoslm-r3-s0-a1", NODE, {"EXIT_NOW": "0"}, log_path=str(tmp_path / "r3.log"), nodes=3)
    handle = provider.launch(request)
    st = wait_for(lambda: (s := provider.status(handle)).state == "exited" and s)
    assert st.exit_code == 0 and [n.node for n in st.nodes] == [0, 1, 2] and all(n.exit_code == 0 for n in st.nodes)
    one = provider.launch(pod_request("autoslm-r4-s0-a1", NODE, {"EXIT_NOW": "0"}, log_path=str(tmp_path / "r4.log")))
    assert "+" not in one.pod_id and one.pod_id.startswith("local-") and one.gpu is None
    st = wait_for(lambda: (s := provider.status(one)).state == "exited" and s)
    assert st.nodes == () and st.exit_code == 0
