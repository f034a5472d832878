"""`autoslm serve` on a rented GPU (the fake RunPod) and the input it refuses before anything is rented.

The serve's pod is the real worker (``python -m autoslm.engine``, the fake runs a pod's command as a
local process), but this stack has no vLLM: the pod starts tests/fakes/vllm_serve.py in its place, a
real process answering vLLM's HTTP API, given the same arguments (``AUTOSLM_SERVE_SERVER``). The real
vLLM server is tested in the vLLM stack (tests/colocated/test_serve_vllm.py).

    .venv/bin/python -m pytest tests/integration/test_serve.py -q
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoslm.controller.registry import Registry, RunRecord
from autoslm.controller.state import RunState, run_state
from autoslm.layout import PodEnv, RunPaths
from autoslm.sdk.serve import free_port
from autoslm.spec import JobSpec, ServeSpec
from autoslm.store import RunArtifacts, open_store
from tests.fakes.runpod import fake_runpod  # noqa: F401 - pytest fixture
from tests.unit.test_limit_stop import write_adapter

STAND_IN = Path(__file__).resolve().parents[1] / "fakes" / "vllm_serve.py"
TTL_S = 25.0
POLL_S = 1.0


def finished_run(home: Path, tmp_path: Path, *, state: str = RunState.SUCCEEDED, adapter: bool = True, run_id="trained-1") -> str:
    """A trained run in this home's registry and its store: its adapter, and a kept checkpoint of step 4."""
    spec = JobSpec.model_validate(
        {
            "name": "trained",
            "model": "Qwen/Qwen3-0.6B",
            "environment": {"id": "autoslm/arith"},
            "train": {"method": "sft", "max_steps": 8, "lora_rank": 16},
            "compute": {"provider": "runpod", "gpu": "RTX 4090", "image": "ghcr.io/autoslm/worker:test"},
            "artifacts": {"store": "local", "path": str(tmp_path / "store")},
        }
    )
    registry = Registry(home)
    now = time.time()
    registry.create_run(
        RunRecord(
            run_id=run_id,
            name="trained",
            phase="sft",
            spec_json=spec.to_json(),
            spec_path=None,
            store_uri=(tmp_path / "store").resolve().as_uri(),
            created_at=now,
            deadline=now + 3600,
        ),
        [0],
    )
    registry.update_replica(run_id, 0, state=state)
    art = RunArtifacts(open_store((tmp_path / "store").resolve().as_uri()), RunPaths("sft", run_id, 0))
    write_adapter(tmp_path / "ckpt", 4.0)
    art.put_checkpoint(4, tmp_path / "ckpt")
    if adapter:
        write_adapter(tmp_path / "adapter", 8.0)
        art.put_adapter(tmp_path / "adapter")
    return run_id


def wait_until(what: str, pred, timeout: float):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def curl_chat(port: int, model: str) -> subprocess.CompletedProcess:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello"}]})
    return subprocess.run(
        [
            "curl",
            "-s",
            "--max-time",
            "10",
            f"http://127.0.0.1:{port}/v1/chat/completions",
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
        ],
        capture_output=True,
        text=True,
    )


def rented_serve(cli, home, tmp_path, fake, on: str, ttl_s: float, *more: str):
    """`autoslm serve` of a finished run's step 4 on a fake vendor, the stand-in server in vLLM's place;
    returns (the trained run's id, the serve's port, what the command said)."""
    fake.extra_env["AUTOSLM_SERVE_SERVER"] = f"{sys.executable} {STAND_IN}"
    run_id = finished_run(home, tmp_path)
    port = free_port()
    r = cli(
        "serve", f"{run_id}@4", "--on", on, *more, "--ttl", f"{ttl_s:g}s", "--max-usd", "1", "--yes",
        "--port", str(port), "--poll-s", str(POLL_S), env=fake.env(),
    )  # fmt: skip
    assert r.code == 0, r.out + r.err
    return run_id, port, r


