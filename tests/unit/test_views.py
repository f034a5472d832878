"""The pieces behind watch, report, push and the notebook frames, on hand-made events (no training)."""

from __future__ import annotations

import math
import re
import struct
import zlib
from dataclasses import replace

import pytest

from autoslm.controller.seed_metrics import SeedMetrics
from autoslm.controller.state import EndReason, RunState
from autoslm.errors import SpecError
from autoslm.spec import validate_dict
from autoslm.views import runview
from autoslm.views.commands import unique_prefixes
from autoslm.views.report import render_html
from autoslm.views.report.charts import nice_axis, png_chart, svg_bars, svg_chart, tick_label
from autoslm.views.runview import RunData
from tests.fakes.statuses import run_status, seed_status

TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUvWx"


def step(t, s, seed=0, **data):
    return {"time": t, "kind": "step", "step": s, "seed": seed, "data": data}


def grpo_events() -> list[dict]:
    ev = [
        {"time": 0.0, "kind": "worker_start", "step": 0, "seed": 0, "data": {"attempt": 1, "host": "h"}},
        {"time": 1.0, "kind": "eval", "step": 0, "seed": 0, "data": {"when": "before", "loss": 2.0, "score": 0.1, "n": 8}},
    ]
    ev += [
        step(2.0 + i, i, loss=1.0 / i, reward=0.1 * i, reward_std=0.2, kl=0.01 * i, train_tokens_per_second=100.0)
        for i in range(1, 7)
    ]
    ev += [
        {"time": 9.0, "kind": "error", "step": 6, "seed": 0, "data": {"message": f"lost the pod ({TOKEN})", "retryable": True}},
        {"time": 10.0, "kind": "worker_start", "step": 0, "seed": 0, "data": {"attempt": 2, "host": "h2"}},
        {"time": 11.0, "kind": "resume", "step": 4, "seed": 0, "data": {"from_step": 4}},
    ]
    ev += [step(12.0 + i, i, loss=0.9 / i, reward=0.12 * i) for i in (5, 6, 7, 8)]
    ev += [
        {
            "time": 20.0,
            "kind": "rollout",
            "step": 8,
            "seed": 0,
            "data": {"samples": [{"completion": "<script>alert(1)</script> 4+4=8", "rewards": {"correct": 1.0}}]},
        },
        {"time": 21.0, "kind": "eval", "step": 8, "seed": 0, "data": {"when": "after", "loss": 1.0, "score": 0.6, "n": 8}},
    ]
    return ev


def data(events=None) -> RunData:
    spec = {
        "name": "g",
        "model": "Qwen/Qwen3-0.6B",
        "environment": {"id": "hf:alice/math", "params": {}},
        "train": {"method": "grpo", "learning_rate": 1e-5, "lora_rank": 16, "max_steps": 8},
        "seed": 0,
    }
    status = run_status(
        run_id="g-20261130-000000-abcd",
        state="succeeded",
        phase="grpo",
        step=8,
        total_steps=8,
        cost_usd=0.42,
        store="file:///x",
        seeds=[{"seed": 0, "cost_usd": 0.42, "provider": "vast", "gpu": "RTX 4090", "restarts": 1, "attempt": 2}],
    )
    metrics = {
        0: {
            "steps": 8,
            "final_loss": 0.11,
            "reward_first": 0.1,
            "reward_last": 0.96,
            "eval": {"before": {"loss": 2.0, "score": 0.1, "n": 8}, "after": {"loss": 1.0, "score": 0.6, "n": 8}},
        }
    }
    metrics = {seed: SeedMetrics.of(m) for seed, m in metrics.items()}
    return RunData(ref="g", status=status, spec=spec, events=events if events is not None else grpo_events(), metrics=metrics)


def test_shortest_unique_prefixes():
    ids = ["quickstart-20261130-101010-aaaa", "quickstart-20261130-101010-aabb", "quickstart-20261130-111111-cccc", "grpo-1"]
    p = unique_prefixes(ids)
    assert p["quickstart-20261130-101010-aaaa"] == "quickstart-20261130-101010-aaa"
    assert p["quickstart-20261130-111111-cccc"] == "quickstart-20261130-11"
    assert p["grpo-1"] == "grpo"
    for rid, pre in p.items():
        assert [i for i in ids if i.startswith(pre)] == [rid]


