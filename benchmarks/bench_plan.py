"""How quick is a keyless `autoslm plan` while a provider cannot be reached? Against importing autoslm's dependencies.

    python benchmarks/bench_plan.py [--rounds 7]

`plan` of a RunPod + Vast JobSpec with no keys: RunPod's list prices, and Vast's public offer search
at an address where nothing listens (refused at once, tried once, said in one line). Each command runs
as a fresh process (the way a user runs it), the two taking turns, ``--rounds`` times each. The
baseline is ``python -c "import pydantic, typer, rich, httpx, huggingface_hub"``: the light
dependencies every command may pay for. Prints the median wall time of each and the ratio plan /
baseline: the target is under 4 (it was 4.3-4.8 while the Hub data check imported huggingface_hub's
whole API, Jobs included, for a spec that reads no Hub dataset). A benchmark, not a timed test: the
machine's load moves the figures, the ratio much less.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SPEC = """# autoslm plan {path}
name = "bench-plan"
model = "Qwen/Qwen3-0.6B"
[environment]
id = "autoslm/arith"
[train]
max_steps = 200
[compute]
provider = ["runpod", "vast"]
gpu = ["RTX 4090", "L40S"]
[artifacts]
store = "hf"
repo = "someone/runs"
[limits]
max_hours = 2
"""
BASELINE = 'python -c "import pydantic, typer, rich, httpx, huggingface_hub"'
PLAN = "autoslm plan (no keys, Vast unreachable)"
TARGET = 4.0


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens: every connection is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(args: list[str], env: dict) -> float:
    t = time.perf_counter()
    p = subprocess.run([sys.executable, *args], capture_output=True, env=env, cwd=str(ROOT))
    took = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"python {' '.join(args)} failed: {p.stderr.decode()[-500:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        spec = Path(tmp) / "keyless.toml"
        spec.write_text(SPEC.format(path=spec))
        env = {
            **os.environ,
            "AUTOSLM_HOME": str(Path(tmp) / "home"),
            "RUNPOD_API_KEY": "",
            "VAST_API_KEY": "",
            "AUTOSLM_VAST_URL": f"http://127.0.0.1:{closed_port()}",
            "COLUMNS": "120",
            "PYTHONPATH": str(ROOT),
        }
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package starts from its bytecode
        commands = {
            BASELINE: ["-c", "import pydantic, typer, rich, httpx, huggingface_hub"],
            PLAN: ["-m", "autoslm", "plan", str(spec)],
        }
        for args in commands.values():
            timed(args, env)  # warm the file cache (and the bytecode) once
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(a.rounds):
            for name, args in commands.items():
                times[name].append(timed(args, env))
    med = {name: statistics.median(t) for name, t in times.items()}
    base = med[BASELINE]
    for name, m in med.items():
        print(f"{name:62s} median {m * 1000:5.0f} ms over {a.rounds}  ratio {m / base:.2f}")
    print(f"ratio plan / dependencies {med[PLAN] / base:.2f} (target < {TARGET:g})")


if __name__ == "__main__":
    main()
