"""A run's JobSpec has a kind: "train" (the default: every spec written without one trains, and its JSON
is as before) or "serve" (``ServeSpec``, a model of its own, built by `autoslm serve` from typed pieces).
A serve recorded before kinds existed (a training spec with a ``[serve]`` table) still loads, as a serve.

    .venv/bin/python -m pytest tests/unit/test_spec_kinds.py -q
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from autoslm.controller.placement import Left, judge_offer
from autoslm.controller.registry import RunRecord
from autoslm.controller.serve_status import spec_serve
from autoslm.providers.base import Offer
from autoslm.sdk import serve as sdk
from autoslm.sdk.adapter_source import Source
from autoslm.spec import JobSpec, ServeSpec, load_spec, spec_from_json
from autoslm.views.serve import refusal

REPO = Path(__file__).resolve().parents[2]
SOURCE_RUN = "trained-20270101-000000-aaaa"
# A serve's JobSpec as `autoslm serve` recorded it before serves had a kind of their own: the source
# run's training spec, its TTL (30 min) in limits.max_hours, and a [serve] table.
RECORDED_SERVE = {
    "name": "trained-serve",
    "model": "Qwen/Qwen3-0.6B",
    "thinking": False,
    "seed": 3,
    "trust_remote_code": False,
    "environment": {"id": "autoslm/arith", "params": {}, "judge": None, "rewards": [], "packages": [], "index_url": None},
    "train": {"max_steps": 8, "lora_rank": 16, "method": "grpo", "prompts_per_step": 8, "group_size": 4},
    "eval": {"every": 0, "at_start": True, "at_end": True, "lm_eval": []},
    "compute": {
        "provider": "runpod",
        "gpu": "RTX 4090",
        "gpu_count": 1,
        "strategy": "ddp",
        "interruptible": False,
        "max_price_per_hour": None,
        "disk_gb": 40,
        "image": "ghcr.io/autoslm/worker:test",
        "options": {"runpod": {"cloud": "secure"}},
    },
    "artifacts": {"store": "local", "repo": None, "path": None, "private": True, "commits_per_hour": 60},
    "limits": {"max_hours": 0.5, "max_usd": 2.0, "max_restarts": 1, "heartbeat_timeout_s": 900.0, "startup_timeout_s": 2700.0},
    "serve": {
        "source_run": SOURCE_RUN,
        "store": "file:///tmp/store",
        "adapter_path": f"grpo/{SOURCE_RUN}/seed3/checkpoints/step-4",
        "step": 4,
        "lora_name": "trained-step4",
        "lora_rank": 16,
        "port": 8123,
        "max_model_len": None,
    },
}
RUNPOD_4090 = Offer(
    "runpod", "RTX 4090", 1, 24, 0.69, offer_id="x", extra={"cloud": "SECURE", "gpu_id": "NVIDIA GeForce RTX 4090"}
)


def trained(**compute) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "trained",
            "model": "Qwen/Qwen3-0.6B",
            "seed": [7, 8],
            "environment": {"id": "autoslm/arith"},
            "train": {"method": "grpo", "max_steps": 8, "lora_rank": 16},
            "compute": compute or {"provider": "runpod", "gpu": "RTX 4090", "gpu_count": 2, "cloud": "secure", "disk_gb": 80},
            "limits": {"max_hours": 9, "max_restarts": 1, "heartbeat_timeout_s": 600},
        }
    )


def source(spec: JobSpec, rank: int = 16) -> Source:
    return Source(SOURCE_RUN, spec, "file:///tmp/store", f"grpo/{SOURCE_RUN}/seed7/adapter", None, rank, "trained")


@pytest.mark.parametrize("path", sorted((REPO / "jobspecs").glob("*.toml")), ids=lambda p: p.name)
def test_a_spec_without_a_kind_trains_and_its_recorded_json_is_as_before(path):
    spec = load_spec(path)
    assert spec.kind == "train" and "kind" not in json.loads(spec.to_json())
    again = spec_from_json(spec.to_json())
    assert isinstance(again, JobSpec) and again == spec


def test_a_serve_recorded_before_kinds_loads_as_the_serve_spec_it_is():
    text = json.dumps(RECORDED_SERVE)
    run = RunRecord(SOURCE_RUN + "-s", "trained-serve", "grpo", text, None, "file:///tmp/store", 0.0, 1800.0)
    spec = run.spec
    assert isinstance(spec, ServeSpec) and spec.kind == "serve"
    assert spec.limits.ttl_s == 1800 and spec.limits.time_limit_s == 1800 and spec.limits.max_usd == 2.0
    assert spec.limits.max_restarts == 1 and spec.port == 8123 and spec.seeds == [3] and spec.phase == "grpo"
    assert spec.adapter.source_run == SOURCE_RUN and spec.adapter.step == 4 and spec.adapter.lora_name == "trained-step4"
    assert spec.compute.provider == "runpod" and spec.compute.options["runpod"].cloud == "secure"
    assert spec_serve(text) == (RECORDED_SERVE["serve"], 2.0)  # `status` reads it as before
    again = spec_from_json(spec.to_json())  # and as it is recorded from now on
    assert again == spec and spec_serve(spec.to_json())[0]["source_run"] == SOURCE_RUN


def test_a_serve_is_a_spec_of_its_own_with_no_training_sections():
    spec = sdk.serve_spec(source(trained()), on="runpod", ttl_s=7200.0, max_usd=5.0, gpu=None, port=None)
    recorded = json.loads(spec.to_json())
    assert recorded["kind"] == "serve" and not {"train", "eval", "environment", "serve"} & set(recorded)
    assert isinstance(spec_from_json(spec.to_json()), ServeSpec)
    with pytest.raises(ValidationError, match="train"):
        spec_from_json(json.dumps({**recorded, "train": {"method": "sft"}}))
    with pytest.raises(ValidationError, match="gpu_count must be 1"):
        spec_from_json(json.dumps({**recorded, "compute": {**recorded["compute"], "gpu_count": 2}}))
    with pytest.raises(ValidationError, match="compute.nodes must be 1"):
        spec_from_json(json.dumps({**recorded, "compute": {**recorded["compute"], "nodes": 2}}))
    # A run trained on several pods is served on one.
    several = trained(provider="runpod", gpu="RTX 4090", nodes=2)
    served = sdk.serve_spec(source(several), on="runpod", ttl_s=60.0, max_usd=1.0, gpu=None, port=None)
    assert served.compute.nodes == 1 and "nodes" not in json.loads(served.to_json())["compute"]
    with pytest.raises(ValidationError, match="kind"):  # a training JobSpec is no serve
        JobSpec.model_validate({"kind": "serve", "name": "x", "model": "Qwen/Qwen3-0.6B", "environment": {"id": "autoslm/arith"}})


def test_the_sdk_builds_a_serve_from_the_trained_runs_typed_pieces():
    spec = sdk.serve_spec(source(trained()), on="runpod", ttl_s=7200.0, max_usd=5.0, gpu=None, port=None)
    assert spec.name == "trained-serve" and spec.model == "Qwen/Qwen3-0.6B" and spec.seeds == [7] and spec.phase == "grpo"
    assert spec.compute.provider == "runpod" and spec.compute.gpu == "RTX 4090" and spec.compute.gpu_count == 1
    assert spec.compute.disk_gb == 80 and spec.compute.options["runpod"].cloud == "secure"
    assert spec.limits.ttl_s == 7200 and spec.limits.time_limit_s == 7200 and spec.limits.max_usd == 5.0
    assert spec.limits.max_restarts == 1 and spec.limits.heartbeat_timeout_s == 600
    assert spec.port == 8000 and spec.adapter.lora_rank == 16 and spec.adapter.source_run == SOURCE_RUN
    on_l4 = sdk.serve_spec(source(trained()), on="hfjobs", ttl_s=60.0, max_usd=1.0, gpu="L4", port=9000)
    assert on_l4.compute.provider == "hfjobs" and on_l4.compute.gpu == "L4" and on_l4.port == 9000


@pytest.mark.parametrize(
    "on, ttl_s, max_usd, gpu, rank, kind, fields, sdk_says, cli_says",
    [
        ("lambda", 60, 1, None, 16, sdk.NotAProvider, {"on": "lambda"}, "on='lambda': not a provider", "--on 'lambda': not a provider"),
        ("runpod", None, 1, None, 16, sdk.LimitsMissing, {"missing": ("ttl",)}, "needs ttl:", "needs --ttl:"),
        ("vast", None, None, None, 16, sdk.LimitsMissing, {"missing": ("ttl", "max_usd")}, "needs ttl and max_usd", "needs --ttl and --max-usd"),
        ("runpod", 60, 1, None, 1024, sdk.NotServable, {"field": "adapter.lora_rank"}, "rank 1024 is above 512", "rank 1024 is above 512"),
        ("hfjobs", 60, 1, "RTX 4090", 16, sdk.NotServable, {"field": "compute"}, "not a GPU Hugging Face Jobs offers", "not a GPU"),
        ("runpod", 15 * 86400, 1, None, 16, sdk.NotServable, {"field": "ttl"}, "longer than a run may last", "--ttl: "),
    ],
)  # fmt: skip
def test_a_refused_serve_is_a_typed_error_and_the_command_says_it_in_its_flags(
    on, ttl_s, max_usd, gpu, rank, kind, fields, sdk_says, cli_says
):
    with pytest.raises(kind) as e:
        sdk.serve_spec(source(trained(), rank), on=on, ttl_s=ttl_s, max_usd=max_usd, gpu=gpu, port=None)
    assert {k: getattr(e.value, k) for k in fields} == fields
    assert sdk_says in e.value.message and e.value.exit_code == 2
    said = refusal(e.value)
    assert cli_says in said.message and said.exit_code == 2 and "\n" not in said.message


def test_a_serve_of_a_run_trained_here_needs_a_gpu_to_rent():
    here = trained(provider="local")
    with pytest.raises(sdk.GpuMissing) as e:
        sdk.serve_spec(source(here), on="runpod", ttl_s=60.0, max_usd=1.0, gpu=None, port=None)
    assert refusal(e.value).hint == 'pass --gpu, e.g. --gpu "RTX 4090"'


def test_a_relaunched_serve_is_planned_for_what_is_left_of_its_ttl():
    spec = sdk.serve_spec(source(trained()), on="runpod", ttl_s=3600.0, max_usd=5.0, gpu=None, port=None)
    first = judge_offer(spec, RUNPOD_4090)
    assert first.usable and first.est_hours == 1.0, first.note
    again = judge_offer(spec, RUNPOD_4090, left=Left(spent_usd=0.3, hours=0.25))
    assert again.usable and again.est_hours == 0.25, again.note  # a lost pod is replaced for the rest of the TTL


def test_a_file_that_asks_for_a_serve_is_told_how_a_serve_starts():
    from autoslm.errors import SpecError
    from autoslm.spec import parse_spec

    with pytest.raises(SpecError) as e:
        parse_spec('kind = "serve"\nname = "t"\nmodel = "autoslm/tiny"\n[environment]\nid = "autoslm/arith"\n', "s.toml")
    assert [str(i) for i in e.value.issues] == [
        "s.toml: kind: a serve is started from a trained run: `autoslm serve RUN[@STEP]`, not launched from a file"
    ]


def test_the_pod_files_a_serves_records_under_its_phase_before_the_spec_is_validated():
    from autoslm._image.boot_rules import error_path  # boot's own rule (worker_image/boot_rules.py)
    from autoslm.layout import PodEnv

    serve = sdk.serve_spec(source(trained()), on="runpod", ttl_s=60.0, max_usd=1.0, gpu=None, port=None)
    for spec, phase in ((serve, "grpo"), (trained(), "grpo"), (load_spec(REPO / "jobspecs" / "quickstart.toml"), "sft")):
        pod = PodEnv(run_id="r-1", store_uri="file:///s", spec_json=spec.to_json(), seed=7)
        assert pod.phase == phase and error_path(pod.to_env()) == f"{phase}/r-1/seed7/error_{phase}.txt"
