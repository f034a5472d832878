"""Pod names carry this home's id and the run id, so gc can tell whose a pod is from a provider's list."""

from __future__ import annotations

from autoslm.controller.podnames import home_id, parse_pod_name, pod_name


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
