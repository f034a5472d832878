"""`compute.nodes`: K pods of one replica in the JobSpec, `validate` and `plan` (the laptop's side, before
anything is rented), and the one rule that reads K pods as one pod for the controller (``group_status``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoslm.catalog import cost
from autoslm.catalog import model_info as resolve_model
from autoslm.controller.placement import gpu_wish, judge_offer
from autoslm.providers.base import NodeStatus, Offer, group_status
from autoslm.spec import load_spec
from autoslm.spec.kinds import spec_from_json
from tests.conftest import write_spec

GSM8K = Path(__file__).resolve().parents[2] / "jobspecs" / "qwen2.5-0.5b-gsm8k-grpo-gpu.toml"

SPEC = """
name = "nodes"
model = "autoslm/tiny"
[compute]
provider = "{provider}"
{gpu}
nodes = {nodes}
gpu_count = {gpu_count}
[environment]
id = "autoslm/arith"
[train]
method = "{method}"
max_steps = 4
{batch}
{store}
"""


def spec_text(provider="local", nodes=2, gpu_count=1, method="sft", batch="batch_size = 8"):
    rented = provider != "local"
    return SPEC.format(
        provider=provider,
        gpu='gpu = "H100 SXM"' if rented else "",
        nodes=nodes,
        gpu_count=gpu_count,
        method=method,
        batch=batch,
        store='[artifacts]\nstore = "hf"\nrepo = "me/runs"' if rented else "",
    )


def test_one_pod_records_no_nodes_and_several_keep_theirs(tmp_path):
    one = load_spec(write_spec(tmp_path / "one.toml", spec_text(nodes=1)))
    assert "nodes" not in json.loads(one.to_json())["compute"]  # the JSON every run recorded before
    two = load_spec(write_spec(tmp_path / "two.toml", spec_text(nodes=2, gpu_count=2)))
    again = spec_from_json(two.to_json())
    assert again.compute.nodes == 2 and again.compute.ranks == 4
    assert again.compute.ranks_written == "compute.nodes x compute.gpu_count = 2 x 2"
    assert gpu_wish(again.compute).nodes == 2


def test_validate_refuses_a_vendor_that_cannot_join_pods_in_one_line(tmp_path, cli):
    path = write_spec(tmp_path / "vast.toml", spec_text(provider="vast"))
    r = cli("validate", str(path))
    assert r.code == 2
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r.err
    assert "compute.nodes = 2" in lines[0] and "Vast" in lines[0] and "private network" in lines[0]
    assert '"runpod" (an Instant Cluster)' in lines[0] and '"hfjobs" (a network group)' in lines[0]
    assert "Traceback" not in r.err


@pytest.mark.parametrize(
    ("method", "batch", "field", "words"),
    [
        ("sft", "batch_size = 6", "train.batch_size", "over 4 processes (compute.nodes x compute.gpu_count = 2 x 2)"),
        ("grpo", "prompts_per_step = 6\ngroup_size = 2", "train.prompts_per_step", "over 4 processes"),
    ],
)
def test_batch_sizes_are_split_over_every_rank_of_every_pod(tmp_path, cli, method, batch, field, words):
    path = write_spec(tmp_path / "b.toml", spec_text(nodes=2, gpu_count=2, method=method, batch=batch))
    r = cli("validate", str(path))
    assert r.code == 2, r.out + r.err
    assert field in r.err and words in r.err
    ok = write_spec(tmp_path / "ok.toml", spec_text(nodes=2, gpu_count=1, method=method, batch=batch))
    assert cli("validate", str(ok)).code == 0


def test_plan_prices_every_pod_and_counts_the_all_reduce_between_them(tmp_path):
    one = load_spec(write_spec(tmp_path / "one.toml", spec_text(provider="runpod", nodes=1)))
    two = load_spec(write_spec(tmp_path / "two.toml", spec_text(provider="runpod", nodes=2)))
    offer = Offer("runpod", "H100 SXM", 1, 80, 2.69)
    a, b = judge_offer(one, offer), judge_offer(two, offer)
    assert (a.nodes, b.nodes) == (1, 2)
    assert b.price_per_hour == a.price_per_hour == 2.69  # the offer's: one pod
    assert b.max_cost_usd == pytest.approx(2 * a.max_cost_usd)
    # Half the steps' compute per pod, twice the pods: the cost of the training steps about doubles with
    # the set-up, which every pod pays; never less than one pod's.
    assert b.estimated_cost_usd > a.estimated_cost_usd


def test_the_gradient_all_reduce_between_pods_grows_with_the_pods_and_shrinks_with_the_link():
    spec = load_spec(GSM8K)
    info = resolve_model(spec.model)
    assert cost.gradient_sync_seconds(info, spec.train, 1, 1600) == 0.0
    fast, slow = (cost.gradient_sync_seconds(info, spec.train, 2, gbps) for gbps in (1600, 10))
    assert 0 < fast < slow
    assert cost.gradient_sync_seconds(info, spec.train, 4, 10) > slow
    # Counted in the step: two pods of one GPU are slower per step than one pod of two GPUs.
    pods = cost.step_seconds(info, "H100 SXM", spec.train, 1, nodes=2, link_gbps=10)
    gpus = cost.step_seconds(info, "H100 SXM", spec.train, 2)
    assert pods == pytest.approx(gpus + slow)


def node(i, state, code=None, message=""):
    return NodeStatus(i, f"p{i}", state, message, code)


@pytest.mark.parametrize(
    ("nodes", "state", "code", "words"),
    [
        ([node(0, "running"), node(1, "running")], "running", None, ""),
        ([node(0, "running"), node(1, "pending")], "pending", None, "1 of 2 nodes running"),
        ([node(0, "running"), node(1, "exited", 0)], "running", None, ""),  # one node done: the other still saves
        ([node(0, "exited", 0), node(1, "exited", 0)], "exited", 0, "all 2 nodes exited 0"),
        ([node(0, "running"), node(1, "terminated", message="preempted")], "exited", None, "node 1 of 2 (p1): preempted"),
        ([node(0, "running"), node(1, "exited", 2, "exit code 2")], "exited", 2, "node 1 of 2 (p1): exit code 2"),
        ([node(0, "terminated"), node(1, "terminated")], "terminated", None, "node 0 of 2"),
        ([node(0, "running"), node(1, "unknown")], "unknown", None, ""),
        # A vendor that says no exit code (RunPod): a node that exited may have finished its share.
        ([node(0, "running"), node(1, "exited")], "running", None, ""),
        ([node(0, "exited"), node(1, "exited")], "exited", None, "all 2 nodes exited"),
    ],
)
def test_a_group_of_pods_reads_as_one_pod(nodes, state, code, words):
    s = group_status(list(reversed(nodes)), price_per_hour=5.38)
    assert (s.state, s.exit_code) == (state, code)
    assert words in s.message
    assert [n.node for n in s.nodes] == [0, 1] and s.price_per_hour == 5.38


def test_plan_says_the_pods_and_their_price(tmp_path, cli):
    """`autoslm plan` of 2 pods on RunPod (its list prices, no key): the row is 2 pods of the GPU at twice
    its price an hour, and the best-offer line says both prices."""
    one = cli("plan", "--json", str(write_spec(tmp_path / "one.toml", spec_text(provider="runpod", nodes=1))))
    two = cli("plan", "--json", str(write_spec(tmp_path / "two.toml", spec_text(provider="runpod", nodes=2))))
    assert one.code == two.code == 0, one.err + two.err
    a, b = json.loads(one.out)[0], json.loads(two.out)[0]
    assert (a["nodes"], b["nodes"], b["price_per_hour"]) == (1, 2, a["price_per_hour"])
    text = cli("plan", str(tmp_path / "two.toml"), env={"COLUMNS": "120"})
    price = a["price_per_hour"]
    row = next(line for line in text.out.splitlines() if "2 pods x H100 SXM" in line)
    assert f"{2 * price:.3f}" in row.split()
    assert f"best offer: runpod 2 pods of H100 SXM at ${2 * price:.3f}/hour (${price:.3f} each)" in text.out
