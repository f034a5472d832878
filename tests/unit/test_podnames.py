"""Pod names carry this home's id and the run id, so gc can tell whose a pod is from a provider's list."""

from __future__ import annotations

import re

from autoslm.controller.podnames import RunKeys, home_id, parse_pod_name, pod_name
from autoslm.providers.base import is_label
from tests.conftest import at_once


def test_round_trip_and_legacy_names(tmp_path):
    home = home_id(tmp_path)
    assert home == home_id(tmp_path) and len(home) == 8  # stable once written
    name = pod_name(home, "quick-20261130-101010-ab12", 1, 3)
    p = parse_pod_name(name)
    assert (p.run, p.seed, p.attempt, p.home) == ("quick-20261130-101010-ab12", 1, 3, home)
    assert p.of_run("quick-20261130-101010-ab12") and not p.of_run("quick-20261130-101010-ab13")
    old = parse_pod_name("autoslm-quick-20261130-101010-ab12-s0-a1")  # named before homes had ids
    assert old.run == "quick-20261130-101010-ab12" and old.home is None
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


LONG = "a-forty-eight-character-run-name-for-the-longest" + "-20261206-101010-ab12"  # a JobSpec name's most


def test_a_name_keeps_the_label_rule_with_a_hash_where_the_run_id_is_long():
    assert len(LONG) == 69
    for seed, attempt in [(0, 1), (3, 12), (20261206, 999)]:
        name = pod_name("abcdef12", LONG, seed, attempt)
        p = parse_pod_name(name)
        assert is_label(name) and len(name) <= 63, name
        assert (p.seed, p.attempt, p.home) == (seed, attempt, "abcdef12") and p.of_run(LONG), name
        assert p.run.startswith("a-forty-eight-charact") and not p.of_run(LONG[:-1] + "3")
    assert pod_name("abcdef12", LONG, 0, 1) == pod_name("abcdef12", LONG, 0, 1), "the same attempt, the same name"
    # Which run of a registry a name is of: a whole id, a shortened one, or none here.
    keys = RunKeys(["quick-20261130-101010-ab12", LONG])
    assert keys.run_of(parse_pod_name(pod_name("abcdef12", LONG, 1, 2))) == LONG
    assert keys.run_of(parse_pod_name(pod_name("abcdef12", "quick-20261130-101010-ab12", 0, 1))) == "quick-20261130-101010-ab12"
    assert keys.run_of(parse_pod_name(f"autoslm-{LONG}-s0-a1-habcdef12")) == LONG  # named whole, before names were held
    assert keys.run_of(parse_pod_name(pod_name("abcdef12", "other-20261130-101010-ab12", 0, 1))) is None
