"""Seeing runs, end to end on the tiny model through the real CLI: `watch` and `logs --follow` in a
pseudo-terminal against a running job, `report` rendered by headless Chromium, `push` (adapter and
merged weights) to the fake Hub with a model card, and a tracker (tensorboard) reached through TRL.

One run is shared by the module's tests, whichever xdist workers take them (training it is the slow
part); each test looks at it differently.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, backoff, shared_models_dir, spawn_in_pty
from tests.fakes.hub import FAKE_HUB_TOKEN, FakeHub
from tests.shared_runs import once, session_folder

pytestmark = pytest.mark.e2e

STEPS = 120
SPEC = """# autoslm launch {path}
name = "views"
model = "autoslm/tiny"
[environment]
id = "autoslm/arith"
params = {{ n_train = 512, n_eval = 8, max_operand = 9 }}
[train]
max_steps = {steps}
batch_size = 8
learning_rate = 3e-3
max_length = 64
save_every = 40
lora_rank = 8
eval_samples = 8
report_to = ["tensorboard"]
[artifacts]
path = "{store}"
[limits]
max_hours = 1
"""
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r")


class World:
    """The module's run, one for the session in a home and store every xdist worker shares
    (tests/shared_runs.py): the first worker to get here launches it, detached; each test looks at it
    differently. ``tmp``: this worker's own folder (what a test writes)."""

    def __init__(self, shared: Path, tmp: Path):
        self.tmp, self.home, self.store = tmp, shared / "home", shared / "store"
        self.home.mkdir(exist_ok=True)
        if not (self.home / "models").is_symlink():
            (self.home / "models").symlink_to(shared_models_dir(tmp), target_is_directory=True)
        # PYTHONPATH: local workers import this checkout too, whatever the environment's install points at.
        self.env = {
            **os.environ,
            "AUTOSLM_HOME": str(self.home),
            "COLUMNS": "100",
            "TENSORBOARD_LOGGING_DIR": str(shared / "tensorboard"),
            "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        self.run_id = once(shared, self.launch)

    def cli(self, *args: str, env: dict | None = None, timeout: float = 300):
        return subprocess.run(
            [sys.executable, "-m", "autoslm", *args],
            capture_output=True,
            text=True,
            env={**self.env, **(env or {})},
            cwd=str(REPO),
            timeout=timeout,
        )

    def launch(self, name: str = "views") -> str:
        """A detached run of the module's spec under ``name``; its run id. (Another name keeps the
        module's run's id prefixes, which tests pass to commands, unique.)"""
        spec = self.tmp / f"{name}.toml"
        spec.write_text(SPEC.format(path=spec, steps=STEPS, store=self.store).replace('name = "views"', f'name = "{name}"', 1))
        r = self.cli("launch", str(spec), "--detach")
        assert r.returncode == 0, r.stdout + r.stderr
        return next(line.split()[1] for line in r.stdout.splitlines() if line.startswith("run ") and "launched" in line)

    def status(self) -> dict:
        r = self.cli("status", self.run_id, "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def wait_done(self, timeout: float = 300) -> dict:
        st = self.wait_ended(timeout)
        assert st["state"] == "succeeded", st
        return st

    def wait_ended(self, timeout: float = 300) -> dict:
        deadline = time.monotonic() + timeout
        pause = backoff(cap=3.0)
        while time.monotonic() < deadline:
            st = self.status()
            if st["state"] in ("succeeded", "failed", "cancelled"):
                return st
            time.sleep(next(pause))
        raise AssertionError("the run did not end")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = World(session_folder(tmp_path_factory, "views-run"), tmp_path_factory.mktemp("views"))
    yield w
    # Another worker may still be reading the run: it is waited out, and cancelled only if it outlives that.
    with contextlib.suppress(AssertionError):
        w.wait_ended()
    w.cli("cancel", w.run_id)


def read_all(procs: dict[str, tuple[int, int]], timeout: float = 300) -> dict[str, tuple[int, str]]:
    """Read every pty until it closes; return name -> (exit code, output without ANSI codes)."""
    out = {name: b"" for name in procs}
    open_fds = {fd: name for name, (_, fd) in procs.items()}
    deadline = time.monotonic() + timeout
    while open_fds and time.monotonic() < deadline:
        ready, _, _ = select.select(list(open_fds), [], [], 0.5)
        for fd in ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: the child closed its terminal
                chunk = b""
            if not chunk:
                os.close(fd)
                del open_fds[fd]
            else:
                out[open_fds[fd]] += chunk
    result = {}
    for name, (pid, _) in procs.items():
        if open_fds:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        result[name] = (os.waitstatus_to_exitcode(status), ANSI.sub("", out[name].decode(errors="replace")))
    return result


def test_watch_and_logs_follow_live_in_a_terminal(world):
    run_id = world.run_id
    if world.status()["state"] not in ("pending", "provisioning", "running"):
        # Another test of the module waited its run out first (the order is not fixed: --shuffle):
        # a run of this test's own, watched from its start.
        run_id = world.launch("watched")
    # A fast refresh: the tiny run trains tens of steps a second on an idle machine.
    procs = {
        "watch": spawn_in_pty(["watch", run_id[:12], "--poll-s", "0.2"], world.env),
        "logs": spawn_in_pty(["logs", run_id, "--follow"], world.env),
    }
    res = read_all(procs)
    code, text = res["watch"]
    assert code == 0, text[-2000:]
    assert run_id in text and f"/{STEPS}" in text
    for what in ("ETA", "tokens/s", "heartbeat", "GPU CPU", "so far", "pod ", "last events:", "training began"):
        assert what in text, (what, text[-2000:])
    assert any(c in text for c in "▁▂▃▄▅▆▇█"), "no sparkline"
    seen_steps = {int(m) for m in re.findall(rf"(\d+)/{STEPS} \(", text)}
    assert len(seen_steps) >= 3, f"the view did not update live: {sorted(seen_steps)}"
    assert text.rstrip().endswith(f"run {run_id}: succeeded")

    code, text = res["logs"]
    assert code == 0, text[-2000:]
    assert "[autoslm] train_begin" in text and "[autoslm] done" in text  # followed to the end, then exited


def test_status_shows_the_tracker_and_trl_wrote_to_it(world):
    st = world.wait_done()
    url = st["trackers"]["tensorboard"]
    logdir = Path(url[len("file://") :])
    assert list(logdir.rglob("events.out.tfevents.*")), f"TRL wrote no tensorboard events under {logdir}"
    r = world.cli("status", world.run_id)
    assert f"tracker tensorboard: {url}" in r.stdout


def screenshot(html: Path, png: Path, height: int = 1300) -> Path:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium binary: install the Debian package chromium (make ci-deps does)")
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size=1000,{height}",
            f"--screenshot={png}",
            html.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    return png


def curve_pixels(png: Path) -> int:
    """Pixels of the first series' color (the curves and their legend swatches)."""
    from PIL import Image

    raw = Image.open(png).convert("RGB").tobytes()
    return sum(
        1 for i in range(0, len(raw), 3) if abs(raw[i] - 31) < 40 and abs(raw[i + 1] - 119) < 40 and abs(raw[i + 2] - 180) < 40
    )


def round_ticks(svg: str) -> list[float]:
    """A chart's y-axis ticks, checked to sit on a 1-2-5 step (the labels right-aligned left of the plot)."""
    labels = re.findall(r'text-anchor="end"[^>]*>([^<]+)</text>', svg)
    ticks = [float(x) for x in labels]
    steps = {round(b - a, 12) for a, b in zip(ticks, ticks[1:])}
    assert len(steps) == 1, labels
    step = steps.pop()
    mantissa = step / 10 ** math.floor(math.log10(step) + 1e-9)
    assert round(mantissa, 6) in (1, 2, 2.5, 5), labels
    assert all(abs(t / step - round(t / step)) < 1e-6 for t in ticks), labels
    return ticks


def test_report_is_self_contained_and_chromium_draws_its_curves(world):
    pytest.importorskip("PIL", reason="Pillow comes with the notebook extra")
    world.wait_done()
    out = world.tmp / "report.html"
    r = world.cli("report", world.run_id, "--out", str(out))
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    assert "<script" not in page and not re.search(r"""(src|href)=["']?https?:""", page), "the report fetches something"
    for what in (
        "training loss",
        "held-out loss: before and after training",
        "Eval before and after",
        "Cost",
        "Timeline",
        "training began",
        "checkpoint saved",
        "&quot;report_to&quot;",
        "tensorboard",
    ):
        assert what in page, what
    # Charts a person would publish: round ticks, never below 0 for a loss or a learning rate, never
    # above 1 for a score; eval before/after as paired bars, not a line over steps; no empty header row.
    svgs = dict(re.findall(r'<svg[^>]*aria-label="([^"]+)"[^>]*>(.*?)</svg>', page, re.S))
    for title in ("training loss", "learning rate", "held-out loss: before and after training"):
        assert round_ticks(svgs[title])[0] >= 0, title
    score = round_ticks(svgs["held-out score: before and after training"])
    assert score[0] >= 0 and score[-1] <= 1
    for title in ("held-out loss: before and after training", "held-out score: before and after training"):
        assert svgs[title].count('class="bar"') == 2 and "<polyline" not in svgs[title], title
    assert "<th></th>" not in page and "<tr></tr>" not in page
    # The screenshot is kept: under $AUTOSLM_TEST_ARTIFACTS when set (to look at it), else the test's tmp dir.
    keep = Path(os.environ.get("AUTOSLM_TEST_ARTIFACTS") or world.tmp)
    keep.mkdir(parents=True, exist_ok=True)
    shot = screenshot(out, keep / "report.png")
    # Control: the same page with the curves taken out. The check must tell the two apart.
    bare = world.tmp / "bare.html"
    bare.write_text(re.sub(r"<polyline[^>]*/>", "", page))
    drawn, control = curve_pixels(shot), curve_pixels(screenshot(bare, world.tmp / "bare.png"))
    assert drawn > control + 1000, (drawn, control)


GRPO_SPEC = """# autoslm launch {path}
name = "views-grpo"
model = "autoslm/tiny"
seed = 1
[environment]
id = "autoslm/arith"
params = {{ n_train = 256, n_eval = 32, max_operand = 9 }}
[train]
method = "grpo"
init_from_adapter = "{sft}"
max_steps = 10
prompts_per_step = 4
group_size = 4
learning_rate = 1e-3
temperature = 1.0
max_completion_tokens = 8
max_length = 64
save_every = 100
lora_rank = 8
eval_samples = 32
[artifacts]
path = "{store}"
"""


def pixels_apart(a: Path, b: Path) -> int:
    """How many pixels two screenshots differ in."""
    from PIL import Image, ImageChops

    diff = ImageChops.difference(Image.open(a).convert("RGB"), Image.open(b).convert("RGB")).convert("L")
    return sum(1 for v in diff.tobytes() if v > 8)


def test_a_grpo_report_shows_greedy_and_sampled_scores_smoothed_curves_and_tokens_per_second(world):
    """What GRPO raised is on the page: the sampled score beside the greedy one, before and after; every
    noisy curve smoothed over its faint raw series; the throughput, trained and generated."""
    pytest.importorskip("PIL", reason="Pillow comes with the notebook extra")
    spec = world.tmp / "views-grpo.toml"
    world.wait_done()  # GRPO continues the module's SFT run: rewards that move, as in the quickstart
    spec.write_text(GRPO_SPEC.format(path=spec, store=world.store, sft=world.run_id))
    r = world.cli("launch", str(spec), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_id = next(line.split()[1] for line in r.stdout.splitlines() if line.startswith("run ") and "launched" in line)
    events = [json.loads(x) for x in (world.store / "grpo" / run_id / "seed1" / "events.jsonl").read_text().splitlines()]
    steps = [e["data"] for e in events if e["kind"] == "step" and "reward" in e["data"]]
    assert steps and all(d["trained_tokens_per_s"] > 0 and d["generated_tokens_per_s"] > 0 for d in steps), steps[-1]
    assert all(d["generated_tokens_per_s"] < d["trained_tokens_per_s"] for d in steps)  # completions < prompt + completion
    # watch of the finished run: the throughput says which tokens it counts (it said "tokens/s -" for GRPO).
    w = world.cli("watch", run_id)
    assert w.returncode == 0 and re.search(r"tokens/s [\d,]+ trained, [\d,]+ generated", w.stdout), w.stdout

    out = world.tmp / "grpo-report.html"
    r = world.cli("report", run_id, "--out", str(out))
    assert r.returncode == 0, r.stderr
    page = out.read_text()
    svgs = dict(re.findall(r'<svg[^>]*aria-label="([^"]+)"[^>]*>(.*?)</svg>', page, re.S))
    scores = svgs["held-out score: before and after training"]
    evals = {e["data"]["when"]: e["data"] for e in events if e["kind"] == "eval"}
    # A pair of bars per measure: greedy, sampled, and pass@k where the run's validation drew k samples.
    passes = sorted(k for k in evals["after"] if k.startswith("pass@"))
    assert ">greedy<" in scores and ">sampled (T 1)<" in scores and all(f">{k}<" in scores for k in passes), scores
    assert scores.count('class="bar"') == 2 * (2 + len(passes)), scores
    for when in ("before", "after"):  # the bars are the run's own numbers
        for key in ("score", "score_sampled", *passes):
            assert f">{evals[when][key]:.3g}<" in scores, (when, key)
    for title in ("mean reward", "training loss", "KL", "reward std"):
        if title in svgs:
            assert "smoothed: EMA 0.6 (faint: raw)" in svgs[title] and 'class="raw"' in svgs[title], title
    assert 'class="raw"' in svgs["mean reward"]
    assert ">trained<" in svgs["tokens per second"] and ">generated<" in svgs["tokens per second"]
    assert re.search(r"tokens/s \(last logged\)</th><td>[\d,]+ trained, [\d,]+ generated", page)

    keep = Path(os.environ.get("AUTOSLM_TEST_ARTIFACTS") or world.tmp)
    keep.mkdir(parents=True, exist_ok=True)
    tall = 4000  # the whole page: GRPO's diagnostics come before the before/after bars
    shot = screenshot(out, keep / "grpo-report.png", tall)
    # Controls: the page without its raw series, and without its bars. The checks must tell them apart.
    no_raw = world.tmp / "grpo-no-raw.html"
    no_raw.write_text(re.sub(r'<polyline class="raw"[^>]*/>', "", page))
    faint = pixels_apart(shot, screenshot(no_raw, world.tmp / "grpo-no-raw.png", tall))
    assert faint > 300, faint  # the raw series show, apart from their smoothed lines
    no_bars = world.tmp / "grpo-no-bars.html"
    no_bars.write_text(re.sub(r'<rect class="bar"[^>]*/>', "", page))
    bars, bars_control = curve_pixels(shot), curve_pixels(screenshot(no_bars, world.tmp / "grpo-no-bars.png", tall))
    assert bars > bars_control + 500, (bars, bars_control)  # the "after" bars, in the first series' colour


def test_push_adapter_and_merged_weights_with_a_model_card(world):
    world.wait_done()
    with FakeHub(token=FAKE_HUB_TOKEN) as hub:
        env = hub.env()
        r = world.cli("push", world.run_id, "--to", "alice/views-sft", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "alice/views-sft" in r.stdout
        files = hub.files("alice/views-sft", "model")
        assert {"adapter_config.json", "adapter_model.safetensors", "README.md", "training_curve.png"} <= set(files)
        card = files["README.md"].decode()
        assert card.startswith('---\nbase_model: "autoslm/tiny"\nbase_model_relation: adapter\nlibrary_name: peft\n')
        for what in (
            'tags:\n- "autoslm"',
            "## Hyperparameters",
            "| learning_rate | 0.003 |",
            "## Final metrics",
            "eval_loss_after",
            "![training curve](training_curve.png)",
            "PeftModel.from_pretrained",
            "enable_lora=True",
            "autoslm/arith",
        ):
            assert what in card, what
        assert files["training_curve.png"][:8] == b"\x89PNG\r\n\x1a\n"
        assert not hub.repo("alice/views-sft", "model").private

        r = world.cli("push", world.run_id[:10], "--to", "alice/views-merged", "--merge", "--private", env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        merged = hub.files("alice/views-merged", "model")
        assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= set(merged), sorted(merged)
        assert "adapter_config.json" not in merged
        assert "library_name: transformers" in merged["README.md"].decode()
        assert hub.repo("alice/views-merged", "model").private
        assert all(FAKE_HUB_TOKEN.encode() not in b for f in (files, merged) for b in f.values())

        bad = world.cli("push", world.run_id, "--to", "not-a-repo", env=env)
        assert bad.returncode == 2 and "owner/name" in bad.stderr
