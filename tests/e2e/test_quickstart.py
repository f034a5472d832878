"""The README's promise, run as written: the SFT quickstart learns, then the GRPO quickstart
continues its adapter and its reward rises. About 1.5 minutes on 2 idle cores."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_sft_local import run_id_from

pytestmark = [pytest.mark.e2e, pytest.mark.worker]  # worker: also on the image's pins


def test_sft_then_grpo_quickstarts(cli, home):
    sft = cli("launch", "jobspecs/quickstart.toml")
    assert sft.code == 0, sft.out + sft.err
    st = json.loads(cli("status", run_id_from(sft.out), "--json").out)
    assert st["state"] == "succeeded" and st["step"] == st["total_steps"] == 300
    ev = st["metrics"]["seed0"]["eval"]
    assert ev["after"]["loss"] < ev["before"]["loss"] - 2.0
    assert ev["after"]["score"] >= ev["before"]["score"] + 0.25, ev

    grpo = cli("launch", "jobspecs/quickstart-grpo.toml")
    assert grpo.code == 0, grpo.out + grpo.err
    assert "reward" in grpo.out
    st = json.loads(cli("status", run_id_from(grpo.out), "--json").out)
    assert st["state"] == "succeeded" and st["step"] == st["total_steps"] == 300
    m = st["metrics"]["seed0"]
    assert len(m["reward_curve"]) == 300
    # The mean reward of the last tenth of the steps is clearly above that of the first tenth.
    assert m["reward_last"] >= m["reward_first"] + 0.05, (m["reward_first"], m["reward_last"])
