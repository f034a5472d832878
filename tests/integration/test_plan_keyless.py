"""`autoslm plan` without provider keys: Vast's public offer search, RunPod's catalog prices marked as such.

.venv/bin/python -m pytest tests/integration/test_plan_keyless.py -q
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from pathlib import Path

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

    # The shipped GPU JobSpec as a person sees it: every cell whole, no line wider than the terminal.
    gpu_spec = str(Path(__file__).resolve().parents[2] / "jobspecs" / "qwen3-0.6b-grpo-gpu.toml")
    offers = json.loads(cli("plan", gpu_spec, "--json", env=env).out)
    assert {r["provider"] for r in offers} == {"runpod", "vast"}
    for width in (80, 120):
        out = cli("plan", gpu_spec, env={**env, "COLUMNS": str(width)})
        assert out.code == 0, out.err
        lines = out.out.splitlines()
        assert all(len(x) <= width for x in lines) and "…" not in out.out, out.out
        header = lines[1]
        for h in ("provider", "GPU", "$/hour", "GB need/has", "est. time", "est. cost", "max cost"):
            assert h in header, (width, header)
        for r in offers:  # one line per offer, its cells whole
            assert [
                x
                for x in lines
                if r["gpu"] in x and r["provider"] in x and f"{r['price_per_hour']:.3f}" in x and f"${r['max_cost_usd']:.2f}" in x
            ], (r, out.out)
        assert out.out.count("catalog price") == 2  # once under the table, once in the best offer's line
        assert sum(1 for x in lines if x.startswith(">")) == 2  # the chosen row and its legend

    # Launching still needs the keys, and says so before anything is rented.
    spec.write_text(SPEC.format(path=spec).replace('provider = ["runpod", "vast"]', 'provider = "runpod"'))
    launch = cli("launch", str(spec), "--yes", env=env)
    assert launch.code == 3 and "RUNPOD_API_KEY" in launch.err


def test_plan_without_a_token_shows_hugging_face_flavors_at_list_prices_with_fit(cli, tmp_path):
    spec = tmp_path / "keyless-hf.toml"
    spec.write_text(
        SPEC.format(path=spec)
        .replace('provider = ["runpod", "vast"]', 'provider = ["runpod", "hfjobs"]')
        .replace('gpu = ["RTX 4090", "L40S"]', 'gpu = ["L4", "H200"]')
    )
    env = {**NO_KEYS, "HF_TOKEN": "", "HF_HOME": str(tmp_path / "hf")}  # no token, no saved login
    r = cli("plan", str(spec), "--json", env=env)
    assert r.code == 0, r.err
    hf = [x for x in json.loads(r.out) if x["provider"] == "hfjobs"]
    assert [(x["gpu"], x["price_per_hour"], x["offer_id"]) for x in hf] == [("L4", 0.8, "l4x1"), ("H200", 5.0, "h200")]
    assert all(
        x["price_source"] == "catalog"
        and x["note"].startswith("catalog price")
        and x["fits"] is True
        and x["vram_need_gb"]
        and x["estimated_cost_usd"]
        for x in hf
    )
    spec.write_text(spec.read_text().replace('provider = ["runpod", "hfjobs"]', 'provider = "hfjobs"'))
    launch = cli("launch", str(spec), "--yes", env=env)
    assert launch.code == 3 and "HF_TOKEN" in launch.err


def test_an_unreachable_provider_is_said_in_one_line_at_once(cli, tmp_path):
    """Vast cannot be reached (every connection is reset as it opens): plan shows RunPod's catalog rows
    and says so in one line, having tried once, without backing off and retrying a look at prices."""
    attempts = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    port = server.getsockname()[1]

    def reset_every_connection():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # closed: the test is over
            attempts.append(1)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()  # a reset, not an answer

    threading.Thread(target=reset_every_connection, daemon=True).start()
    spec = tmp_path / "keyless.toml"
    spec.write_text(SPEC.format(path=spec))
    env = {**NO_KEYS, "AUTOSLM_VAST_URL": f"http://127.0.0.1:{port}", "COLUMNS": "80"}
    top = cli("--help", env={"COLUMNS": "100"})
    flags = cli("chat", "--help", env={"COLUMNS": "100"})  # --prompt takes a value; --base and --help are flags
    assert "--help" in top.out and "<bool>" not in top.out + flags.out and "--base" in flags.out, top.out + flags.out
    assert "<str>" in flags.out  # a value's type is still shown
    try:
        r = cli("plan", str(spec), env=env)
    finally:
        server.close()
    assert r.code == 0, r.err
    said = [x for x in r.out.splitlines() if x.startswith("vast: ")]
    assert len(said) == 1 and "cannot reach Vast" in said[0] and "searching offers" in r.out, r.out
    assert "runpod" in r.out and "retrying" not in r.out + r.err
    # Before, a look at prices was retried 4 times (7.5 s of back-off); now it is tried once.
    assert len(attempts) == 1, attempts


def test_a_look_at_prices_is_tried_once_a_run_keeps_its_retries():
    from autoslm.errors import ProviderUnavailable
    from autoslm.providers.http import ApiClient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps: list[float] = []
    api = ApiClient(f"http://127.0.0.1:{port}", "", provider="Vast", key_env="VAST_API_KEY", sleep=sleeps.append)
    try:
        api.call("POST", "/api/v0/bundles/", what="searching offers", lookup=True)
    except ProviderUnavailable as e:
        assert "cannot reach Vast" in str(e)
    assert sleeps == []
    try:
        api.call("GET", "/api/v0/instances/1/", what="reading instance 1")
    except ProviderUnavailable:
        pass
    assert sleeps == [0.5, 1.0, 2.0, 4.0]  # status, create, terminate: backed off and retried


GSM8K_ROWS = [
    {
        "question": f"Tom has {i} apples and buys 2 more. How many now?",
        "answer": f"Tom has {i} + 2 = <<{i}+2={i + 2}>>{i + 2} apples.\n#### {i + 2}",
    }
    for i in range(8)
]


def test_the_gsm8k_jobspec_validates_and_plans_without_keys(cli, fake_vast):  # noqa: F811
    """The verl GSM8K reproduction: the Hub dataset's layout (config "main" by folder, as openai/gsm8k
    has it) on the fake Hub, offers from Vast's public search and RunPod's catalog, no keys."""
    from huggingface_hub import HfApi

    from tests.fakes.hub import FakeHub
    from tests.fakes.hub_datasets import parquet

    path = str(Path(__file__).resolve().parents[2] / "jobspecs" / "qwen2.5-0.5b-gsm8k-grpo-gpu.toml")
    assert cli("validate", path, env=NO_KEYS).code == 0
    with FakeHub(token="hf_PlanGsm8kSecret9Q2w") as hub:
        api = HfApi(endpoint=hub.endpoint, token="hf_PlanGsm8kSecret9Q2w")
        api.create_repo("openai/gsm8k", repo_type="dataset")
        for split, rows in (("train", GSM8K_ROWS[:6]), ("test", GSM8K_ROWS[6:])):
            api.upload_file(
                path_or_fileobj=parquet(rows),
                path_in_repo=f"main/{split}-00000-of-00001.parquet",
                repo_id="openai/gsm8k",
                repo_type="dataset",
            )
        env = {**NO_KEYS, **hub.env(), "AUTOSLM_VAST_URL": fake_vast.url}
        r = cli("plan", path, "--json", env=env)
        assert r.code == 0, r.err
        offers = json.loads(r.out)
        assert {o["gpu"] for o in offers} >= {"RTX 4090", "L40S"} and fake_vast.launch_calls == []
        assert all(o["est_hours"] > 0 and o["estimated_cost_usd"] > 0 for o in offers), offers
        table = cli("plan", path, env={**env, "COLUMNS": "160"})
        assert table.code == 0 and "best offer" in table.out, table.err

    # Offline (the Hub cannot be reached): `plan` warns in one line and still prices; `launch` refuses
    # before renting anything, as the dataset cannot be checked.
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there: every connection is refused
    offline = {**NO_KEYS, "HF_ENDPOINT": f"http://127.0.0.1:{port}", "AUTOSLM_VAST_URL": fake_vast.url}
    r = cli("plan", path, "--json", env=offline)
    assert r.code == 0, r.err
    warnings = [x for x in r.err.splitlines() if x.startswith("warning:")]
    assert len(warnings) == 1 and "could not look up hf:openai/gsm8k" in warnings[0], r.err
    assert json.loads(r.out) and "Traceback" not in r.err
    launch = cli("launch", path, "--yes", env={**offline, "RUNPOD_API_KEY": "rpkey-x"})
    assert launch.code == 3 and "hf:openai/gsm8k" in launch.err and fake_vast.launch_calls == [], launch.err


# huggingface_hub's whole API (the Jobs API with it) is a fifth of a second to import: a keyless `plan`
# whose spec reads no Hub dataset and rents no Hugging Face job needs none of it (benchmarks/bench_plan.py).
HEAVY_FOR_PLAN = (
    "huggingface_hub.hf_api",
    "huggingface_hub._jobs_api",
    "huggingface_hub._space_api",
    "autoslm.providers.hfjobs.client",
)


def test_a_keyless_plan_with_vast_unreachable_imports_neither_the_hub_api_nor_the_jobs_api(tmp_path):
    import subprocess
    import sys

    with socket.socket() as s:  # nothing listens there: Vast's search is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spec = tmp_path / "keyless.toml"
    spec.write_text(SPEC.format(path=spec))
    code = (
        "import runpy, sys\nsys.argv = ['autoslm', 'plan', sys.argv[1]]\n"
        "try:\n    runpy.run_module('autoslm', run_name='__main__')\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        f"print('LOADED=' + ','.join(m for m in {HEAVY_FOR_PLAN!r} if m in sys.modules))\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "AUTOSLM_HOME": str(tmp_path / "home"),
        "HF_HOME": str(tmp_path / "hf"),
        "AUTOSLM_VAST_URL": f"http://127.0.0.1:{port}",
        "COLUMNS": "120",
    }
    p = subprocess.run([sys.executable, "-c", code, str(spec)], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and "cannot reach Vast" in p.stdout and "best offer" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
    assert "LOADED=\n" in p.stdout, p.stdout[-800:]
