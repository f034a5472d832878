"""`autoslm plan` without provider keys: Vast's public offer search, RunPod's catalog prices marked as such.

    .venv/bin/python -m pytest tests/integration/test_plan_keyless.py -q
"""

from __future__ import annotations

import json

from tests.fakes.vast import fake_vast  # noqa: F401 - pytest fixture

SPEC = """# autoslm plan {path}
name = "keyless"
model = "Qwen/Qwen3-0.6B"
[environment]
id = "autoslm/arith"
[train]
max_steps = 200
[compute]
provider = ["runpod", "vast"]
gpu = ["RTX 4090", "L40S"]
[artifacts]
store = "hf"
repo = "someone/runs"
[limits]
max_hours = 2
"""
NO_KEYS = {"RUNPOD_API_KEY": "", "VAST_API_KEY": ""}


def test_plan_without_keys_shows_vast_offers_and_runpod_catalog_prices(cli, tmp_path, fake_vast):  # noqa: F811
    spec = tmp_path / "keyless.toml"
    spec.write_text(SPEC.format(path=spec))
    env = {**NO_KEYS, "AUTOSLM_VAST_URL": fake_vast.url}
    r = cli("plan", str(spec), "--json", env=env)
    assert r.code == 0, r.err
    rows = json.loads(r.out)
    runpod = [x for x in rows if x["provider"] == "runpod"]
    vast = [x for x in rows if x["provider"] == "vast"]
    assert [(x["gpu"], x["price_per_hour"]) for x in runpod] == [("RTX 4090", 0.69), ("L40S", 0.86)]
    assert all(x["price_source"] == "catalog" and x["note"].startswith("catalog price") for x in runpod)
    assert vast and all(x["price_source"] == "live" and "public offer search" in x["note"] for x in vast)
    assert fake_vast.searches, "Vast's offer search was not asked"
    assert fake_vast.launch_calls == []

    table = cli("plan", str(spec), env={**env, "COLUMNS": "200"})
    assert table.code == 0, table.err
    assert "catalog price" in table.out and "best offer: runpod RTX 4090" in table.out

    # Launching still needs the keys, and says so before anything is rented.
    spec.write_text(SPEC.format(path=spec).replace('provider = ["runpod", "vast"]', 'provider = "runpod"'))
    launch = cli("launch", str(spec), "--yes", env=env)
    assert launch.code == 3 and "RUNPOD_API_KEY" in launch.err
