"""`autoslm serve --on hfjobs`: a serve on the fake Hugging Face Jobs API, its port exposed through the
Jobs proxy behind the Hub token, the job's timeout its TTL.

The serve's job is the real worker (the fake runs a job's command as a local process) serving the
stand-in for vLLM (tests/fakes/vllm_serve.py, ``AUTOSLM_SERVE_SERVER``), as the RunPod serve test
does (tests/integration/test_serve.py). The endpoint the user gets is the one the job's status names
(``exposeUrls``): the fake's proxy, which forwards to the job's process and asks for the token.

    .venv/bin/python -m pytest tests/integration/test_serve_hfjobs.py -q
"""

from __future__ import annotations

import json
import sys

import httpx
import pytest

from autoslm.controller.registry import Registry
from autoslm.controller.state import RunState, run_state
from autoslm.sdk.serve import free_port
from autoslm.vendors.hfjobs import data
from tests.fakes.hfjobs import fake_hfjobs  # noqa: F401 - pytest fixture
from tests.integration import test_serve as rented

TTL_S = 40.0  # room for the serve to start, answer, be asked and chatted with, on a loaded machine
POLL_S = 1.0
MODEL = "trained-step4"


def ask(url: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}]}
    return httpx.post(f"{url}/chat/completions", json=body, headers=headers, timeout=15)


def serve(cli, home, tmp_path, fake, ttl_s: float):
    run_id, port, r = rented.rented_serve(cli, home, tmp_path, fake, "hfjobs", ttl_s, "--gpu", "L4")
    (job,) = fake.jobs()
    return run_id, port, job, r


def test_a_serve_on_hf_jobs_answers_with_the_token_only_and_ends_by_its_ttl(cli, home, tmp_path, fake_hfjobs):  # noqa: F811
    fake = fake_hfjobs
    run_id, port, job, r = serve(cli, home, tmp_path, fake, TTL_S)
    url = fake.expose_url(job.id, port) + "/v1"  # what the job's status names, not what the job itself knows
    assert f"OpenAI base URL: {url}" in r.out, r.out
    assert f"curl -s {url}/chat/completions" in r.out and '-H "Authorization: Bearer $HF_TOKEN"' in r.out, r.out
    assert fake.api_key not in r.out + r.err  # the token's name is printed, never the token
    sent = fake.launch_calls[0]
    assert sent["expose"]["ports"] == [port] and not sent["expose"].get("portsPublic")  # behind the token
    # The job's own timeout is the serve's TTL (from its deadline, at the create) plus the serve's margin.
    assert TTL_S + data.SERVE_TIMEOUT_MARGIN_S - 10 <= sent["timeoutSeconds"] <= TTL_S + data.SERVE_TIMEOUT_MARGIN_S

    answer = ask(url, fake.api_key)
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == f"stand-in answer from {MODEL}"
    assert ask(url, None).status_code == 401  # no token, no answer
    assert ask(url, "hf_NotTheToken").status_code == 401
    chat = cli("chat", run_id, "--prompt", "Hello", env=fake.env())  # `chat RUN` talks to the serve, with HF_TOKEN
    assert chat.code == 0 and f"stand-in answer from {MODEL}" in chat.out, chat.out + chat.err
    assert url in chat.err and fake.api_key not in chat.out + chat.err

    serve_id = json.loads((home / "serves" / f"{run_id}.json").read_text())["serve_run"]
    shown = cli("status", serve_id, env=fake.env())  # the URL a user reaches, not the server's address inside its job
    assert shown.code == 0 and f"serving {url} (model {MODEL}; requests send $HF_TOKEN" in shown.out, shown.out + shown.err
    assert f"127.0.0.1:{port}" not in shown.out, shown.out  # the address inside the job
    registry = Registry(home)
    # No command runs from here on: the supervisor and the job's own worker end it at its TTL.
    rented.wait_until("the serve to end", lambda: run_state(registry.replicas(serve_id)).terminal, TTL_S + 60)
    rented.wait_until("the job to end", lambda: fake._stage(job) in data.FINISHED_STAGES, 30)
    (rep,) = registry.replicas(serve_id)
    assert rep.state == RunState.SUCCEEDED and rep.end_reason == "deadline", (rep.state, rep.end_reason, rep.error)
    lived = job.finished_at - job.created_at
    assert TTL_S - 2 <= lived <= TTL_S + POLL_S + 3, lived
    assert not job.process.alive() and fake.running_jobs() == []
    assert ask(url, fake.api_key).status_code == 503  # the proxy has nothing to reach any more


def test_the_sdk_serves_on_hf_jobs_and_cancel_ends_it_before_its_ttl(cli, home, tmp_path, fake_hfjobs, monkeypatch):  # noqa: F811
    import autoslm

    fake = fake_hfjobs
    fake.extra_env["AUTOSLM_SERVE_SERVER"] = f"{sys.executable} {rented.STAND_IN}"
    for k, v in fake.env().items():  # what a notebook's environment holds: the Jobs URL (here the fake's) and HF_TOKEN
        monkeypatch.setenv(k, v)
    run_id = rented.finished_run(home, tmp_path)
    port = free_port()
    served = autoslm.attach(run_id, home=home).serve(step=4, on="hfjobs", gpu="L4", ttl="10m", max_usd=1, port=port, wait_s=60)
    (job,) = fake.jobs()
    assert served.url == fake.expose_url(job.id, port) + "/v1"
    assert '-H "Authorization: Bearer $HF_TOKEN"' in served.curl() and fake.api_key not in served.curl()
    assert served.chat("Hello") == f"stand-in answer from {MODEL}"  # with HF_TOKEN from the environment
    c = cli("cancel", run_id, env=fake.env())  # the trained run has ended: its serve is what `cancel RUN` ends
    assert c.code == 0, c.out + c.err
    rented.wait_until("the job to be cancelled", lambda: fake._stage(job) == "CANCELED", 30)
    assert not job.process.alive() and fake.running_jobs() == []
    assert ask(served.url, fake.api_key).status_code == 503
    assert run_state(Registry(home).replicas(served.run_id)).terminal


@pytest.mark.parametrize("args, said", [(["--max-usd", "2"], "needs --ttl"), (["--ttl", "1h"], "needs --max-usd")])
def test_a_serve_on_hf_jobs_without_its_limits_rents_nothing(cli, home, tmp_path, fake_hfjobs, args, said):  # noqa: F811
    run_id = rented.finished_run(home, tmp_path)
    r = cli("serve", run_id, "--on", "hfjobs", "--gpu", "L4", *args, "--yes", env=fake_hfjobs.env())
    assert r.code == 2 and said in r.err, r.out + r.err
    assert fake_hfjobs.launch_calls == [] and fake_hfjobs.jobs() == []
