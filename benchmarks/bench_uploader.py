"""Does training wait on the Hub? Step time with the background uploader, fast Hub vs slow Hub.

    python benchmarks/bench_uploader.py [--steps 60] [--delay 2.0] [--rounds 2]

A simulated training loop (a CPU-bound torch matmul step of ~30 ms, or a pure-Python busy step when
torch is missing) calls heartbeat, event and checkpoint every step through the Uploader, into an
HfStore talking to the fake Hub on 127.0.0.1 (the real huggingface_hub client, a fake far end).
Run (a) commits at once; run (b) has every commit held for ``--delay`` seconds by the Hub. Both run
in this process, alternating, and the script prints the ratio of mean step times (b)/(a): about 1.0
means the trainer never waits on the network. Nothing here leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: autoslm and tests.fakes

from tests.fakes.hub import FAKE_HUB_TOKEN, FakeHub  # noqa: E402 - after the path fix above


def make_step(target_s: float):
    """A CPU-bound step of about ``target_s`` seconds, calibrated here."""
    try:
        import torch

        # One thread: the step stands in for GPU work, which leaves the CPU's other cores to the
        # uploader (and here, the fake Hub) rather than racing them for every core.
        torch.set_num_threads(1)
        a, b = torch.randn(512, 512), torch.randn(512, 512)

        def unit():
            (a @ b).sum().item()
    except ImportError:  # pragma: no cover - the benchmark still runs without torch

        def unit():
            sum(i * i for i in range(20_000))

    unit()
    t0 = time.perf_counter()
    for _ in range(20):
        unit()
    per = (time.perf_counter() - t0) / 20
    reps = max(1, round(target_s / per))

    def step():
        for _ in range(reps):
            unit()

    return step


def run(hub: FakeHub, name: str, *, steps: int, delay: float, step_fn, workdir: Path) -> dict:
    from autoslm.engine.pod.uploader import Uploader
    from autoslm.layout import Event, Heartbeat, RunPaths
    from autoslm.store.artifacts import RunArtifacts
    from autoslm.store.hf import HfStore

    repo = f"bench/{name}"
    store = HfStore(repo, token=FAKE_HUB_TOKEN, endpoint=hub.endpoint, timeout=60)
    store.ensure_repo()
    artifacts = RunArtifacts(store, RunPaths("sft", name, 0))
    hub.delay_commits(delay)
    uploader = Uploader(artifacts, commits_per_hour=60, staging_dir=workdir / f"staging-{name}", log=lambda m: None).start()
    out = workdir / f"out-{name}"
    times = []
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        step_fn()
        uploader.heartbeat(
            Heartbeat(run_id=name, seed=0, phase="sft", stage="training", step=step, total_steps=steps, loss=1.0 / step)
        )
        uploader.event(Event(kind="step", step=step, data={"loss": 1.0 / step}))
        ckpt = out / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        (ckpt / "adapter_model.safetensors").write_bytes(os.urandom(256 * 1024))
        (ckpt / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
        uploader.checkpoint(step, ckpt, keep=2, final=(step == steps))
        shutil.rmtree(ckpt)  # the trainer's own rotation: the uploader has its snapshot
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    ok = uploader.close(timeout=120)
    close_s = time.perf_counter() - t0
    hub.delay_commits(0)
    assert ok, f"{name}: the uploader did not finish"
    assert artifacts.list_checkpoints()[-1] == steps, f"{name}: the final checkpoint is missing"
    body = times[3:]  # the first steps warm caches and connections
    return {
        "mean": statistics.mean(body),
        "p50": statistics.median(body),
        "p95": sorted(body)[int(0.95 * (len(body) - 1))],
        "max": max(body),
        "commits": uploader.commits,
        "hub_commits": len(hub.commits(repo)),
        "skipped": len(uploader.skipped_checkpoints),
        "close_s": close_s,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--delay", type=float, default=2.0, help="seconds the Hub holds every commit in run (b)")
    parser.add_argument("--rounds", type=int, default=2, help="alternating (a, b) pairs")
    parser.add_argument("--step-ms", type=float, default=30.0)
    args = parser.parse_args(argv)

    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # the uploader thread's tqdm bars would bury the table
    step_fn = make_step(args.step_ms / 1000)
    workdir = Path(tempfile.mkdtemp(prefix="bench-uploader-"))
    results: dict[str, list[dict]] = {"a": [], "b": []}
    try:
        with FakeHub(token=FAKE_HUB_TOKEN) as hub:
            for r in range(args.rounds):
                results["a"].append(run(hub, f"a{r}", steps=args.steps, delay=0.0, step_fn=step_fn, workdir=workdir))
                results["b"].append(run(hub, f"b{r}", steps=args.steps, delay=args.delay, step_fn=step_fn, workdir=workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"{args.steps} steps x {args.rounds} rounds; heartbeat + event + 256 KiB checkpoint every step; budget 60 commits/hour")
    print(f"{'run':<28}{'mean ms':>9}{'p50 ms':>9}{'p95 ms':>9}{'max ms':>9}{'commits':>9}{'skipped':>9}{'close s':>9}")
    for key, label in (("a", "(a) Hub answers at once"), ("b", f"(b) every commit +{args.delay:g} s")):
        for res in results[key]:
            print(
                f"{label:<28}{res['mean'] * 1e3:>9.1f}{res['p50'] * 1e3:>9.1f}{res['p95'] * 1e3:>9.1f}"
                f"{res['max'] * 1e3:>9.1f}{res['commits']:>9}{res['skipped']:>9}{res['close_s']:>9.1f}"
            )
    mean_a = statistics.mean(r["mean"] for r in results["a"])
    mean_b = statistics.mean(r["mean"] for r in results["b"])
    p50_a = statistics.mean(r["p50"] for r in results["a"])
    p50_b = statistics.mean(r["p50"] for r in results["b"])
    print(f"ratio of median step time (b)/(a): {p50_b / p50_a:.3f}")
    print(f"ratio of mean step time (b)/(a): {mean_b / mean_a:.3f}  (target ~1.0)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
