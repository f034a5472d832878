"""`status --json` pinned, byte for byte, for a local run, an `hf://` run and a sweep.

The snapshots in ``snapshots/`` were written from the code before the state vocabulary became typed
(controller/state.py): every key that existed then keeps its value, its order and its formatting. A
key added since (``ADDED``: the end reason, a seed's failing teardown, a sweep member's error) is checked for its meaning and
left out of the byte comparison, so the test proves that nothing a script reads today moved.

Regenerate (only when a change to the JSON is meant): ``AUTOSLM_WRITE_SNAPSHOTS=1 pytest this file``.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

import pytest

from autoslm.controller.registry import RunRecord
from autoslm.layout import Heartbeat, RunPaths
from autoslm.sdk import Client
from autoslm.spec import validate_dict
from autoslm.store import RunArtifacts
from autoslm.store.local import LocalStore

SNAPSHOTS = Path(__file__).parent / "snapshots"
NOW = 1_800_000_000.0
# Keys that status --json gained after the snapshots were taken (checked on their own below).
ADDED = {"end_reason", "teardown"}
ADDED_TO_MEMBERS = {"error"}  # a sweep member's run error (only a failed one has it)


def spec(name: str, **limits):
    return validate_dict(
        {
            "name": name,
            "model": "autoslm/tiny",
            "environment": {"id": "autoslm/arith"},
            "train": {"max_steps": 10},
            "limits": {"max_usd": 5.0, **limits},
        }
    )


def put_results(store, phase: str, run_id: str, seed: int) -> None:
    art = RunArtifacts(store, RunPaths(phase, run_id, seed))
    art.put_metrics({"final_loss": 0.5, "eval": {"before": {"loss": 2.0}, "after": {"loss": 1.0, "score": 0.75}}})
    art.put_heartbeat(Heartbeat(run_id=run_id, seed=seed, phase=phase, stage="done", step=10, total_steps=10, time=NOW - 5))
    d = Path(store.root) / "adapter-src"
    d.mkdir(exist_ok=True)
    (d / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (d / "adapter_model.safetensors").write_bytes(b"\0" * 8)
    art.put_adapter(d)
    art.mark_done()


@pytest.fixture
def client(tmp_path):
    store = LocalStore(tmp_path / "artifacts")
    return Client(tmp_path / "home", stores=lambda uri: store, clock=lambda: NOW), store


def make_run(client: Client, run_id: str, s, **replica) -> RunRecord:
    run = RunRecord(
        run_id=run_id,
        name=s.name,
        phase="sft",
        spec_json=s.to_json(),
        spec_path=None,
        store_uri="file:///artifacts",
        created_at=NOW - 100,
        deadline=NOW + 3600,
    )
    client.registry.create_run(run, [0])
    client.registry.update_replica(run_id, 0, **replica)
    return run


def rendered(obj, tmp_path: Path) -> str:
    """As `status --json` prints it (cli._print_json), the test's own temporary path made neutral."""
    return json.dumps(obj, indent=2, default=str).replace(str(tmp_path), "<tmp>") + "\n"


def without_added(obj, added=ADDED):
    if isinstance(obj, dict):
        return {k: without_added(v, ADDED | ADDED_TO_MEMBERS if k == "runs" else ADDED) for k, v in obj.items() if k not in added}
    if isinstance(obj, list):
        return [without_added(v, added) for v in obj]
    return obj


def check(name: str, obj, tmp_path: Path) -> None:
    text = rendered(without_added(obj), tmp_path)
    path = SNAPSHOTS / f"{name}.json"
    if os.environ.get("AUTOSLM_WRITE_SNAPSHOTS") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"status --json of {name} moved (see {path})"


def test_a_local_run_succeeded_and_one_failed_at_its_money_limit(client, tmp_path):
    c, store = client
    make_run(
        c,
        "snap-ok-20270115-080000-0001",
        spec("snap-ok"),
        state="succeeded",
        provider="local",
        step=10,
        total_steps=10,
        cost_usd=0.0,
        heartbeat_at=NOW - 5,
        stage="done",
        loss=0.5,
        attempt=1,
    )
    put_results(store, "sft", "snap-ok-20270115-080000-0001", 0)
    st = c.status("snap-ok-20270115-080000-0001", tick=False)
    check("local_succeeded", st.to_json(), tmp_path)
    assert st.end_reason == "succeeded" and st.seeds[0].end_reason == "succeeded"
    make_run(
        c,
        "snap-money-20270115-080000-0002",
        spec("snap-money", max_usd=1.0),
        state="failed",
        provider="runpod",
        gpu="RTX 4090",
        step=4,
        total_steps=10,
        cost_usd=1.25,
        heartbeat_at=NOW - 30,
        stage="training",
        attempt=2,
        restarts=1,
        price_per_hour=0.5,
        error="money limit reached: $1.25 spent, limits.max_usd is $1.00",
    )
    st = c.status("snap-money-20270115-080000-0002", tick=False)
    check("local_failed", st.to_json(), tmp_path)
    assert st.to_json()["seeds"][0]["teardown"] is None and "serve" not in st.to_json()  # nothing failing; not a serve
    assert st.end_reason == "money_limit"  # told from its error's words: a row from before reasons were stored
    c.registry.update_replica("snap-money-20270115-080000-0002", 0, end_reason="deadline")
    assert c.status("snap-money-20270115-080000-0002", tick=False).end_reason == "deadline"  # the stored one wins


