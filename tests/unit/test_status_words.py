"""What `status` and `watch` say to a person, from status objects (tests/fakes/statuses.py): each figure
only where it is known (never "None"), a serve spoken of as serving, a pod whose teardown keeps failing
with what to do, and the device a local run really trains on."""

from __future__ import annotations

import io

from rich.console import Console

from autoslm.controller.seed_metrics import SeedMetrics
from autoslm.controller.serve_status import ServeStatus
from autoslm.controller.status import TeardownStatus
from autoslm.views.result import print_result
from autoslm.views.runview import RunData, describe, seed_lines
from tests.fakes.statuses import run_status, seed_status

NOW = 1_800_000_000.0


def printed(st) -> str:
    out = io.StringIO()
    print_result(st, Console(file=out, width=200, color_system=None))
    return out.getvalue()


def status_text(st) -> str:
    """`status RUN` as the CLI prints it (cli.status): the result, then each seed's lines."""
    text = printed(st)
    if st.serve is None:
        text += "".join(line + "\n" for s in st.seeds for line in seed_lines(s, live=s.state.live))
    return text


def test_a_run_the_controller_handed_back_at_its_limit_says_what_is_known_and_no_none():
    # metrics.json as controller/handback.py writes it when the worker could not: no final loss, no
    # training time, no evaluation after training; the step of the checkpoint handed back.
    note = "the time limit (limits.max_hours) ended the run at step 160/200; the adapter handed back is checkpoint step 150's"
    handed_back = {
        "steps": 150,
        "total_steps": 200,
        "stop_reason": note,
        "limit": {"name": "max_hours", "step": 150, "total_steps": 200, "by": "controller", "adapter_from": "checkpoint"},
        "eval": {"after_step": 150},
    }
    st = run_status(
        state="succeeded",
        end_reason="deadline",
        step=160,
        total_steps=200,
        adapter="/home/a/adapter",
        metrics={"seed0": SeedMetrics.of(handed_back)},
        seeds=[{"state": "succeeded", "step": 160, "total_steps": 200, "stage": "error", "end_reason": "deadline"}],
    )
    text = status_text(st)
    assert "None" not in text and "final loss" not in text and "training," not in text, text
    assert "  seed0: step 150\n" in text and f"stopped early: {note}" in text
    assert "pod " not in text  # its pod is gone: no "pod None"
    # With the figures the worker writes, each is said as before.
    full = {**handed_back, "final_loss": 0.25, "train_time_s": 41.5, "eval": {"before": {"loss": 2.0}, "after": {"loss": 1.0}}}
    text = printed(run_status(state="succeeded", metrics={"seed0": SeedMetrics.of(full)}))
    assert "seed0: final loss 0.25, 41.5s training; eval loss 2.000 -> 1.000" in text, text
    assert describe({"kind": "done", "data": {"steps": 150, "final_loss": None}}) == "done at step 150"
    # The report's lm-eval note, of a run handed back with the harness's scores but no training time.
    from autoslm.views.report import _harness_section

    task = {"version": 3, "shots": 5, "samples": 1319, "metrics": {"exact_match,strict-match": 0.31}}
    lm_eval = {"version": "0.4.13", "models": {"base": {"gsm8k": task}}, "seconds": 95.0}
    page = _harness_section(
        RunData("r", st, None, [], {0: SeedMetrics.of({**handed_back, "lm_eval": lm_eval, "lm_eval_time_s": 95.0})})
    )
    assert "seed0: 95.0s lm-eval" in page and "0.31" in page and "None" not in page, page
    assert describe({"kind": "done", "data": {"steps": 8, "final_loss": 0.1234567}}) == "done at step 8, final loss 0.1235"


def serve_run(state: str, **fields):
    seed = {"state": state, "provider": "runpod", "pod_id": "pod-7", "gpu": "RTX 4090", "last_heartbeat_age_s": 4.0}
    seed.update(fields.pop("seed", {}))
    live = state in ("pending", "provisioning", "running", "recovering")
    serve = ServeStatus(
        source_run="quick-20270101-000000-aaaa",
        step=4,
        model="trained-step4",
        endpoint="https://pod-7-8000.proxy.runpod.net/v1" if live else None,
        ends_at=NOW + 5400,
        ttl_left_s=5400.0 if live else None,
        max_usd=5.0,
        served_s=None if live else 7200.0,
    )
    return run_status(
        run_id="quick-serve-20270101-010000-bbbb",
        state=state,
        provider="runpod",
        cost_usd=0.42,
        serve=serve,
        metrics={"seed0": SeedMetrics.of({"serve": {"served_s": 7200.0}, "stop_reason": "the time limit ended the serve"})},
        seeds=[seed],
        **fields,
    )