def test_rows_timeline_and_restarts_from_events():
    ev = grpo_events()
    rows = runview.train_rows(ev)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 8]  # steps 5-6 ran twice: the resumed ones win
    assert rows[4]["loss"] == pytest.approx(0.9 / 5) and rows[0]["tokens_per_s"] == 100.0
    assert [(r["when"], r["eval_loss"]) for r in runview.eval_rows(ev)] == [("before", 2.0), ("after", 1.0)]
    key, pts = runview.main_curve(rows)
    assert key == "reward" and pts[-1] == (8, pytest.approx(0.96))
    (restart,) = runview.restarts(ev)
    assert restart["attempt"] == 2 and "lost the pod" in restart["reason"]
    kinds = [t["kind"] for t in runview.timeline(ev)]
    assert kinds == ["worker_start", "eval", "error", "worker_start", "resume", "eval"]
    assert runview.sparkline([1, 2, 3, 4]) == "▁▃▆█" and runview.sparkline([]) == ""
    assert len(runview.sparkline(list(range(100)), width=20)) == 20


def test_report_html_has_curves_rollouts_timeline_cost_and_no_secret():
    page = render_html(data())
    assert len(re.findall(r"<polyline", page)) >= 4  # loss, reward, KL, learning-rate-less: at least these
    for what in (
        "training loss",
        "mean reward",
        "held-out score: before and after training",
        "Sample rollouts",
        "resumed from the checkpoint at step 4",
        "$0.4200",
        "RTX 4090",
        "Eval before and after",
        "&quot;hf:alice/math&quot;",
    ):
        assert what in page, what
    assert "<script>" not in page and "&lt;script&gt;alert(1)" in page
    assert TOKEN not in page
    assert not re.search(r"""(src|href)=["']?https?:""", page)


def ticks_of(svg: str) -> list[str]:
    """The y-axis tick labels of a chart (right-aligned texts left of the plot)."""
    return re.findall(r'text-anchor="end"[^>]*>([^<]+)</text>', svg)


def test_ticks_are_round_and_never_past_what_the_data_can_take():
    for lo, hi, floor, ceil, want in [
        (0.0161, 8.23, None, None, ["0", "2", "4", "6", "8", "10"]),  # not 8.23, 6.17, -0.0161
        (75.5, 299, 0.0, None, ["50", "100", "150", "200", "250", "300"]),
        (-0.00015, 3e-3, 0.0, None, ["0", "0.001", "0.002", "0.003"]),  # a learning rate is never below 0
        (0, 2e-5, 0.0, None, ["0", "5e-6", "1e-5", "1.5e-5", "2e-5"]),
        (-0.042, 0.93, 0.0, 1.0, ["0", "0.2", "0.4", "0.6", "0.8", "1.0"]),  # a score lies in [0, 1]
        (0, 0.25, None, None, ["0", "0.05", "0.10", "0.15", "0.20", "0.25"]),
    ]:
        a, b, ticks = nice_axis(lo, hi, floor=floor, ceil=ceil)
        step = ticks[1] - ticks[0]
        assert [tick_label(t, step) for t in ticks] == want, (lo, hi)
        mant = step / 10 ** math.floor(math.log10(step) + 1e-9)
        assert round(mant, 6) in (1, 2, 2.5, 5)
    lr = svg_chart({"seed0": [(1, 3e-4), (150, 1.5e-4), (300, 0.0)]}, title="learning rate", y_floor=0.0)
    assert ticks_of(lr)[0] == "0" and not any(t.startswith("-") for t in ticks_of(lr))


