"""Which pod of a replica a worker runs on (engine/nodes.py): the variables each pod of a group is given,
checked against compute.nodes, and what the launcher and the money guard make of them."""

from __future__ import annotations

import pytest

from autoslm.engine.nodes import Node
from autoslm.engine.pod.limits import replica_price
from autoslm.errors import FatalWorkerError
from autoslm.spec import validate_dict


def spec(nodes: int, gpus: int = 1):
    return validate_dict(
        {
            "name": "n",
            "model": "autoslm/tiny",
            "environment": {"id": "autoslm/arith"},
            "compute": {"provider": "local", "nodes": nodes, "gpu_count": gpus},
        }
    )


def env(**kw) -> dict[str, str]:
    return {"NODE_RANK": "1", "NUM_NODES": "2", "MASTER_ADDR": "10.65.0.2", "MASTER_PORT": "29500", **kw}


def test_one_node_reads_no_variables():
    # A single pod runs as it always has, whatever a vendor put in its environment.
    assert Node.from_env({"NODE_RANK": "3", "NUM_NODES": "9"}, spec(1)) == Node()
    assert not Node().several and Node().primary


def test_a_node_of_a_group_from_the_torchrun_variables():
    n = Node.from_env(env(), spec(2))
    assert (n.rank, n.count, n.endpoint, n.several, n.primary, n.loopback) == (1, 2, "10.65.0.2:29500", True, False, False)
    assert str(n) == "node 1 of 2"
    assert Node.from_env(env(NODE_RANK="0", MASTER_ADDR="127.0.0.1"), spec(2)).loopback


def test_runpods_primary_variables():
    n = Node.from_env({"NODE_RANK": "0", "NUM_NODES": "2", "PRIMARY_ADDR": "10.65.0.2", "PRIMARY_PORT": "29400"}, spec(2))
    assert (n.endpoint, n.primary) == ("10.65.0.2:29400", True)


def test_a_hugging_face_network_groups_alias_is_reached_through_its_prefix():
    e = {
        "NODE_RANK": "1",
        "NUM_NODES": "2",
        "AUTOSLM_PRIMARY_ALIAS": "n0",
        "HF_NETWORK_GROUP_PREFIX": "grp-ab12-",
        "MASTER_PORT": "29500",
    }
    assert Node.from_env(e, spec(2)).endpoint == "grp-ab12-n0:29500"
    with pytest.raises(FatalWorkerError, match="HF_NETWORK_GROUP_PREFIX"):
        Node.from_env({**e, "HF_NETWORK_GROUP_PREFIX": ""}, spec(2))


@pytest.mark.parametrize(
    "change, says",
    [
        ({"NUM_NODES": "3"}, "NUM_NODES = 3 in this pod's environment, but compute.nodes = 2"),
        ({"NUM_NODES": ""}, "compute.nodes > 1 but NUM_NODES is not in this pod's environment"),
        ({"NODE_RANK": ""}, "compute.nodes > 1 but NODE_RANK is not in this pod's environment"),
        ({"NODE_RANK": "2"}, "NODE_RANK = 2 is not a node of compute.nodes = 2 (0..1)"),
        ({"NODE_RANK": "one"}, "NODE_RANK = 'one' in this pod's environment is not a number"),
        ({"MASTER_ADDR": ""}, "no primary address: MASTER_ADDR (or PRIMARY_ADDR)"),
        ({"MASTER_PORT": ""}, "MASTER_PORT (or PRIMARY_PORT) is not in this pod's environment"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT = 70000 is not a port"),
    ],
)
def test_a_missing_or_disagreeing_variable_is_one_fatal_error(change, says):
    with pytest.raises(FatalWorkerError) as e:
        Node.from_env(env(**change), spec(2))
    assert says in str(e.value) and not e.value.retryable


def test_the_money_guard_counts_every_pod_of_the_replica():
    assert replica_price(1.5, spec(1)) == 1.5
    assert replica_price(1.5, spec(4)) == 6.0
    assert replica_price(None, spec(4)) is None


@pytest.mark.worker
def test_the_launcher_meets_the_other_nodes_at_the_primary():
    from autoslm.engine.rank_launcher import NODES_TIMEOUT_S, launch_config

    one = launch_config("r-s0-a1", 2)  # one pod: the private rendezvous it always had
    assert (one.min_nodes, one.max_nodes, one.nproc_per_node, one.rdzv_backend, one.rdzv_endpoint) == (
        1,
        1,
        2,
        "c10d",
        "127.0.0.1:0",
    )
    c = launch_config("r-s0-a1", 4, Node.from_env(env(), spec(2, 4)))
    assert (c.min_nodes, c.max_nodes, c.nproc_per_node, c.rdzv_backend, c.rdzv_endpoint) == (2, 2, 4, "static", "10.65.0.2:29500")
    assert c.rdzv_configs["rank"] == 1 and c.rdzv_configs["timeout"] == NODES_TIMEOUT_S >= 600 and c.max_restarts == 0