def test_a_serve_s_status_speaks_of_serving_not_training():
    serving = serve_run(
        "running",
        seed={"stage": "training", "message": "serving https://pod-7-8000.proxy.runpod.net/v1 (model trained-step4)"},
    )
    text = status_text(serving)
    for said in (
        "serve quick-serve-20270101-010000-bbbb: running; serves run quick-20270101-000000-aaaa's checkpoint of step 4 "
        "as model trained-step4 on runpod (RTX 4090), $0.42 so far",
        "  serving https://pod-7-8000.proxy.runpod.net/v1 (model trained-step4)",
        "  ends in 1h 30m (--ttl) or at $5.00 (--max-usd), whichever comes first",
        "  pod pod-7, restarts 0, heartbeat 4s ago",
    ):
        assert said + "\n" in text, (said, text)
    for training_words in ("training", "stage", "step 0", "final loss", "None"):
        assert training_words not in text, (training_words, text)
    starting = status_text(serve_run("running", seed={"stage": "setup", "message": "starting vLLM for trained-step4"}))
    assert "  not answering yet: starting vLLM for trained-step4\n" in starting and "stage" not in starting, starting
    # Ended at its TTL (the worker wrote metrics without a loss; its last heartbeat may say "error" when
    # the watchdog ended it): how long it served and why it ended, in serving words.
    ended = status_text(serve_run("succeeded", end_reason="deadline", seed={"stage": "error", "pod_id": None}))
    assert "served run quick-20270101-000000-aaaa's checkpoint of step 4 as model trained-step4 on runpod" in ended, ended
    assert "for 2h 00m, $0.42\n" in ended and "  ended: its --ttl (limits.ttl_s) was reached\n" in ended, ended
    for training_words in ("training", "stage", "final loss", "None", "stopped early"):
        assert training_words not in ended, (training_words, ended)
    assert serving.to_json()["serve"]["ttl_left_s"] == 5400.0 and serving.to_json()["serve"]["model"] == "trained-step4"


def test_a_pod_whose_teardown_keeps_failing_is_said_with_its_id_and_the_vendor_s_console():
    td = TeardownStatus(
        provider="runpod",
        pod_id="pod-9",
        failures=4,
        since=NOW - 120,
        error="RunPod answered 503 while terminating pod pod-9",
        vendor="RunPod",
        pods_page="https://console.runpod.io/pods",
    )
    st = run_status(
        state="cancelled",
        seeds=[{"state": "cancelled", "pod_id": "pod-9", "provider": "runpod", "teardown": td, "end_reason": "cancelled"}],
    )
    text = status_text(st)
    assert "teardown failing: ending runpod pod pod-9 was refused 4 times since " in text, text
    assert "it may still be billing" in text and "last refusal: RunPod answered 503 while terminating pod pod-9" in text
    assert "end pod pod-9 in RunPod's console (https://console.runpod.io/pods)" in text and "autoslm gc" in text
    seed = st.to_json()["seeds"][0]
    assert seed["teardown"] == {**td.to_json(), "failures": 4} and seed["teardown"]["pod_id"] == "pod-9"
    assert run_status(seeds=[{}]).to_json()["seeds"][0]["teardown"] is None  # nothing failing: null, the key stays


def watch_lines(events, gpu=None):
    from autoslm.views.watch import lines

    st = run_status(provider="local", seeds=[{"provider": "local", "pod_id": "local-1-2", "gpu": gpu}])
    return "\n".join(lines(RunData("r", st, {"model": "m", "train": {"method": "sft"}}, events)))


def loaded(device: dict) -> dict:
    return {"time": 1.0, "kind": "model_loaded", "seed": 0, "data": {"model": "m", "seconds": 1.0, "device": device}}


def test_watch_says_what_a_local_run_really_trains_on():
    cpu = {"kind": "cpu", "name": "cpu", "mem_gib": None, "capability": None, "packages": [], "world_size": 1}
    gpu = {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3", "mem_gib": 79.1, "capability": "9.0", "packages": [], "world_size": 1}
    assert "GPU NVIDIA H100 80GB HBM3" in watch_lines([loaded(gpu)]) and "CPU" not in watch_lines([loaded(gpu)])
    assert "GPU CPU" in watch_lines([loaded(cpu)])
    assert "GPU 2 GPUs (2 processes, nccl)" in watch_lines([loaded(gpu)], gpu="2 GPUs (2 processes, nccl)")
    # Before the worker says (the model still loading): CPU only where this machine has no NVIDIA GPU.
    from autoslm.providers.local.provider import local_gpu_count

    assert ("GPU -" if local_gpu_count() else "GPU CPU") in watch_lines([])
    assert seed_status(gpu=None).gpu is None  # the record stays as the provider gave it