def test_a_rented_serve_answers_and_is_ended_by_its_ttl_with_no_command_running(cli, home, tmp_path, fake_runpod):  # noqa: F811
    fake = fake_runpod
    run_id, port, r = rented_serve(cli, home, tmp_path, fake, "runpod", TTL_S)
    (pod,) = fake.pods()
    assert f"https://{pod.id}-{port}.proxy.runpod.net/v1" in r.out  # the URL a user reaches through RunPod's proxy
    assert "curl -s https://" in r.out and '"model": "trained-step4"' in r.out, r.out
    assert fake.launch_calls[0]["ports"] == [f"{port}/http"]
    answer = curl_chat(port, "trained-step4")  # the pod's server, here on 127.0.0.1
    assert (
        answer.returncode == 0
        and json.loads(answer.stdout)["choices"][0]["message"]["content"] == "stand-in answer from trained-step4"
    )
    serve_id = json.loads((home / "serves" / f"{run_id}.json").read_text())["serve_run"]
    # `status` of a serve speaks of serving: what it serves, its endpoint, the time left to its TTL; no training words.
    shown = cli("status", serve_id, env=fake.env())
    assert shown.code == 0 and f"serve {serve_id}: running; serves run {run_id}'s checkpoint of step 4" in shown.out, shown.out
    url = f"https://{pod.id}-{port}.proxy.runpod.net/v1"
    assert f"  serving {url} (model trained-step4)" in shown.out and "  ends in " in shown.out, shown.out
    assert not any(w in shown.out for w in ("training", "stage", "step 0/", "None")), shown.out
    serving = json.loads(cli("status", serve_id, "--json", env=fake.env()).out)["serve"]
    assert serving["endpoint"] == url and serving["source_run"] == run_id and 0 < serving["ttl_left_s"] <= TTL_S, serving
    registry = Registry(home)
    # No command runs from here on: the background supervisor and the pod itself end it at its TTL.
    wait_until("the serve to end", lambda: run_state(registry.replicas(serve_id)).terminal, TTL_S + 90)
    wait_until("the pod to be deleted", lambda: fake.pod(pod.id).deleted, 30)
    ended = cli("status", serve_id, env=fake.env())
    assert ended.code == 0 and f"serve {serve_id}: succeeded; served run {run_id}'s checkpoint of step 4" in ended.out, ended.out
    assert "  ended: its --ttl (limits.ttl_s) was reached" in ended.out, ended.out
    assert not any(w in ended.out for w in ("training", "stage", "final loss", "None")), ended.out
    (rep,) = registry.replicas(serve_id)
    run = registry.get_run(serve_id)
    assert rep.state == RunState.SUCCEEDED and rep.end_reason == "deadline", (rep.state, rep.end_reason, rep.error)
    lived = fake.pod(pod.id).deleted_at - pod.created_at
    billed_s = rep.cost_usd / rep.price_per_hour * 3600
    assert run.deadline - run.created_at == pytest.approx(TTL_S)
    assert TTL_S - 2 <= lived <= TTL_S + POLL_S + 1.5, lived
    assert TTL_S - 2 <= billed_s <= TTL_S + POLL_S + 1.5, billed_s  # within one poll (and the tick's own time)
    assert not pod.process.alive()
    assert curl_chat(port, "trained-step4").returncode != 0  # nothing answers there any more


@pytest.mark.parametrize(
    "args, said",
    [
        (["--on", "runpod", "--max-usd", "2"], "needs --ttl"),
        (["--on", "runpod", "--ttl", "1h"], "needs --max-usd"),
        (["--on", "vast"], "needs --ttl and --max-usd"),
        (["--on", "runpod", "--ttl", "soon", "--max-usd", "2"], "--ttl 'soon': not a duration"),
        (["--on", "lambda", "--ttl", "1h", "--max-usd", "2"], "--on 'lambda': not a provider"),
    ],
)
def test_a_rented_serve_without_its_limits_is_refused_before_anything_is_rented(cli, home, tmp_path, fake_runpod, args, said):  # noqa: F811
    run_id = finished_run(home, tmp_path)
    r = cli("serve", run_id, *args, "--yes", env=fake_runpod.env())
    assert r.code == 2 and said in r.err, r.out + r.err
    assert len(r.err.strip().splitlines()) <= 2  # the line, and at most its hint
    assert fake_runpod.launch_calls == [] and fake_runpod.pods() == []
    assert not (home / "serves").exists()