def test_before_after_bars_and_seeds_under_their_mean():
    bars = svg_bars({"seed0": (0.1, 0.84), "seed1": (0.05, 0.64)}, title="held-out score", y_ceil=1.0)
    assert bars.count('class="bar"') == 4 and "before" in bars and "after" in bars and "<polyline" not in bars
    assert ticks_of(bars)[-1] == "1.0" and "0.84" in bars
    two = svg_chart({"seed0": [(1, 2.0), (2, 1.0)], "seed1": [(1, 3.0), (2, 2.0)]}, title="loss", y_floor=0.0)
    assert two.count("<polyline") == 3 and ">mean<" in two
    assert re.search(r'stroke="#222222" stroke-width="2.5"', two)  # the mean is the bold one
    page = render_html(data())
    assert "<th></th>" not in page and "<tr></tr>" not in page  # no empty header row


def test_svg_and_png_charts():
    svg = svg_chart({"a": [(0, 1.0), (1, 0.5), (2, 0.25)]}, title="t")
    assert svg.startswith("<svg") and "<polyline" in svg
    png = png_chart({"a": [(0, 1.0), (1, 0.5), (2, 0.25)]}, width=200, height=100)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", png[16:24])
    assert (w, h) == (200, 100)
    idat = png[png.index(b"IDAT") + 4 : png.index(b"IEND") - 8]
    raw = zlib.decompress(idat)
    assert len(raw) == h * (1 + 3 * w)
    blue = sum(1 for i in range(0, len(raw) - 2) if raw[i : i + 3] == bytes((0x1F, 0x77, 0xB4)))
    assert blue > 150  # the curve was drawn


def test_model_card_metadata_and_usage():
    yaml = pytest.importorskip("yaml")
    from autoslm.views.push import model_card

    card = model_card(data(), "alice/g-grpo", merged=False, image="training_curve.png")
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["base_model"] == "Qwen/Qwen3-0.6B" and meta["library_name"] == "peft"
    assert {"autoslm", "grpo", "peft"} <= set(meta["tags"]) and meta["datasets"] == ["alice/math"]
    for what in (
        "| learning_rate | 1e-05 |",
        "| eval_score_after | 0.6 |",
        "| reward_last | 0.96 |",
        'PeftModel.from_pretrained(base, "alice/g-grpo")',
        "enable_lora=True, max_lora_rank=16",
        "![training curve](training_curve.png)",
    ):
        assert what in card, what
    assert meta["base_model_relation"] == "adapter"
    merged = model_card(data(), "alice/g", merged=True, image=None)
    assert "library_name: transformers" in merged and 'LLM(model="alice/g")' in merged
    assert yaml.safe_load(merged.split("---\n")[1])["base_model_relation"] == "merge"
    gguf = model_card(data(), "alice/g-gguf", merged=False, image=None, gguf="q4_k_m")
    meta = yaml.safe_load(gguf.split("---\n")[1])
    assert meta["base_model"] == "Qwen/Qwen3-0.6B" and meta["base_model_relation"] == "quantized"
    assert meta["library_name"] == "gguf" and {"gguf", "q4_k_m"} <= set(meta["tags"]) and "peft" not in meta["tags"]
    assert "ollama create g-gguf -f Modelfile" in gguf and "--hf-file model-q4_k_m.gguf" in gguf
    assert "PeftModel" not in gguf
    # vLLM takes only some ranks as max_lora_rank (1, 8, 16, 32, ...): a rank-24 adapter's card says 32,
    # and one above 512, which vLLM cannot load as a LoRA, points at a merged push instead of a snippet.
    d = data()
    d.spec["train"]["lora_rank"] = 24
    assert "enable_lora=True, max_lora_rank=32)" in model_card(d, "alice/g-grpo", merged=False, image=None)
    d.spec["train"]["lora_rank"] = 1024
    card = model_card(d, "alice/g-grpo", merged=False, image=None)
    assert "enable_lora" not in card and "LoRA ranks up to 512, and this adapter's is 1024" in card
    assert 'LLM(model="alice/g")' in model_card(d, "alice/g", merged=True, image=None)


