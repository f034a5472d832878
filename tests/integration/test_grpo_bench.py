"""`python benchmarks/gpu_bench.py --grpo` runs end to end on this CPU with the built-in model: both runs
(autoslm's recipe and plain TRL defaults), every per-step number, the JSON file and the table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# The GPU benchmark, where the pod's pins are; long (make test-long): a benchmark's own check.
pytestmark = [pytest.mark.worker, pytest.mark.pod, pytest.mark.long]
REPO = Path(__file__).resolve().parents[2]


def test_the_grpo_benchmark_runs_on_the_cpu(tmp_path):
    out = tmp_path / "grpo.json"
    run = subprocess.run(
        [sys.executable, "benchmarks/gpu_bench.py", "--grpo", "--device", "cpu", "--out", str(out), "--grpo-steps", "2"],
        capture_output=True,
        text=True,
        cwd=str(REPO),
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["model"] == "autoslm/tiny" and result["device"] == "cpu" and result["plan"] is None
    for name in ("autoslm", "trl-defaults"):
        r = result["runs"][name]
        assert r["engine"] == "transformers" and len(r["steps"]) == 2
        assert r["step_s"] > 0 and r["generation_s"] > 0 and r["train_s"] > 0 and r["sync_s"] == 0
        assert r["waves"] >= 1 and r["completion_tokens_per_s"] > 0
        assert r["step_s"] >= r["generation_s"] + r["train_s"] - 1e-3
    assert result["runs"]["trl-defaults"]["micro_batch"] == 8
    assert "autoslm " in run.stdout and "trl-defaults " in run.stdout and "waves" in run.stdout and str(out) in run.stdout
