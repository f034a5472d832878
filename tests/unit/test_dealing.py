"""The order make test gives pytest-xdist (tests/dealing.py): each worksteal slice starts with its share of
the heavy modules, a module's tests stay together, and nothing is lost or repeated."""

from __future__ import annotations

from dataclasses import dataclass

from tests.dealing import HEAVY, dealt, slice_sizes, table_from_log


@dataclass(frozen=True)
class Item:
    nodeid: str


def items_of(counts: dict[str, int]) -> list[Item]:
    return [Item(f"{m}::t{i}") for m, n in counts.items() for i in range(n)]


def test_slices_are_the_sizes_worksteal_deals():
    assert slice_sizes(10, 3) == [3, 3, 4] and sum(slice_sizes(1273, 3)) == 1273
    assert slice_sizes(7, 1) == [7]


def test_each_slice_starts_with_its_share_of_the_heavy_modules_and_modules_stay_whole():
    counts = {"long.py": 1, "e2e_a.py": 4, "e2e_b.py": 3, "e2e_c.py": 2, "unit_a.py": 30, "unit_b.py": 20}
    seconds = {"long.py": 400.0, "e2e_a.py": 200.0, "e2e_b.py": 150.0, "e2e_c.py": 100.0, "unit_a.py": 5.0}
    items = items_of(counts)
    out = dealt(items, 3, seconds, guess=lambda item: 0.1)
    assert sorted(i.nodeid for i in out) == sorted(i.nodeid for i in items)
    slices, k = [], 0
    for n in slice_sizes(len(out), 3):
        slices.append([i.nodeid.split("::")[0] for i in out[k : k + n]])
        k += n
    heads = [s[0] for s in slices]
    assert sorted(heads) == ["e2e_a.py", "e2e_b.py", "long.py"]  # the three heaviest, one a slice
    assert "e2e_c.py" in slices[heads.index("e2e_b.py")]  # the next goes where the least work is
    for s in slices:  # heavy modules first, then the light ones
        weights = [seconds.get(m, 0.0) >= HEAVY for m in s]
        assert weights == sorted(weights, reverse=True)
    for m in ("long.py", "e2e_a.py", "e2e_b.py", "e2e_c.py"):  # dealt whole
        assert sum(m in s for s in slices) == 1


def test_one_worker_or_few_tests_keep_the_order():
    items = items_of({"a.py": 2, "b.py": 1})
    assert dealt(items, 1, {}, guess=lambda item: 1.0) == items
    assert dealt(items, 2, {}, guess=lambda item: 1.0) == items


def test_the_table_is_read_from_a_durations_log():
    log = """== the laptop stack (the image's and the vLLM stacks run beside it; their output follows)
12.50s call     tests/e2e/test_a.py::test_one
0.50s setup    tests/e2e/test_a.py::test_one
1.00s call     tests/unit/test_b.py::test_two[x]
== the image's stack
3.00s call     tests/e2e/test_a.py::test_one
"""
    assert table_from_log(log) == {
        ".venv": {"tests/e2e/test_a.py": 13.0, "tests/unit/test_b.py": 1.0},
        ".venv-image": {"tests/e2e/test_a.py": 3.0},
    }