def test_trackers_keys_go_to_the_pod_by_name_and_are_redacted(tmp_path, monkeypatch):
    from autoslm.controller.registry import Registry, RunRecord
    from autoslm.controller.supervisor import Supervisor
    from autoslm.secrets import redact

    key = "wandb-key-0123456789abcdef"
    monkeypatch.setenv("WANDB_API_KEY", key)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "mlflow-token-0123456789")
    spec = validate_dict(
        {"name": "t", "model": "autoslm/tiny", "environment": {"id": "autoslm/arith"}, "train": {"report_to": ["wandb"]}}
    )
    run = RunRecord("t-1", "t", "sft", spec.to_json(), None, "file:///x", 0.0, 3600.0)
    sup = Supervisor(Registry(tmp_path), providers=None, store=None, home=tmp_path)
    env = sup.pod_request(run, 0, 1).env
    assert env["WANDB_API_KEY"] == key and "MLFLOW_TRACKING_TOKEN" not in env  # only the trackers asked for
    assert key not in run.spec_json
    assert redact(f"wandb login {key}") == "wandb login ***"
    assert "***" in redact("token mlflow-token-0123456789")
    with pytest.raises(SpecError, match="train.report_to"):
        validate_dict(
            {"name": "t", "model": "autoslm/tiny", "environment": {"id": "autoslm/arith"}, "train": {"report_to": ["comet"]}}
        )


def test_metrics_frame_one_row_per_step_plus_eval_rows():
    pytest.importorskip("pandas")
    from autoslm.views.notebook import LEAD, metrics_frame

    df = metrics_frame(grpo_events())
    assert list(df.columns[: len(LEAD)]) == LEAD
    train, evals = df[df.kind == "train"], df[df.kind == "eval"]
    assert list(train.step) == list(range(1, 9)) and train.reward.notna().all()
    assert list(evals.when) == ["before", "after"] and list(evals.eval_score) == [0.1, 0.6]


def test_report_and_status_say_which_step_the_adapter_is_from_and_why_training_stopped():
    from autoslm.views.result import validation_lines

    d = data()
    doc = d.metrics[0].document
    doc["eval"].update(after_step=4, note="keep_best: the adapter of the best evaluation, step 4 (score 0.6), is handed back")
    doc.update(
        stop_reason="eval.stop_at reached at step 6: score 0.6 >= 0.5",
        validation={"metric": "score", "keep_best": True, "evaluations": []},
    )
    d.metrics[0] = SeedMetrics.of(doc)
    page = render_html(d)
    assert "stopped early: eval.stop_at reached at step 6" in page and "best evaluation, step 4" in page
    assert validation_lines(d.metrics[0]) == [
        "stopped early: eval.stop_at reached at step 6: score 0.6 >= 0.5",
        doc["eval"]["note"],
    ]
    plain = {"eval": {"after_step": 8}, "validation": {"metric": "score", "keep_best": True, "best": {"step": 8}}}
    assert validation_lines(SeedMetrics.of(plain)) == ["adapter: step 8, the best evaluation by score"]
    assert validation_lines(SeedMetrics.of({**plain, "validation": {**plain["validation"], "best": {"step": 4}}})) == []
    assert validation_lines(SeedMetrics.of({"eval": {"after_step": 8}})) == []


def svgs_of(page: str) -> dict[str, str]:
    return dict(re.findall(r'<svg[^>]*aria-label="([^"]+)"[^>]*>(.*?)</svg>', page, re.S))


def test_grpo_scores_greedy_sampled_and_pass_at_k_side_by_side():
    ev = grpo_events()
    ev[1]["data"].update(score_sampled=0.07, **{"pass@4": 0.2})
    ev[-1]["data"].update(score_sampled=0.26, **{"pass@4": 0.5})
    d = data(ev)
    d.spec["train"]["temperature"] = 1.0
    scores = svgs_of(render_html(d))["held-out score: before and after training"]
    assert scores.count('class="bar"') == 6 and "<polyline" not in scores
    labels = re.findall(r'text-anchor="middle"[^>]*>([^<]+)</text>', scores)
    assert ["greedy", "sampled (T 1)", "pass@4"] == [x for x in labels if not x[0].isdigit()]
    for value in ("0.1", "0.6", "0.07", "0.26", "0.2", "0.5"):  # each bar labelled with its value
        assert f">{value}<" in scores, value
    # A run without the sampled score (SFT) keeps its one pair of bars.
    sft = svgs_of(render_html(data()))["held-out score: before and after training"]
    assert sft.count('class="bar"') == 2 and ">greedy<" in sft


