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
