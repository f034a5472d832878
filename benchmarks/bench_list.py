"""Does `autoslm list` stay quick with many runs? Its time with 200 runs against `autoslm --help`.

    python benchmarks/bench_list.py [--runs 200] [--rounds 5]

Both commands run as fresh processes (the way a user runs them) against one AUTOSLM_HOME holding
``--runs`` finished runs, alternating, ``--rounds`` times each. Prints the median wall time of each
and the ratio list/help: the target is at most 2.0 (listing costs no more than twice starting up).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autoslm.controller.registry import Registry, RunRecord  # noqa: E402 - after the path fix above
from autoslm.sdk import new_run_id  # noqa: E402
from autoslm.spec import validate_dict  # noqa: E402


def make_runs(home: Path, n: int) -> None:
    spec = validate_dict({"name": "bench", "model": "autoslm/tiny", "environment": {"id": "autoslm/arith"}})
    reg = Registry(home)
    now = time.time()
    for i in range(n):
        rid = new_run_id("bench", now + 7 * i)
        reg.create_run(
            RunRecord(rid, "bench", "sft", spec.to_json(), None, (home / "artifacts").as_uri(), now + i, now + 3600), [0]
        )
        reg.update_replica(rid, 0, state="succeeded" if i % 5 else "failed", step=10, total_steps=10, cost_usd=0.01 * i)
    reg.close()


def timed(args: list[str], env: dict) -> float:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "autoslm", *args], capture_output=True, env=env, cwd=str(ROOT))
    took = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"autoslm {' '.join(args)} failed: {p.stderr.decode()[-500:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-list-") as tmp:
        home = Path(tmp)
        make_runs(home, a.runs)
        env = {**os.environ, "AUTOSLM_HOME": str(home), "COLUMNS": "120"}
        timed(["--help"], env)  # warm the file cache once for both
        helps, lists = [], []
        for _ in range(a.rounds):
            helps.append(timed(["--help"], env))
            lists.append(timed(["list"], env))
    h, l = statistics.median(helps), statistics.median(lists)
    print(f"autoslm --help          median {h * 1000:.0f} ms over {a.rounds} runs")
    print(f"autoslm list ({a.runs} runs) median {l * 1000:.0f} ms over {a.rounds} runs")
    print(f"ratio list/help: {l / h:.2f} (target <= 2.0)")


if __name__ == "__main__":
    main()
