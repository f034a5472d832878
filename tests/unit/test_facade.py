"""One face for runs and sweeps: one resolver says which an id names, and `autoslm.status/wait/cancel`
take either (the CLI's status, cancel, watch and report ask the same resolver)."""

from __future__ import annotations

import json

import autoslm
from autoslm.controller import sweeps
from autoslm.controller.registry import RunRecord
from autoslm.sdk import Client
from autoslm.sdk.sweep import resolve_target
from autoslm.spec import validate_dict

SPEC = validate_dict({"name": "face", "model": "autoslm/tiny", "environment": {"id": "autoslm/arith"}})


def ended_run(client: Client, run_id: str, state: str = "failed") -> None:
    client.registry.create_run(RunRecord(run_id, "face", "sft", SPEC.to_json(), None, "file:///nowhere", 1.0, 9e9), [0])
    client.registry.update_replica(run_id, 0, state=state, provider="local", error="boom" if state == "failed" else None)


def ended_sweep(client: Client, sweep_id: str, run_id: str) -> None:
    rec = sweeps.SweepRecord(
        sweep_id=sweep_id,
        name="face",
        spec_path=None,
        keys_json='["train.learning_rate"]',
        max_parallel=1,
        max_usd=None,
        created_at=2.0,
        stopped="every member ended",
    )
    m = sweeps.Member(
        sweep_id=sweep_id,
        member=0,
        point=0,
        seed=0,
        values_json=json.dumps({"train.learning_rate": 1e-4}),
        spec_json=SPEC.to_json(),
        store_uri="file:///nowhere",
        run_id=run_id,
        started_at=3.0,
    )
    sweeps.SweepBook(client.registry).create(rec, [m])
    ended_run(client, run_id)


def test_one_resolver_tells_a_run_from_a_sweep(tmp_path):
    client = Client(tmp_path / "home")
    ended_run(client, "face-20270101-000000-aaaa", "succeeded")
    ended_sweep(client, "face-sweep-20270101-000000-bbbb", "face-p0-20270101-000000-cccc")
    assert resolve_target(client, "face-sweep") == type(resolve_target(client, "x"))("face-sweep-20270101-000000-bbbb", True)
    assert not resolve_target(client, "face-2027").sweep  # a run's prefix
    assert not resolve_target(client, "hf://alice/runs/sft/r").sweep
    # A prefix that matches a run and a sweep is the run's (the sweep's whole id still names it).
    assert not resolve_target(client, "face-").sweep


def test_status_wait_and_cancel_take_a_run_or_a_sweep(tmp_path):
    home = tmp_path / "home"
    client = Client(home)
    ended_run(client, "face-20270101-000000-aaaa", "succeeded")
    ended_sweep(client, "face-sweep-20270101-000000-bbbb", "face-p0-20270101-000000-cccc")
    client.registry.close()
    st = autoslm.status("face-sweep-20270101-000000-bbbb", home=home)
    assert st.sweep_id == "face-sweep-20270101-000000-bbbb" and st.state == "failed"
    assert st.runs[0].error == "boom" and st.runs[0].end_reason == "failed"
    assert autoslm.wait("face-sweep-20270101-000000-bbbb", timeout=0, home=home).state == "failed"
    assert autoslm.cancel("face-sweep-20270101-000000-bbbb", home=home).state == "failed"  # an ended sweep keeps its outcome
    run = autoslm.status("face-2027", home=home)
    assert run.run_id == "face-20270101-000000-aaaa" and run.end_reason == "succeeded"
    assert autoslm.wait("face-20270101-000000-aaaa", timeout=0, home=home).state == "succeeded"
