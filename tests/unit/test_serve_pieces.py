"""The pieces of `autoslm serve` that decide without running anything: durations and refs, the server's
command line, the endpoint a pod names, and the plan of a serve (its time is its TTL)."""

from __future__ import annotations

import importlib.util

import pytest

from autoslm.controller.placement import judge_offer
from autoslm.engine.pod.serving import max_lora_rank, public_url, server_command
from autoslm.errors import FatalWorkerError, UsageError
from autoslm.layout import endpoint_of
from autoslm.providers.base import Offer
from autoslm.sdk.serve import Endpoint, curl_line, parse_ttl, split_ref
from autoslm.spec import ServeSpec


def serve_spec(**adapter) -> ServeSpec:
    return ServeSpec.model_validate(
        {
            "name": "s-serve",
            "model": "Qwen/Qwen3-0.6B",
            "phase": "sft",
            "compute": {"provider": "runpod", "gpu": "RTX 4090"},
            "limits": {"ttl_s": 1800, "max_usd": 5},
            "port": adapter.pop("port", 8000),
            "adapter": {
                "source_run": "s-1",
                "store": "file:///tmp/store",
                "adapter_path": "sft/s-1/seed0/adapter",
                "lora_name": "s",
                "lora_rank": 24,
                **adapter,
            },
        }
    )


@pytest.mark.parametrize("text, seconds", [("90", 90), ("45s", 45), ("30m", 1800), ("2h", 7200), ("1.5h", 5400), ("1d", 86400)])
def test_ttl(text, seconds):
    assert parse_ttl(text) == seconds


@pytest.mark.parametrize("text", ["soon", "0", "-5m", "2w", ""])
def test_a_ttl_that_is_not_a_duration_is_refused(text):
    with pytest.raises(UsageError, match="not a duration"):
        parse_ttl(text)


def test_refs():
    assert split_ref("run-1") == ("run-1", None) and split_ref("run-1@200") == ("run-1", 200)
    with pytest.raises(UsageError, match="step number"):
        split_ref("run-1@best")


def test_the_server_is_stock_vllm_with_the_adapter_and_a_rank_vllm_accepts():
    spec = serve_spec(port=8123)
    if importlib.util.find_spec("vllm") is None:  # this stack has none: the pod says so, never starts a server
        with pytest.raises(FatalWorkerError, match="no vLLM"):
            server_command(spec, "Qwen/Qwen3-0.6B", "/w/adapter", {}, host="0.0.0.0", cuda=True)
        cmd = server_command(
            spec, "Qwen/Qwen3-0.6B", "/w/adapter", {"AUTOSLM_SERVE_SERVER": "vllm serve"}, host="0.0.0.0", cuda=True
        )
    else:
        cmd = server_command(spec, "Qwen/Qwen3-0.6B", "/w/adapter", {}, host="0.0.0.0", cuda=True)
    assert cmd[cmd.index("--lora-modules") + 1] == "s=/w/adapter" and "--enable-lora" in cmd
    assert cmd[cmd.index("--max-lora-rank") + 1] == "32"  # rank 24, rounded up to one vLLM allows
    assert cmd[cmd.index("--port") + 1] == "8123" and cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert "--enforce-eager" not in cmd and "Qwen/Qwen3-0.6B" in cmd
    assert cmd[:2] == ["vllm", "serve"] or cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    cpu = server_command(spec, "/m", "/w/adapter", {"AUTOSLM_SERVE_SERVER": "python standin.py"}, host="127.0.0.1", cuda=False)
    assert cpu[:3] == ["python", "standin.py", "/m"] and "--enforce-eager" in cpu
    assert [max_lora_rank(r) for r in (1, 8, 9, 24, 64, 300)] == [1, 8, 16, 32, 64, 320]
    with pytest.raises(FatalWorkerError):
        max_lora_rank(1024)
    # A serve's spec with a rank vLLM cannot load is refused before anything is rented.
    with pytest.raises(ValueError, match="LoRA rank 1024 is above 512"):
        serve_spec(lora_rank=1024)


def test_the_endpoint_a_pod_names():
    assert public_url({"RUNPOD_POD_ID": "abc"}, 8000, "0.0.0.0") == "https://abc-8000.proxy.runpod.net/v1"
    assert public_url({"VAST_TCP_PORT_8000": "40123", "PUBLIC_IPADDR": "1.2.3.4"}, 8000, "0.0.0.0") == "http://1.2.3.4:40123/v1"
    assert public_url({}, 9000, "127.0.0.1") == "http://127.0.0.1:9000/v1"
    assert endpoint_of("serving http://127.0.0.1:9000/v1 (model s)") == "http://127.0.0.1:9000/v1"
    assert endpoint_of("starting vLLM for s") is None and endpoint_of(None) is None
    assert "http://h/v1/chat/completions" in curl_line("http://h/v1", "s") and '"model": "s"' in curl_line("http://h/v1", "s")
    assert "Authorization" not in curl_line("http://h/v1", "s")


def test_an_endpoint_behind_a_token_names_its_variable_and_reads_the_token_from_the_environment():
    ep = Endpoint("https://j1--8000.hf.jobs/v1", "s", "HF_TOKEN")
    assert curl_line(ep.url, ep.model, ep.token_env).count('-H "Authorization: Bearer $HF_TOKEN"') == 1
    assert ep.headers({"HF_TOKEN": "hf_x"}) == {"Authorization": "Bearer hf_x"}
    assert Endpoint("http://h/v1", "s").headers({}) == {}
    with pytest.raises(UsageError, match="answers only with a token, and HF_TOKEN is not set"):
        ep.headers({})


def test_a_serving_job_times_out_at_its_ttl_plus_a_short_margin_a_training_job_keeps_its_own():
    from autoslm.providers.base import PodRequest, Serving
    from autoslm.providers.hfjobs.provider import HFJobsProvider
    from autoslm.vendors.hfjobs import data

    provider = HFJobsProvider("hf_x", "http://127.0.0.1:9", wall=lambda: 1000.0)
    training = PodRequest("autoslm-r-s0-a1", [], {}, deadline=1000.0 + 1800)
    serving = PodRequest("autoslm-r-s0-a1", [], {}, deadline=1000.0 + 1800, serving=Serving((8000,)))
    assert provider.job_timeout_s(serving) == 1800 + data.SERVE_TIMEOUT_MARGIN_S
    assert provider.job_timeout_s(training) == 1800 + data.TIMEOUT_MARGIN_S


def test_a_serve_is_planned_for_its_ttl_not_for_training():
    offer = Offer("runpod", "RTX 4090", 1, 24, 0.69, offer_id="x", extra={"cloud": "SECURE", "gpu_id": "NVIDIA GeForce RTX 4090"})
    planned = judge_offer(serve_spec(), offer)
    assert planned.usable, planned.note
    assert planned.est_hours == 0.5 and planned.estimated_cost_usd == pytest.approx(0.35, abs=0.01)
    capped = judge_offer(
        serve_spec().model_copy(update={"limits": serve_spec().limits.model_copy(update={"max_usd": 0.1})}), offer
    )
    assert capped.usable and capped.estimated_cost_usd == 0.1  # the money limit ends it first


def test_status_says_a_serve_is_serving_and_where():
    from autoslm.views.runview import seed_lines
    from tests.fakes.statuses import seed_status

    seed = seed_status(pod_id="p", last_heartbeat_age_s=3, stage="training", message="serving http://127.0.0.1:9000/v1 (model s)")
    first, where = seed_lines(seed, live=True)
    assert "stage serving" in first and where.strip() == seed.message
