"""Pod names carry this home's id and the run id, so gc can tell whose a pod is from a provider's list."""

from __future__ import annotations

import re

from autoslm.controller.podnames import home_id, parse_pod_name, pod_name
from tests.conftest import at_once


def test_round_trip_and_legacy_names(tmp_path):
    home = home_id(tmp_path)
    assert home == home_id(tmp_path) and len(home) == 8  # stable once written
    name = pod_name(home, "quick-20261130-101010-ab12", 1, 3)
    p = parse_pod_name(name)
    assert (p.run_id, p.seed, p.attempt, p.home) == ("quick-20261130-101010-ab12", 1, 3, home)
    old = parse_pod_name("autoslm-quick-20261130-101010-ab12-s0-a1")  # named before homes had ids
    assert old.run_id == "quick-20261130-101010-ab12" and old.home is None
    assert parse_pod_name("someone-elses-pod") is None


def test_two_homes_get_different_ids(tmp_path):
    assert home_id(tmp_path / "a") != home_id(tmp_path / "b")


FIRST_COMMANDS = """
from pathlib import Path
from autoslm.controller.podnames import home_id
for i in range(int(sys.argv[3])):
    print(home_id(Path(sys.argv[2]) / str(i)))
"""


def test_first_commands_at_once_agree_on_one_whole_id(tmp_path):
    # A loser of the create must read the winner's id, never the empty file it has just created.
    rounds = 300
    outs = at_once(tmp_path, FIRST_COMMANDS, str(tmp_path / "homes"), str(rounds))
    for i in range(rounds):
        written = (tmp_path / "homes" / str(i) / "home-id").read_text().strip()
        seen = {out.split("\n")[i] for out in outs}
        assert seen == {written} and re.fullmatch(r"[0-9a-f]{8}", written), (i, seen, written)
