"""The controller as the limit's backstop: a worker that never stops by itself (here a pod that only
sleeps) is ended at the deadline, and the newest checkpoint in the store becomes the run's adapter:
`status` shows it, `download` fetches it, the end reason names the limit and the metrics the step.

    .venv/bin/python -m pytest tests/integration/test_limit_backstop.py -q
"""

from __future__ import annotations

from autoslm.layout import RunPaths
from autoslm.store import RunArtifacts, open_store
from autoslm.store.adapters import check_adapter
from autoslm.store.artifacts import write_manifest
from tests.fakes.runpod import fake_runpod  # noqa: F401 - pytest fixture
from tests.integration.test_supervisor_safety import _new_run, _spec, rig  # noqa: F401 - pytest fixture
from tests.unit.test_limit_stop import write_adapter
from tests.unit.test_status_words import status_text


def test_the_deadline_ends_a_silent_worker_and_hands_back_its_newest_checkpoint(rig, tmp_path):
    fake, rp, clock, client = rig
    run = _new_run(client, _spec(tmp_path), clock)
    client.supervisor.tick(run)
    (pod,) = fake.pods()
    art = RunArtifacts(open_store(run.store_uri), RunPaths("sft", run.run_id, 0))
    for step in (3, 5):  # what the worker uploaded before it went quiet
        ckpt = tmp_path / f"checkpoint-{step}"
        write_adapter(ckpt, float(step))
        (ckpt / "optimizer.pt").write_bytes(b"moments")
        write_manifest(ckpt)
        art.put_checkpoint(step, ckpt, keep=2)
    client.registry.update_replica(run.run_id, 0, step=6, total_steps=10)
    clock.t = run.deadline + 1
    st = client.status(run.run_id)
    assert pod.deleted and fake.pods()[0].deleted, "the pod is ended at the deadline"
    assert st.state == "succeeded" and st.end_reason == "deadline", st
    assert st.adapter and st.error is None, st
    m = st.metrics["seed0"]
    assert m.document["limit"]["step"] == 5 and "checkpoint step 5" in m.stop_reason and "step 6/10" in m.stop_reason, m
    text = status_text(st)  # as `status` prints it: what is known (the step handed back, why), never "None"
    assert "  seed0: step 5\n" in text and "stopped early: the time limit" in text and "None" not in text, text
    got = client.download(run.run_id, to=tmp_path / "downloaded")
    check_adapter(got)
    assert (got / "adapter_model.safetensors").read_bytes() == (tmp_path / "checkpoint-5/adapter_model.safetensors").read_bytes()
    assert not (got / "optimizer.pt").exists()  # the adapter, not the state to resume from


def test_with_keep_best_the_deadline_hands_back_the_adapter_keep_best_chose(rig, tmp_path):
    """keep_best chose step 4 (score 0.6); the newest checkpoint (step 8) scored worse. The worker never
    handed back (it went quiet): at the deadline the run hands back keep_best's adapter, and says so."""
    fake, rp, clock, client = rig
    spec = _spec(tmp_path).model_copy(update={"eval": _spec(tmp_path).eval.model_copy(update={"keep_best": True, "every": 4})})
    run = _new_run(client, spec, clock)
    client.supervisor.tick(run)
    art = RunArtifacts(open_store(run.store_uri), RunPaths("sft", run.run_id, 0))
    write_adapter(tmp_path / "best", 4.0)
    art.put_best(tmp_path / "best", {"step": 4, "when": "during", "metric": "score", "value": 0.6, "attempt": 1})
    for step in (4, 8):
        ckpt = tmp_path / f"checkpoint-{step}"
        write_adapter(ckpt, float(step))
        write_manifest(ckpt)
        art.put_checkpoint(step, ckpt, keep=2)
    client.registry.update_replica(run.run_id, 0, step=9, total_steps=10)
    clock.t = run.deadline + 1
    st = client.status(run.run_id)
    assert st.state == "succeeded" and st.end_reason == "deadline", st
    m = st.metrics["seed0"]
    limit = m.document["limit"]
    assert limit["adapter_from"] == "best" and limit["chosen_by"] == "keep_best" and limit["step"] == 4, limit
    assert "keep_best's choice, step 4's (score 0.6" in m.stop_reason and m.after_step == 4, m
    assert st.to_json()["metrics"]["seed0"]["limit"]["chosen_by"] == "keep_best"  # what `status --json` prints
    got = client.download(run.run_id, to=tmp_path / "downloaded")
    assert (got / "adapter_model.safetensors").read_bytes() == (tmp_path / "best/adapter_model.safetensors").read_bytes()