@pytest.mark.parametrize(
    "ref, state, adapter, said",
    [
        ("nosuch", RunState.SUCCEEDED, True, "no run 'nosuch'"),
        ("trained-1@7", RunState.SUCCEEDED, True, "kept no checkpoint of step 7 (kept: 4)"),
        ("trained-1@x", RunState.SUCCEEDED, True, "must be a checkpoint's step number"),
        ("trained-1", RunState.FAILED, False, "is failed and has no adapter to serve"),
    ],
)
def test_serving_what_does_not_exist_is_one_line_and_exit_2(cli, home, tmp_path, fake_runpod, ref, state, adapter, said):  # noqa: F811
    finished_run(home, tmp_path, state=state, adapter=adapter)
    r = cli("serve", ref, "--on", "runpod", "--ttl", "1h", "--max-usd", "2", "--yes", env=fake_runpod.env())
    assert r.code == 2 and said in r.err, r.out + r.err
    assert "Traceback" not in r.err
    assert fake_runpod.launch_calls == []
    if state == RunState.FAILED:
        assert "trained-1@4" in r.err  # the hint names the checkpoint it can serve


@pytest.mark.parametrize(
    "limit, price, deadline_in_s, max_usd",
    [
        ("max_hours", None, 12.0, None),  # the time limit
        # $3.60 an hour: $0.036 lasts 36 s, and it stops the 9 s its end takes before (room for a slow
        # server start on a loaded machine: the server must answer before the limit)
        ("max_usd", 3.6, 3600.0, 0.036),
    ],
)
def test_the_serving_pod_itself_stops_at_its_limit_with_no_supervisor(tmp_path, home, limit, price, deadline_in_s, max_usd):
    """The pod alone (no supervisor, no command): the worker serves, stops its server at the nearer
    limit, and leaves the run done, its last heartbeat naming the limit."""
    run_id = finished_run(home, tmp_path)
    src = json.loads(Registry(home).get_run(run_id).spec_json)
    port = free_port()
    store_uri = (tmp_path / "store").resolve().as_uri()
    spec = ServeSpec.model_validate(
        {
            "name": "trained-serve",
            "model": src["model"],
            "phase": "sft",
            "compute": src["compute"],
            "artifacts": src["artifacts"],
            "limits": {"ttl_s": 3600, "max_usd": max_usd},
            "adapter": {
                "source_run": run_id,
                "store": store_uri,
                "adapter_path": f"sft/{run_id}/seed0/adapter",
                "lora_name": "trained",
                "lora_rank": 4,
            },
            "port": port,
        }
    )
    now = time.time()
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHONPATH": str(STAND_IN.parents[2]),
        "PYTHONUNBUFFERED": "1",
        "AUTOSLM_SERVE_SERVER": f"{sys.executable} {STAND_IN}",
        **PodEnv(
            run_id="serve-1",
            store_uri=store_uri,
            spec_json=spec.to_json(),
            deadline=now + deadline_in_s,
            price_per_hour=price,
            billed_from=now,
        ).to_env(),
    }
    worker = subprocess.Popen(
        [sys.executable, "-m", "autoslm.engine"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        out, _ = worker.communicate(timeout=90)
        ended = time.time() - now
    finally:
        worker.kill()
    assert worker.returncode == 0, out
    art = RunArtifacts(open_store(store_uri), RunPaths("sft", "serve-1", 0))
    hb = art.get_heartbeat()
    assert art.is_done() and art.has_adapter() and hb.stage == "done" and hb.limit == limit, (hb, out)
    assert any(e.kind == "serving" for e in art.read_events()), out  # it served before the limit
    assert ended >= 11.0 and (limit == "max_hours" or ended < 36.0), ended  # money: ended before it ran out
    assert curl_chat(port, "trained").returncode != 0  # its server is gone with it


def test_a_serve_here_without_vllm_is_one_line_before_anything_starts(cli, home, tmp_path):
    run_id = finished_run(home, tmp_path)
    r = cli("serve", run_id)  # this stack has no vLLM
    assert r.code == 2 and "vllm is not installed here" in r.err, r.out + r.err
    assert not (home / "serves").exists() and not (home / "pods").exists()
