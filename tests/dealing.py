"""The order `make test` hands its tests to pytest-xdist in, so that each worker starts with its share of the
long runs and ends with short tests.

``--dist worksteal`` deals the collected list in contiguous slices, one per worker (the first worker
``n // workers`` tests, the next an equal share of the rest...), and a worker whose slice is done takes
half of the longest queue left, from its end. Sorted longest first as one list, the long runs all fall
in the first worker's slice, and a run of minutes at the end of another slice finishes the suite alone
(a fresh-clone run ended with a 90-second time-limit test running by itself).

So the modules (a module's tests stay together: its fixtures are set up once) are dealt heaviest first
to the worker whose slice has the least work so far, then each slice is filled with the light modules
up to the size worksteal gives it, and each slice is ordered heaviest module first. Stealing then takes
short tests from the ends of the slices.

A module's weight is its measured seconds in this stack (``tests/durations.json``, written from a
``make test SLOWEST=--durations=0`` log by ``python -m tests.dealing LOG``), else a guess from its
markers. The weights only order the tests: a stale table makes a run slower, never wrong.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

TABLE = Path(__file__).with_name("durations.json")
# A guess for a test the table does not know: seconds, by what the test is.
GUESS = {"long": 300.0, "e2e": 30.0, "unit": 0.1}
# A module this heavy (seconds) is dealt first, to the least loaded worker; lighter ones fill the slices.
HEAVY = 20.0


def stack_name() -> str:
    """The stack this pytest runs in: its venv's folder name (.venv, .venv-image, .venv-vllm)."""
    return os.path.basename(sys.prefix)


def measured(table: Path = TABLE) -> dict[str, float]:
    """Seconds per test module in this stack, from the table (nothing where it is missing or unreadable)."""
    try:
        return {str(k): float(v) for k, v in json.loads(table.read_text()).get(stack_name(), {}).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def slice_sizes(n: int, workers: int) -> list[int]:
    """How many tests worksteal deals each worker at the start, in order (xdist's WorkStealingScheduling)."""
    sizes = []
    for i in range(workers):
        sizes.append(n // (workers - i))
        n -= sizes[-1]
    return sizes


def dealt(items: list, workers: int, seconds: dict[str, float], guess: Callable[[object], float]) -> list:
    """``items`` in the order that gives each of ``workers`` slices its share of the heavy modules first."""
    if workers < 2 or len(items) < 2 * workers:
        return list(items)
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    weight = {name: seconds[name] if name in seconds else sum(map(guess, tests)) for name, tests in modules.items()}
    heavy = sorted((m for m in modules if weight[m] >= HEAVY), key=weight.get, reverse=True)
    sizes = slice_sizes(len(items), workers)
    slices: list[list] = [[] for _ in range(workers)]
    load = [0.0] * workers
    for name in heavy:
        fits = [w for w in range(workers) if len(slices[w]) + len(modules[name]) <= sizes[w]] or list(range(workers))
        w = min(fits, key=lambda w: load[w])
        slices[w] += modules[name]
        load[w] += weight[name]
    rest = [i for name in modules if weight[name] < HEAVY for i in modules[name]]
    for w in range(workers):
        room = max(0, sizes[w] - len(slices[w])) if w < workers - 1 else len(rest)
        slices[w] += rest[:room]
        rest = rest[room:]
    return [i for s in slices for i in s]


def table_from_log(log: str) -> dict[str, dict[str, float]]:
    """Seconds per module in each stack, from the output of ``make test SLOWEST=--durations=0``."""
    stacks = {"== the laptop": ".venv", "== the image": ".venv-image", "== the vLLM": ".venv-vllm"}
    out: dict[str, dict[str, float]] = {}
    stack = None
    for line in log.splitlines():
        stack = next((v for k, v in stacks.items() if line.startswith(k)), stack)
        m = re.match(r"([\d.]+)s (?:call|setup|teardown)\s+(\S+?)::", line)
        if m and stack:
            table = out.setdefault(stack, {})
            table[m[2]] = round(table.get(m[2], 0.0) + float(m[1]), 1)
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.dealing LOG  (a `make test SLOWEST=--durations=0` log): writes tests/durations.json")
    TABLE.write_text(json.dumps(table_from_log(Path(sys.argv[1]).read_text()), indent=1, sort_keys=True) + "\n")