def test_a_refused_teardown_recorded_in_the_registry_is_a_seed_s_teardown(client):
    c, _ = client
    fields = dict(state="cancelled", provider="vast", pod_id="4242", cost_usd=0.5, end_reason="cancelled")
    make_run(c, "snap-td-20270115-080000-0003", spec("snap-td"), **fields)
    assert c.status("snap-td-20270115-080000-0003", tick=False).to_json()["seeds"][0]["teardown"] is None
    refused = dict(teardown_error="Vast answered 503 (ending instance 4242)", teardown_failures=3, teardown_since=NOW - 60)
    c.registry.update_replica("snap-td-20270115-080000-0003", 0, **refused)
    (seed,) = c.status("snap-td-20270115-080000-0003", tick=False).to_json()["seeds"]
    assert seed["teardown"] == {
        "provider": "vast",
        "pod_id": "4242",
        "failures": 3,
        "since": NOW - 60,
        "error": "Vast answered 503 (ending instance 4242)",
        "vendor": "Vast",
        "pods_page": "https://cloud.vast.ai/instances/",
    }
    c.registry.update_replica("snap-td-20270115-080000-0003", 0, pod_id=None)  # the pod ended: nothing left to fail
    assert c.status("snap-td-20270115-080000-0003", tick=False).to_json()["seeds"][0]["teardown"] is None


def test_an_hf_run_followed_through_its_store(client, tmp_path):
    c, store = client
    put_results(store, "sft", "far-20270115-080000-beef", 0)
    st = c.status("hf://alice/runs/sft/far-20270115-080000-beef")
    check("hf_succeeded", st.to_json(), tmp_path)
    assert st.end_reason == "succeeded"


def test_a_sweep_with_a_succeeded_a_failed_a_running_and_a_skipped_member(client, tmp_path):
    from autoslm.controller import sweeps
    from autoslm.sdk import sweep as sdk_sweep

    c, store = client
    sid = "snap-sweep-20270115-080000-cafe"
    rec = sweeps.SweepRecord(
        sweep_id=sid,
        name="snap",
        spec_path=None,
        keys_json='["train.learning_rate"]',
        max_parallel=2,
        max_usd=3.0,
        created_at=NOW - 200,
    )
    members = []
    for i, (lr, state) in enumerate([(1e-4, "succeeded"), (2e-4, "failed"), (3e-4, "running"), (4e-4, None)]):
        s = spec(f"snap-p{i}")
        run_id = f"snap-p{i}-20270115-080000-000{i}"
        members.append(
            sweeps.Member(
                sweep_id=sid,
                member=i,
                point=i,
                seed=0,
                values_json=json.dumps({"train.learning_rate": lr}),
                spec_json=s.to_json(),
                store_uri="file:///artifacts",
                run_id=run_id,
                estimate_usd=1.0,
                allot_usd=1.25 if state else None,
                started_at=NOW - 150 if state else None,
                skipped=None if state else "budget: estimate $1.00 is over the $0.50 left of sweep.max_usd $3.00",
            )
        )
    sweeps.SweepBook(c.registry).create(rec, members)
    for i, state in enumerate(["succeeded", "failed", "running"]):
        make_run(
            c,
            members[i].run_id,
            spec(f"snap-p{i}"),
            state=state,
            provider="runpod",
            step=10 if i == 0 else 5,
            total_steps=10,
            cost_usd=0.8 + i / 10,
            heartbeat_at=NOW - 10,
            pod_id="pod-3" if state == "running" else None,
            error="the worker ran out of memory (CUDA OOM at step 5)" if state == "failed" else None,
        )
    put_results(store, "sft", members[0].run_id, 0)
    st = sdk_sweep.sweep_status(c, sid, tick=False)
    check("sweep", st.to_json(), tmp_path)
    assert [r.end_reason for r in st.runs] == ["succeeded", "failed", None, "sweep_budget"]
    assert [r.error for r in st.runs] == [None, "the worker ran out of memory (CUDA OOM at step 5)", None, None]
    assert st.end_reason is None  # still running
    from autoslm.views.sweep import render_report, status_lines

    lines = status_lines(st)  # the table names each failed member by its run id, with its error
    assert (
        "failed: run snap-p1-20270115-080000-0001 (point 1, seed 0): the worker ran out of memory (CUDA OOM at step 5)" in lines
    )
    page = render_report(c, st)
    assert "failed: the worker ran out of memory (CUDA OOM at step 5)" in page  # the report's runs table too
    assert (
        html.escape(json.dumps({"eval_score": 0.75, "eval_loss": 1.0, "final_loss": 0.5})) in page
    )  # a member's figures, as --json names them
