"""How quick is the first screen? `autoslm --help`, `status` and `list` (200 runs) against importing the CLI.

    python benchmarks/bench_first_screen.py [--runs 200] [--rounds 7]

Each command runs as a fresh process (the way a user runs it) against one AUTOSLM_HOME holding
``--runs`` finished runs, the commands taking turns, ``--rounds`` times each. The baseline is
``python -c "import autoslm.cli"`` in the same loop: what every command pays before it does anything.
Prints the median wall time of each and its ratio to the baseline (the target: at most 1.3), and the
interpreter's own start (``python -c pass``) for scale. A benchmark, not a timed test: the machine's
load moves the figures, the ratios much less.
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

from benchmarks.bench_list import make_runs  # noqa: E402 - after the path fix above

COMMANDS = {
    "python -c pass": ["-c", "pass"],
    'python -c "import autoslm.cli"': ["-c", "import autoslm.cli"],
    "autoslm --help": ["-m", "autoslm", "--help"],
    "autoslm status": ["-m", "autoslm", "status"],
    "autoslm list": ["-m", "autoslm", "list"],
}
BASELINE = 'python -c "import autoslm.cli"'


def timed(args: list[str], env: dict) -> float:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, *args], capture_output=True, env=env, cwd=str(ROOT))
    took = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"python {' '.join(args)} failed: {p.stderr.decode()[-500:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-first-") as tmp:
        home = Path(tmp)
        make_runs(home, a.runs)
        env = {**os.environ, "AUTOSLM_HOME": str(home), "COLUMNS": "120", "PYTHONPATH": str(ROOT)}
        # An installed package starts from its bytecode (pip compiles it): a machine that says not to
        # write any would measure compiling every module instead.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        for args in COMMANDS.values():
            timed(args, env)  # warm the file cache (and the bytecode) once
        times: dict[str, list[float]] = {name: [] for name in COMMANDS}
        for _ in range(a.rounds):
            for name, args in COMMANDS.items():
                times[name].append(timed(args, env))
    med = {name: statistics.median(t) for name, t in times.items()}
    base = med[BASELINE]
    for name, m in med.items():
        ratio = "" if name == "python -c pass" else f"  ratio to the import {m / base:.2f}"
        print(f"{name:32s} median {m * 1000:5.0f} ms over {a.rounds}{ratio}")
    worst = max(med[n] / base for n in ("autoslm --help", "autoslm status", "autoslm list"))
    print(f"worst ratio {worst:.2f} (target <= 1.3)")


if __name__ == "__main__":
    main()
