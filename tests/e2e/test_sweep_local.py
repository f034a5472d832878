"""A sweep on this machine, run as a user would: 4 points x 2 seeds of the SFT quickstart, shortened,
two runs at a time. The runs' own event times show that never more than two trained at once;
`status` and `report` rank the points and name the best; the SDK's frame has a row per run.

    .venv/bin/python -m pytest -q tests/e2e/test_sweep_local.py
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autoslm.layout import RunPaths
from autoslm.store import RunArtifacts, open_store

# long (make test-long): eight real runs; make test checks sweeps through the chaos suite's stand-in
# workers (tests/chaos/test_sweeps.py).
pytestmark = [pytest.mark.e2e, pytest.mark.long]

REPO = Path(__file__).resolve().parents[2]

SWEEP = """name = "qs-sweep"
model = "autoslm/tiny"
seed = [0, 1]
[environment]
id = "autoslm/arith"
params = { n_train = 256, n_eval = 16, max_operand = 9 }
[train]
method = "sft"
max_steps = 6
batch_size = 16
max_length = 64
save_every = 100
[sweep]
"train.learning_rate" = [1e-3, 3e-3]
"train.lora_rank" = [8, 32]
max_parallel = 2
"""


def _intervals(home: Path, runs: list[dict]) -> list[tuple[float, float]]:
    """(first event, last event) of each run's worker, from the store."""
    store = open_store((home / "artifacts").resolve().as_uri())
    out = []
    for r in runs:
        times = [e.time for e in RunArtifacts(store, RunPaths("sft", r["run_id"], r["seed"])).read_events()]
        assert times, r
        out.append((min(times), max(times)))
    return out


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda e: (e[0], e[1]))
    now = most = 0
    for _, d in edges:
        now += d
        most = max(most, now)
    return most


def test_a_local_sweep_of_4_points_x_2_seeds_runs_2_at_a_time_and_ranks_its_points(cli, home, tmp_path):
    spec = tmp_path / "sweep.toml"
    spec.write_text(SWEEP)
    r = cli("validate", str(spec))
    said = " ".join(r.out.split())  # the meaning, wherever a terminal would fold the line
    assert r.code == 0 and "4 points" in said and "8 runs" in said and str(spec) in said, r.out + r.err
    assert len(r.out.strip().splitlines()) == 1, r.out  # one line, never hard-wrapped inside the path
    r = cli("launch", str(spec), env={"COLUMNS": "200"})
    assert r.code == 0, r.out + r.err
    sweep_id = re.search(r"^sweep (\S+) launched", r.out, re.M).group(1)
    r = cli("status", sweep_id, "--json")
    assert r.code == 0, r.out + r.err
    st = json.loads(r.out)
    assert st["state"] == "succeeded" and len(st["runs"]) == 8 and len(st["points"]) == 4, st
    assert {(x["point"], x["seed"]) for x in st["runs"]} == {(p, s) for p in range(4) for s in (0, 1)}
    assert all(x["state"] == "succeeded" and x["step"] == 6 for x in st["runs"]), st["runs"]
    assert most_at_once(_intervals(home, st["runs"])) == 2  # both slots used, never a third
    # Ranked by the held-out score (higher first), every point with a mean over its two seeds.
    assert st["metric"] == "eval_score" and st["higher_is_better"]
    means = [p["metric"] for p in st["points"]]
    assert None not in means and means == sorted(means, reverse=True), st["points"]
    assert [p["rank"] for p in st["points"]] == [1, 2, 3, 4] and all(p["n"] == 2 for p in st["points"])
    best = st["best"]
    assert best["point"] == st["points"][0]["point"]
    text = cli("status", sweep_id, env={"COLUMNS": "200"}).out
    assert f"best: point {best['point']} " in text and "learning_rate" in text and "lora_rank" in text, text

    out = tmp_path / "report.html"
    r = cli("report", sweep_id, "--out", str(out))
    assert r.code == 0, r.out + r.err
    page = out.read_text()
    assert f"best: point {best['point']} " in page and page.count("<svg") >= 1, page[:2000]
    assert all(f"p{p} " in page for p in range(4))  # every point's curve in the chart's legend

    # The SDK: a handle on the sweep whose frame has a row per run, the swept values as columns.
    code = (
        "import sys, autoslm; h = autoslm.sweep(sys.argv[1]); f = h.frame(); "
        "print(len(f), sorted(f.columns)[:3], sorted(set(f['train.lora_rank'])), sorted(set(f['state'])))"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, sweep_id],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        env={**os.environ, "AUTOSLM_HOME": str(home), "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.split("[")[0].strip() == "8" and "[8, 32]" in p.stdout and "['succeeded']" in p.stdout, p.stdout