def test_step_series_are_smoothed_over_their_faint_raw_values_and_say_so():
    page = render_html(data())
    charts = svgs_of(page)
    for title in ("training loss", "mean reward", "KL"):
        svg = charts[title]
        assert "smoothed: EMA 0.6 (faint: raw)" in svg, title
        (raw,) = re.findall(r'<polyline class="raw"[^>]*points="([^"]+)"', svg)
        (smooth,) = re.findall(r'<polyline class="curve"[^>]*points="([^"]+)"', svg)
        assert 'class="raw" fill="none" stroke="#1f77b4" stroke-width="1.2" stroke-opacity="0.3"' in svg
        ys = [[float(p.split(",")[1]) for p in pts.split()] for pts in (raw, smooth)]
        assert ys[0][0] == ys[1][0] and ys[0] != ys[1], title  # starts at the data (debiased), then lags it
    lr = charts["learning rate"] if "learning rate" in charts else ""
    assert "smoothed" not in lr  # a schedule is drawn as it is
    from autoslm.views.report.charts import ema

    assert ema([(0, 1.0), (1, 0.0)], 0.6) == [(0, 1.0), (1, pytest.approx(0.6 * 0.4 / (1 - 0.36)))]
    assert ema([(0, 2.0), (1, 2.0), (2, 2.0)]) == [(0, 2.0), (1, pytest.approx(2.0)), (2, pytest.approx(2.0))]


def test_report_shows_the_run_s_tokens_per_second_and_says_which():
    ev = grpo_events()
    for e in ev:
        if e["kind"] == "step":
            e["data"].update(trained_tokens_per_s=800.0 + e["step"], generated_tokens_per_s=300.0)
    page = render_html(data(ev))
    assert "808 trained, 300 generated" in page
    svg = svgs_of(page)["tokens per second"]
    assert ">trained<" in svg and ">generated<" in svg and "smoothed" not in svg


def test_the_report_names_why_a_run_ended():
    d = data()
    d.status = replace(
        d.status,
        state=RunState.FAILED,
        end_reason=EndReason.MONEY_LIMIT,
        error="money limit reached: $1.25 spent, limits.max_usd is $1.00",
    )
    page = render_html(d)
    assert "end reason" in page and "money limit" in page and "limits.max_usd is $1.00" in page


def test_watch_says_a_held_out_evaluation_in_progress():
    from autoslm.views.watch import lines

    def status(stage, message):
        return run_status(
            run_id="r",
            phase="grpo",
            state="running",
            step=50,
            total_steps=350,
            seeds=[{"seed": 0, "state": "running", "stage": stage, "message": message}],
        )

    spec = {"model": "m", "train": {"method": "grpo"}}
    evaluating = lines(RunData("r", status("training", "evaluating (during): 640/6595"), spec, grpo_events()))
    assert "stage training (evaluating (during): 640/6595)" in evaluating[0]
    assert "(" not in lines(RunData("r", status("training", None), spec, grpo_events()))[0].split("stage")[1]


def test_status_says_a_seed_is_evaluating_with_its_progress_not_saving():
    from autoslm.views.runview import seed_lines

    seed = dict(
        seed=0,
        state="running",
        step=116,
        total_steps=116,
        stage="saving",
        pod_id="p1",
        restarts=0,
        last_heartbeat_age_s=3.0,
        message="evaluating (after): 640/1319",
    )
    (line,) = seed_lines(seed_status(**seed), live=True)
    assert "stage evaluating (after) 640/1319 pod p1" in line and "saving" not in line
    during = seed_lines(
        seed_status(**{**seed, "step": 29, "stage": "training", "message": "evaluating (during): 64/1319"}), live=True
    )
    assert len(during) == 1 and "stage evaluating (during) 64/1319" in during[0]
    saving = seed_lines(seed_status(**{**seed, "message": "uploading the adapter"}), live=True)
    assert "stage saving pod" in saving[0] and saving[1] == "    uploading the adapter"
    assert seed_lines(seed_status(**{**seed, "state": "succeeded", "stage": "done", "message": "done"}), live=False)[1:] == []
