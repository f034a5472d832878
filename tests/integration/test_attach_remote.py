"""`autoslm.attach("hf://...")`: a run started elsewhere, followed through its Hub store only.

The artifacts a worker leaves (heartbeat, events, metrics, adapter, DONE) are written to the fake Hub
with the real HfStore; a Client with no such run in its registry then reads them back as a Run.
"""

from __future__ import annotations

import json

import pytest

from autoslm.layout import Event, Heartbeat, RunPaths
from autoslm.sdk import Client
from autoslm.store import RunArtifacts
from autoslm.store.hf import HfStore
from autoslm.views.run import Run
from tests.fakes.adapters import LORA, safetensors_bytes
from tests.fakes.hub import FAKE_HUB_TOKEN, fake_hub  # noqa: F401 - pytest fixture

REPO = "alice/runs"
RUN = "far-20261130-120000-beef"


@pytest.fixture
def remote_run(fake_hub, tmp_path):  # noqa: F811
    store = HfStore(REPO, token=FAKE_HUB_TOKEN, endpoint=fake_hub.endpoint, timeout=5)
    art = RunArtifacts(store, RunPaths("sft", RUN, 0))
    art.append_events(
        [Event(time=100.0 + i, kind="step", step=i, data={"loss": 3.0 / i, "learning_rate": 1e-3}) for i in range(1, 6)]
        + [Event(time=99.0, kind="eval", step=0, data={"when": "before", "loss": 3.2})]
    )
    art.put_heartbeat(Heartbeat(run_id=RUN, seed=0, phase="sft", stage="done", step=5, total_steps=5, time=110.0))
    art.put_train_meta(
        {
            "spec": {
                "name": "far",
                "model": "autoslm/tiny",
                "environment": {"id": "autoslm/arith"},
                "train": {"method": "sft", "max_steps": 5},
            }
        }
    )
    art.put_metrics({"final_loss": 0.6, "eval": {"before": {"loss": 3.2}, "after": {"loss": 0.7}}})
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 8}))
    (adapter / "adapter_model.safetensors").write_bytes(safetensors_bytes(LORA))  # whole: download checks it
    art.put_adapter(adapter)
    art.mark_done()

    def stores(uri: str):
        assert uri == f"hf://{REPO}"
        return store

    return Client(tmp_path / "home", stores=stores)


def test_attach_a_remote_run_status_wait_frames_report_download(remote_run, tmp_path):
    pytest.importorskip("pandas")
    ref = f"hf://{REPO}/sft/{RUN}"
    run = Run(remote_run, ref)
    st = run.wait(timeout=0, progress=False)
    assert st.state == "succeeded" and st.step == 5
    df = run.metrics()
    assert list(df[df.kind == "train"].step) == [1, 2, 3, 4, 5]
    assert list(df[df.kind == "eval"].eval_loss) == [3.2]
    assert [e["kind"] for e in run.events()][:2] == ["eval", "step"]
    page = run.report(tmp_path / "far.html").read_text()
    assert RUN in page and "<polyline" in page and "autoslm/tiny" in page
    assert (run.download(tmp_path / "dl") / "adapter_config.json").exists()
    fig = run.plot()
    assert [ax.get_title() for ax in fig.axes] == ["loss", "eval before -> after"]


def test_watch_a_remote_run_ends_at_once_when_it_is_done(remote_run):
    import io

    from rich.console import Console

    from autoslm.views.watch import watch

    out = io.StringIO()
    st = watch(remote_run, f"hf://{REPO}/sft/{RUN}", Console(file=out, width=100), poll_s=0.01)
    assert st.state == "succeeded"
    text = out.getvalue()
    assert RUN in text and "5/5 (100%)" in text and "$ unknown" in text
