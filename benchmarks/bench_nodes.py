"""Several pods on this machine: the SFT quickstart (shortened) on one process, on 2 processes of one
node (`gpu_count = 2`) and on 2 nodes (`nodes = 2`), and on 2 nodes with node 1 killed after the first
checkpoint (relaunched and resumed), each through the real CLI and the local provider.

    python benchmarks/bench_nodes.py [--steps 40] [--out nodes_local.json]

Prints each run's final loss, world size, restarts and wall time, and the 2-node runs' loss against one
process's: data parallel over 2 ranks of 1 sequence-share each is the same optimizer step, so the losses
agree to float noise, and a resumed run (every rank's RNG state in each checkpoint) ends where the
uninterrupted one does. The times say what 2 processes cost on shared cores, not what pods gain.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "jobspecs" / "quickstart.toml"


def spec(folder: Path, name: str, steps: int, *, nodes: int = 1, gpu_count: int = 1) -> Path:
    text = QUICKSTART.read_text()
    edits = [
        ('name = "quickstart"', f'name = "{name}"'),
        ("n_eval = 64", "n_eval = 8"),
        ("max_steps = 150", f"max_steps = {steps}"),
        ("save_every = 100", f"save_every = {max(2, steps // 5)}"),
        ('provider = "local"', f'provider = "local"\nnodes = {nodes}\ngpu_count = {gpu_count}'),
    ]
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AUTOSLM_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "autoslm", *args], capture_output=True, text=True, env=env, cwd=ROOT)


def status(home: Path, run_id: str) -> dict:
    return json.loads(cli(home, "status", run_id, "--json").stdout)


def run_id_of(out: str) -> str:
    return re.search(r"run (\S+)", out).group(1)


def summary(st: dict, wall: float) -> dict:
    m = st["metrics"]["seed0"]
    return {"final_loss": m["final_loss"], "world_size": m["world_size"], "restarts": st["restarts"], "wall_s": round(wall, 1)}


def launch(home: Path, path: Path) -> dict:
    t = time.monotonic()
    r = cli(home, "launch", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    return summary(status(home, run_id_of(r.stdout)), time.monotonic() - t)


def killed(home: Path, path: Path) -> dict:
    """2 nodes, node 1's process group killed once the first checkpoint is in the store."""
    t = time.monotonic()
    r = cli(home, "launch", str(path), "--detach")
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = run_id_of(r.stdout)
    st = status(home, run_id)
    ckpt = Path(st["store"].removeprefix("file://")) / st["phase"] / run_id / "seed0" / "checkpoint"
    while not (ckpt.is_dir() and any((p / "autoslm_manifest.json").exists() for p in ckpt.iterdir())):
        time.sleep(0.05)
    node1 = int(status(home, run_id)["pod_id"].split("+")[1].split("-")[1])
    os.killpg(node1, signal.SIGKILL)
    while (st := status(home, run_id))["state"] not in ("succeeded", "failed", "cancelled"):
        time.sleep(0.5)
    assert st["state"] == "succeeded", st
    return summary(st, time.monotonic() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="autoslm-bench-nodes-") as tmp:
        folder, home = Path(tmp), Path(tmp) / "home"
        home.mkdir()
        results = {
            "1 process": launch(home, spec(folder, "one", args.steps)),
            "1 node x 2 processes": launch(home, spec(folder, "procs", args.steps, gpu_count=2)),
            "2 nodes x 1 process": launch(home, spec(folder, "nodes", args.steps, nodes=2)),
            "2 nodes, node 1 killed": killed(home, spec(folder, "killed", args.steps, nodes=2)),
        }
    base = results["1 process"]["final_loss"]
    for name, r in results.items():
        r["loss_minus_1_process"] = round(r["final_loss"] - base, 6)
        print(
            f"{name:24} loss {r['final_loss']:.4f} ({r['loss_minus_1_process']:+.1e})  world {r['world_size']}  "
            f"restarts {r['restarts']}  {r['wall_s']:.0f} s"
        )
    if args.out:
        args.out.write_text(json.dumps({"steps": args.steps, "runs": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
