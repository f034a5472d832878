"""`list` and `status` read a settled registry without the SDK (benchmarks/bench_first_screen.py says
how much faster): the table they print is the one the SDK's rows give, and a run, pod or sweep that
needs a look sends them the SDK's way. `status RUN` of a run that ended, or that its background
supervisor keeps, reads the registry and the store: it loads neither the supervisor, nor the JobSpec's
models, nor the catalog."""

from __future__ import annotations

import subprocess
import sys

from autoslm.controller.registry import RunRecord
from autoslm.sdk import Client
from autoslm.spec import validate_dict
from autoslm.views.commands import runs_table, settled_rows

SPEC = validate_dict({"name": "quick", "model": "autoslm/tiny", "environment": {"id": "autoslm/arith"}})


def make(client: Client, run_id: str, state: str, **replica) -> None:
    client.registry.create_run(RunRecord(run_id, "quick", "sft", SPEC.to_json(), None, "file:///nowhere", 100.0, 9e9), [0, 1])
    for seed in (0, 1):
        client.registry.update_replica(run_id, seed, state=state, step=3, total_steps=10, cost_usd=0.25, **replica)


def test_the_settled_table_is_the_sdks_and_a_live_run_needs_the_sdk(tmp_path):
    home = tmp_path / "home"
    client = Client(home)
    make(client, "quick-20270101-000000-aaaa", "succeeded", provider="runpod")
    make(client, "quick-20270101-000001-bbbb", "failed", error="boom")  # never launched: the spec names its provider
    rows, registry = settled_rows(home, 200)
    full = client.list_runs(tick=False)
    # The table's figures only (no seed, no adapter looked up), each the SDK's own.
    table = [r.to_json() for r in rows]
    assert table == [{k: r.to_json()[k] for k in table[0]} for r in full] and set(table[0]) < set(full[0].to_json())
    assert runs_table(rows, registry.all_run_ids(), 100) == runs_table(full, client.registry.all_run_ids(), 100)
    client.registry.update_replica("quick-20270101-000000-aaaa", 1, pod_id="pod-1")  # a pod left: a tick is due
    assert settled_rows(home, 200) is None
    client.registry.update_replica("quick-20270101-000000-aaaa", 1, pod_id=None, state="running")  # live: a tick is due
    assert settled_rows(home, 200) is None


def test_the_first_screen_loads_neither_pydantic_nor_the_sdk(tmp_path):
    home = tmp_path / "home"
    client = Client(home)
    make(client, "quick-20270101-000000-aaaa", "succeeded", provider="local")
    client.registry.close()
    for args in (["--help"], ["list"], ["status"]):
        p = _run_cli(("pydantic", "autoslm.sdk", "rich", "click"), args, home)
        assert "LOADED=\n" in p.stdout, (args, p.stdout[-800:], p.stderr[-800:])


def _run_cli(modules: tuple[str, ...], args: list[str], home) -> subprocess.CompletedProcess:
    """`autoslm ARGS` against ``home``, printing after its answer ``LOADED=`` and which of ``modules`` it loaded."""
    code = (
        "import runpy, sys\nsys.argv = ['autoslm'] + sys.argv[1:]\n"
        "try:\n    runpy.run_module('autoslm', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        f"print('LOADED=' + ','.join(m for m in {modules!r} if m in sys.modules))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env={
            "AUTOSLM_HOME": str(home),
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(__import__("pathlib").Path(__file__).parents[2]),
        },
    )


def test_status_of_an_ended_run_loads_neither_the_supervisor_nor_the_jobspec(tmp_path):
    home = tmp_path / "home"
    client = Client(home)
    make(client, "quick-20270101-000000-aaaa", "succeeded", provider="local")
    client.registry.close()
    heavy = ("autoslm.controller.supervisor", "autoslm.spec", "autoslm.catalog", "autoslm.sweep")
    for args in (["status", "quick-20270101-000000-aaaa"], ["status", "quick-2027", "--json"]):
        p = _run_cli(heavy, args, home)
        assert "succeeded" in p.stdout and "LOADED=\n" in p.stdout, (args, p.stdout[-800:], p.stderr[-800:])
