"""A replica of several pods on Hugging Face Jobs: K jobs in one network group (``compute.nodes``), through
HFJobsProvider and the real huggingface_hub client against the fake Jobs server, each job a real process.

    .venv/bin/python -m pytest tests/integration/test_hfjobs_groups.py -q
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from autoslm.errors import ProviderError, ProviderRefused, ProviderUnavailable
from autoslm.providers.base import POD_LABEL, PodHandle
from autoslm.providers.hfjobs.group import network_names
from autoslm.providers.hfjobs.provider import HFJobsProvider
from autoslm.providers.http import RetryPolicy
from autoslm.vendors.hfjobs import data
from tests.fakes.cloud import wait_for, written_json
from tests.fakes.hfjobs import FakeHFJobs, fake_hfjobs, network_groups_resolve  # noqa: F401 - pytest fixture
from tests.fakes.pods import pod_request

NAME = "autoslm-run1-s0-a1-habcdef12"
SLEEP = ["python", "-c", "import time; time.sleep(60)"]
RULE = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?")


def make(fake: FakeHFJobs, *, timeout_s: float = 5.0, attempts: int = 3) -> HFJobsProvider:
    retry = RetryPolicy(attempts=attempts, backoff_s=0.01)
    return HFJobsProvider(fake.api_key, base_url=fake.url, timeout_s=timeout_s, retry=retry, sleep=lambda s: None)


def group(name: str = NAME, command=SLEEP, nodes: int = 2, **kw):
    request = pod_request(name, command, {"AUTOSLM_RUN_ID": "run1"}, gpu_types=("L4",), **kw)
    return dataclasses.replace(request, wish=dataclasses.replace(request.wish, nodes=nodes))


def live(fake: FakeHFJobs) -> list:
    return [j for j in fake.existing_pods() if fake._stage(j) in ("SCHEDULING", "RUNNING")]


def test_a_group_is_k_jobs_in_one_network_group_one_handle_listed_once_and_cancelled_whole(fake_hfjobs, tmp_path):  # noqa: F811
    out = tmp_path / "env"
    dump = [
        "python",
        "-c",
        f"import json, os, time; json.dump(dict(os.environ), open({str(out)!r} + os.environ['NODE_RANK'], 'w')); time.sleep(60)",
    ]
    p = make(fake_hfjobs)
    request = group(command=dump)
    handle = p.launch(request)

    first, second = fake_hfjobs.jobs()
    assert handle.pod_id == f"{first.id}+{second.id}" and handle.name == NAME
    assert handle.price_per_hour == pytest.approx(2 * 0.8) and handle.gpu == "L4"
    group_name, alias = network_names(NAME)
    assert (first.network_group, first.network_aliases) == (group_name, [alias])
    assert (second.network_group, second.network_aliases) == (group_name, [])
    assert [(j.labels[data.LABEL_NODE], j.labels[data.LABEL_NODES], j.labels[data.LABEL_POD]) for j in (first, second)] == [
        ("0", "2", NAME),
        ("1", "2", NAME),
    ]
    assert all(j.timeout_s and j.timeout_s >= data.MIN_TIMEOUT_S for j in (first, second))
    envs = [wait_for(lambda n=n: written_json(out.parent / f"env{n}")) for n in (0, 1)]
    for node, env in enumerate(envs):
        assert (env["NODE_RANK"], env["NUM_NODES"], env["AUTOSLM_PRIMARY_ALIAS"]) == (str(node), "2", alias)
        assert env["MASTER_PORT"] == envs[0]["MASTER_PORT"] and 20000 <= int(env["MASTER_PORT"]) < 30000
        assert env["HF_NETWORK_GROUP_PREFIX"] and env["AUTOSLM_PRICE_PER_HOUR"] == "0.8000"  # one job's
        assert data.KEY_ENV not in json.dumps(fake_hfjobs.launch_calls[node]["environment"])
    assert envs[0]["HOME"] != envs[1]["HOME"]  # each job its own machine: no shared disk

    # The same attempt again is the same group: nothing is created.
    assert p.launch(request).pod_id == handle.pod_id and len(fake_hfjobs.launch_calls) == 2

    st = wait_for(lambda: (s := p.status(handle)).state == "running" and s)
    assert [(n.node, n.pod_id, n.state) for n in st.nodes] == [(0, first.id, "running"), (1, second.id, "running")]
    assert st.price_per_hour == pytest.approx(1.6)
    (listed,) = p.list_pods(POD_LABEL)
    assert (listed.pod_id, listed.name, listed.price_per_hour) == (handle.pod_id, NAME, pytest.approx(1.6))
    assert list(p.statuses(POD_LABEL)) == [handle.pod_id] and p.statuses()[handle.pod_id].state == "running"

    p.terminate(handle)
    assert live(fake_hfjobs) == []
    p.terminate(handle)  # again: no error
    assert p.status(handle).state == "terminated" and p.list_pods(POD_LABEL) == []


def test_a_lost_node_ends_the_group_and_its_bill_runs_from_the_first_start_to_the_last_end(fake_hfjobs):  # noqa: F811
    p = make(fake_hfjobs)
    handle = p.launch(group())
    first, second = fake_hfjobs.jobs()
    wait_for(lambda: p.status(handle).state == "running")
    fake_hfjobs.crash(second.id)
    st = p.status(handle)
    assert st.state == "exited" and st.message.startswith(f"node 1 of 2 ({second.id}):"), st
    assert [n.state for n in st.nodes] == ["running", "exited"] and st.billed.until is None
    assert p.statuses()[handle.pod_id].state == "exited"
    assert [h.pod_id for h in p.list_pods()] == [handle.pod_id]  # still billing: gc would end it whole
    p.terminate(handle)
    st = p.status(handle)
    assert st.state == "exited" and st.billed.since == pytest.approx(min(j.started_at for j in (first, second)), abs=1.5)
    assert st.billed.until == pytest.approx(max(j.finished_at for j in (first, second)), abs=1.5)
    # One job of it alone (an id recorded before the group's) reads as the group: node 1 is missing.
    alone = p.status(PodHandle(p.name, first.id))
    assert alone.state != "running" and len(alone.nodes) == 2


def test_group_and_alias_names_keep_the_platforms_limits_for_the_longest_names(fake_hfjobs):  # noqa: F811
    longest = "autoslm-A_Very.Long-Run-Name-For-The-Longest-Ones-s12-a3-h1234abcd"[:43] + "-s12-a3-h1234abcd"
    long_other = longest.replace("-a3-", "-a4-")
    assert len(longest) == 60
    names = [network_names(n) for n in (longest, long_other, NAME)]
    for group_name, alias in names:
        assert len(group_name) <= data.GROUP_NAME_MAX and RULE.fullmatch(group_name)
        assert len(alias) <= data.ALIAS_MAX and RULE.fullmatch(alias)
    assert names[0] != names[1]  # each attempt a group of its own, however alike the names
    assert network_names(NAME)[0] == NAME  # a name that keeps the rule is itself
    p = make(fake_hfjobs)
    handle = p.launch(group(longest))  # the fake refuses names past the limits
    assert [j.network_group for j in fake_hfjobs.jobs()] == [names[0][0]] * 2 and handle.name == longest
    p.terminate(handle)


def test_a_lost_create_answer_is_found_by_the_nodes_labels_not_sent_again(fake_hfjobs):  # noqa: F811
    p = make(fake_hfjobs, timeout_s=0.5)
    fake_hfjobs.hang_next(1, seconds=1.5, method="POST", apply=True, body_has='"autoslm-node": "1"')
    handle = p.launch(group())
    assert len(fake_hfjobs.launch_calls) == 2 and len(live(fake_hfjobs)) == 2
    assert handle.pod_id == "+".join(j.id for j in fake_hfjobs.jobs())
    p.terminate(handle)


def test_a_group_an_earlier_launch_began_is_finished_not_doubled(fake_hfjobs):  # noqa: F811
    """Node 1's creates never answered (node 0 was cancelled) and land late, twice: the next launch of the
    attempt keeps the first, cancels the other and creates node 0 only."""
    fake_hfjobs.hang_next(2, seconds=30, method="POST", apply="late", body_has='"autoslm-node": "1"')
    with pytest.raises(ProviderUnavailable, match="node 1 of 2"):
        make(fake_hfjobs, timeout_s=0.3, attempts=2).launch(group())
    assert live(fake_hfjobs) == [] and len(fake_hfjobs.jobs()) == 1  # node 0, cancelled
    fake_hfjobs.release_holds()
    late = wait_for(lambda: len(live(fake_hfjobs)) == 2 and sorted(live(fake_hfjobs), key=lambda j: j.created_at))
    assert [j.labels[data.LABEL_NODE] for j in late] == ["1", "1"]
    p = make(fake_hfjobs)
    handle = p.launch(group())
    (zero,) = [j for j in live(fake_hfjobs) if j.labels[data.LABEL_NODE] == "0"]
    assert handle.pod_id == f"{zero.id}+{late[0].id}" and len(live(fake_hfjobs)) == 2
    assert fake_hfjobs._stage(late[1]) == "CANCELED"
    p.terminate(handle)


@pytest.mark.parametrize(
    "status, error",
    [(400, ProviderError), (402, ProviderRefused)],
    ids=["refused", "no-credits"],
)
def test_a_node_that_cannot_be_created_cancels_the_others_and_fails_as_one(fake_hfjobs, status, error):  # noqa: F811
    p = make(fake_hfjobs)
    fake_hfjobs.fail_next(1, status, method="POST", body_has='"autoslm-node": "1"')
    with pytest.raises(error, match="node 1 of 2") as raised:
        p.launch(group())
    assert not isinstance(raised.value, ProviderUnavailable)  # a refusal: nothing was left to land
    (zero,) = fake_hfjobs.jobs()  # node 1's create was refused before it reached the service
    assert zero.labels[data.LABEL_NODE] == "0" and fake_hfjobs._stage(zero) == "CANCELED" and p.list_pods() == []


def test_pod_logs_of_a_group_are_node_0s_and_say_so(fake_hfjobs):  # noqa: F811
    say = ["python", "-c", "import os; print('hello from node', os.environ['NODE_RANK'])"]
    p = make(fake_hfjobs)
    handle = p.launch(group(command=say))
    wait_for(lambda: p.status(handle).state == "exited")
    lines = list(p.pod_logs(NAME))
    first, second = handle.pod_id.split("+")
    assert lines[0] == f"[autoslm] {NAME}: node 0's log (job {first}); the other nodes' jobs: node 1: {second}"
    assert "hello from node 0" in lines and "hello from node 1" not in lines
    assert p.status(handle).state == "exited" and p.status(handle).exit_code == 0  # both COMPLETED: done


@pytest.mark.skipif(not network_groups_resolve(), reason="this machine allows no mount namespace (unshare --mount)")
def test_the_nodes_reach_node_0_at_the_prefix_and_its_alias(fake_hfjobs, tmp_path):  # noqa: F811
    """What the worker does with the variables (engine/nodes.py): node 0 listens on MASTER_PORT, node 1
    connects to ${HF_NETWORK_GROUP_PREFIX}<alias>:MASTER_PORT, each in its own job."""
    meet = [
        "python",
        "-c",
        "import os, socket, time\n"
        "port = int(os.environ['MASTER_PORT'])\n"
        "if os.environ['NODE_RANK'] == '0':\n"
        "    s = socket.create_server(('0.0.0.0', port)); c, _ = s.accept(); print('node 0 heard', c.recv(64).decode())\n"
        "else:\n"
        "    host = os.environ['HF_NETWORK_GROUP_PREFIX'] + os.environ['AUTOSLM_PRIMARY_ALIAS']\n"
        "    for _ in range(200):\n"
        "        try:\n"
        "            socket.create_connection((host, port), timeout=5).sendall(b'node 1 at ' + host.encode()); break\n"
        "        except OSError:\n"
        "            time.sleep(0.05)\n",
    ]
    p = make(fake_hfjobs)
    handle = p.launch(group(command=meet))
    st = wait_for(lambda: (s := p.status(handle)).state not in ("pending", "running") and s, timeout=30)
    zero = handle.pod_id.split("+")[0]
    assert st.state == "exited" and st.exit_code == 0, (st, fake_hfjobs.log(zero))
    prefix = fake_hfjobs.job(zero).env.get("HF_NETWORK_GROUP_PREFIX")  # the platform's, never the pod's env
    assert prefix is None and "node 0 heard node 1 at hfnet-" in fake_hfjobs.log(zero)


def test_the_fake_refuses_network_names_past_the_platforms_limits(fake_hfjobs):  # noqa: F811
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(endpoint=fake_hfjobs.url, token=fake_hfjobs.api_key)
    run = dict(image="img", command=SLEEP, flavor="l4x1", namespace="fake-user")
    for bad in (
        {"network_group": "Upper"},
        {"network_group": "g" * 47},
        {"network_group": "g", "network_aliases": ["a" * 35]},
        {"network_group": "g", "network_aliases": ["a", "a"]},
        {"network_group": "g", "network_aliases": ["under_score"]},
    ):
        with pytest.raises(HfHubHTTPError, match="invalid network|unique within a job"):
            api.run_job(**run, **bad)
    ok = api.run_job(**run, network_group="g" * 46, network_aliases=["a" * 34])
    assert (ok.network.group, ok.network.aliases) == ("g" * 46, ["a" * 34])
    assert api.inspect_job(job_id=ok.id, namespace="fake-user").network.aliases == ["a" * 34]
    api.cancel_job(job_id=ok.id, namespace="fake-user")


def test_a_serve_is_never_a_group(fake_hfjobs):  # noqa: F811
    from autoslm.providers.base import Serving

    with pytest.raises(ProviderError, match="serves from one job"):
        make(fake_hfjobs).launch(group(serving=Serving((8000,))))
    assert fake_hfjobs.launch_calls == []
