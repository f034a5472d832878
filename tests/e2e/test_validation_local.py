"""End to end on this CPU: [eval] during a real run. stop_at below what the quickstart reaches ends
training early and the run succeeds, saying why; keep_best hands back the best evaluation's adapter
and `autoslm status` names its step; a GRPO run continuing that adapter that only got worse hands back
the adapter it started from.

The SFT run is trained once for the session (tests/shared_runs.py), in a home both tests use: the first
reads it, the second continues its adapter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, CliResult, shared_models_dir
from tests.e2e.test_sft_local import run_id_from, status
from tests.shared_runs import once, session_folder

pytestmark = [pytest.mark.e2e, pytest.mark.worker]  # worker: run on the image's pins (make test: only there)

SPEC = """# autoslm launch {path}
name = "{name}"
model = "autoslm/tiny"
seed = 0
[environment]
id = "autoslm/arith"
params = {{ n_train = 2048, n_eval = 64, max_operand = 9 }}
[train]
max_steps = 150
batch_size = 32
learning_rate = 3e-3
lr_scheduler = "cosine"
warmup_ratio = 0.05
max_length = 64
save_every = 10
keep_checkpoints = 10
lora_rank = 32
lora_alpha = 64
[eval]
{eval}
[artifacts]
path = "{store}"
[limits]
max_hours = 1
"""


def _lora(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


class Stopped:
    """The module's SFT run, stopped early by stop_at with keep_best on, in a home and store shared by every
    xdist worker that takes one of the module's tests; ``cli`` runs a command there."""

    def __init__(self, shared: Path, tmp: Path):
        self.home, self.store, self.tmp = shared / "home", shared / "store", tmp
        self.home.mkdir(exist_ok=True)
        if not (self.home / "models").is_symlink():
            (self.home / "models").symlink_to(shared_models_dir(tmp), target_is_directory=True)
        self.run_id = once(shared, self._train)

    def cli(self, *args: str) -> CliResult:
        env = {**os.environ, "AUTOSLM_HOME": str(self.home), "PYTHONPATH": str(REPO)}
        p = subprocess.run(
            [sys.executable, "-m", "autoslm", *args], capture_output=True, text=True, env=env, cwd=str(REPO), timeout=600
        )
        return CliResult(p.returncode, p.stdout, p.stderr)

    def _train(self) -> str:
        # The SFT quickstart reaches 52% held-out at 150 steps; 20% is reached on the way.
        spec = self.tmp / "stop.toml"
        table = 'every = 10\nstop_at = 0.2\nkeep_best = true\nmetric = "score"'
        spec.write_text(SPEC.format(path=spec, name="stop", eval=table, store=self.store))
        r = self.cli("launch", str(spec))
        assert r.code == 0, r.out + r.err
        return run_id_from(r.out)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    return Stopped(session_folder(tmp_path_factory, "validation-run"), tmp_path_factory.mktemp("validation"))


def test_stop_at_ends_the_quickstart_early_and_keep_best_names_its_step(stopped):
    cli, run_id = stopped.cli, stopped.run_id
    st = status(cli, run_id)
    assert st["state"] == "succeeded"
    m = st["metrics"]["seed0"]
    stopped = m["validation"]["stopped"]
    assert m["steps"] < 150 and stopped["step"] == m["steps"] and stopped["value"] >= 0.2
    assert m["stop_reason"].startswith(f"eval.stop_at reached at step {m['steps']}")
    during = [e for e in m["validation"]["evaluations"] if e["when"] == "during"]
    assert [e["step"] for e in during] == list(range(10, m["steps"] + 1, 10))
    assert all(e["score"] < 0.2 for e in during[:-1])  # it stopped at the first evaluation that reached it
    # The adapter handed back is the best evaluation's, its step named in metrics and by status.
    best = m["validation"]["best"]
    assert m["eval"]["after_step"] == best["step"] and m["eval"]["after"]["score"] == best["value"]
    text = cli("status", run_id)
    assert text.code == 0 and "stopped early" in text.out and f"step {best['step']}" in text.out
    adapter = Path(st["adapter"])
    kept = adapter.parent / "checkpoint" / f"checkpoint-{best['step']}"
    for name, tensor in _lora(kept).items():
        assert (_lora(adapter)[name] == tensor).all(), name


GRPO = """# autoslm launch {path}
name = "worse"
model = "autoslm/tiny"
seed = 0
[environment]
id = "autoslm/arith"
params = {{ n_train = 2048, n_eval = 64, max_operand = 9 }}
[train]
method = "grpo"
init_from_adapter = "{sft}"
max_steps = 6
prompts_per_step = 4
group_size = 4
learning_rate = 0.05
lr_scheduler = "constant"
max_completion_tokens = 8
max_length = 64
save_every = 10
lora_rank = 32
lora_alpha = 64
[eval]
every = 3
[artifacts]
path = "{store}"
[limits]
max_hours = 1
"""


def test_a_grpo_run_that_only_got_worse_hands_back_its_start(stopped, tmp_path):
    """The converged-adapter case: GRPO continuing an SFT adapter keeps the best evaluation by default
    (keep_best = "auto"); a learning rate far too high wrecks every evaluation after the start, so the
    run hands back the adapter it started from and says so."""
    cli, sft_id = stopped.cli, stopped.run_id
    start = status(cli, sft_id)["metrics"]["seed0"]["eval"]["after"]["score"]
    path = tmp_path / "grpo.toml"
    path.write_text(GRPO.format(path=path, sft=sft_id, store=stopped.store))
    r = cli("launch", str(path))
    assert r.code == 0, r.out + r.err
    st = status(cli, run_id_from(r.out))
    m = st["metrics"]["seed0"]
    scores = [e["score"] for e in m["validation"]["evaluations"]]
    assert m["steps"] == 6 and scores[0] == start and max(scores[1:]) < start, scores
    assert m["eval"]["after_step"] == 0 and m["validation"]["best"]["when"] == "before"
    assert m["eval"]["after"] == m["eval"]["before"] and "started from" in m["eval"]["note"]
    assert m["eval"]["last_step"] == 6 and m["eval"]["last"]["score"] == scores[-1]
    # The adapter handed back is the SFT adapter the run continued.
    sft_adapter = Path(status(cli, sft_id)["adapter"])
    mine = _lora(Path(st["adapter"]))
    for name, tensor in _lora(sft_adapter).items():
        assert (mine[name] == tensor).all(), name
    text = cli("status", st["run_id"])
    assert "started from (step 0)" in text.out
