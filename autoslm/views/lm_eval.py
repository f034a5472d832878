"""`autoslm eval RUN --lm-eval TASK`: lm-evaluation-harness on a run's base model and adapter, on this
machine, its scores written into the run's metrics.json (``lm_eval``) beside the training prompt's.

Light like ``autoslm.views.chat`` (no torch here): it checks the tasks (one line for an unknown task or
a missing task file), fetches the adapter as `chat` does, builds the built-in model when the run used
it, and runs the engine's harness (engine/harness.py, lm-eval's ``hf`` model: transformers with the
adapter through ``peft=``) as a process. `status`, `report` and `push`'s model card then show the scores.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer

from autoslm.errors import UsageError
from autoslm.recipes.harness import LM_EVAL_VERSION, gen_tokens, is_task_file, metric_lines


def checked_tasks(tasks: list[str], cwd: Path | None = None) -> list[str]:
    """The tasks with task files made absolute; an unknown task or a missing file is one UsageError."""
    from autoslm.envs.lm_tasks import task_issues

    if not tasks:
        raise UsageError("--lm-eval: name at least one task (e.g. --lm-eval gsm8k) or a task YAML file")
    if importlib.util.find_spec("lm_eval") is None:
        raise UsageError(
            "autoslm eval runs lm-evaluation-harness here, and lm-eval is not installed",
            hint=f"pip install 'autoslm[worker]' (it pins lm-eval=={LM_EVAL_VERSION})",
        )
    base = cwd or Path.cwd()
    out = [str((base / Path(t).expanduser()).resolve()) if is_task_file(t) else t for t in tasks]
    for field, message in task_issues(out):
        raise UsageError(f"--lm-eval {tasks[int(field.rsplit('.', 1)[-1])]}: {message}")
    return out


class _Train:
    def __init__(self, train: dict):
        self.max_completion_tokens = train.get("max_completion_tokens") if train.get("method") == "grpo" else 0


def merged(old: dict | None, new: dict) -> dict:
    """A later harness run's block over an earlier one: tasks scored again are replaced, others kept
    (what the earlier one said of itself -- still running, cut, failed -- is not said of the merge)."""
    if not old or old.get("error") or old.get("version") != new.get("version"):
        return new
    old = {k: v for k, v in old.items() if k not in ("state", "cut", "errors", "error")}
    out = {**old, **{k: v for k, v in new.items() if k != "models"}}
    out["models"] = {m: {**(old.get("models") or {}).get(m, {}), **tasks} for m, tasks in (new.get("models") or {}).items()}
    out["tasks"] = list(dict.fromkeys(list(old.get("tasks") or []) + list(new.get("tasks") or [])))
    return out


def eval_command(
    client, ref: str, tasks: list[str], *, shots: int | None = None, limit: int | None = None, device: str = "cpu", log=None
) -> dict:
    """Score ``ref``'s base model and adapter; returns the ``lm_eval`` block it wrote into metrics.json."""
    from autoslm.views.chat import find_target, require_worker_extra
    from autoslm.views.chat_model import resolve_model
    from autoslm.views.runview import artifacts_of, collect

    log = log or (lambda m: sys.stderr.write(m + "\n"))
    tasks = checked_tasks(tasks)
    require_worker_extra()
    with tempfile.TemporaryDirectory(prefix="autoslm-lmeval-") as tmp:
        work = Path(tmp)
        target = find_target(client, ref, work)
        spec = collect(client, ref, tick=False).spec or {}
        train = spec.get("train") or {}
        req = {
            "model": resolve_model(target.model, client.home),
            "adapter": str(target.adapter),
            "tasks": tasks,
            "backend": "hf",
            "device": device,
            "shots": shots,
            "limit": limit,
            "thinking": target.thinking,
            "lora_rank": int(train.get("lora_rank") or 16),
            "max_gen_toks": gen_tokens(_Train(train)),
            "seed": int(spec.get("seed") or 0),
        }
        (work / "request.json").write_text(json.dumps(req))
        out = work / "result.json"
        log(f"lm-eval {LM_EVAL_VERSION} on {target.model} and run {target.run_id}'s adapter: {', '.join(tasks)}")
        p = subprocess.run(
            [sys.executable, "-m", "autoslm.engine.harness", str(work / "request.json"), str(out)],
            capture_output=True,
            text=True,
            env=dict(os.environ),
        )
        if p.returncode != 0 or not out.is_file():
            tail = [line for line in (p.stderr or p.stdout).strip().splitlines() if line.strip()][-1:]
            raise UsageError(
                f"lm-eval failed on run {target.run_id}: {tail[0] if tail else p.returncode}",
                hint="AUTOSLM_DEBUG=1 shows its output" if not os.environ.get("AUTOSLM_DEBUG") else None,
            )
        block = json.loads(out.read_text())
    block["where"] = "here"
    _, arts = artifacts_of(client, ref)
    art = arts[0]
    metrics = art.get_metrics() or {}
    metrics["lm_eval"] = merged(metrics.get("lm_eval"), block)
    metrics["lm_eval_time_s"] = (
        round(float(metrics.get("lm_eval_time_s") or 0) + float(block.get("seconds") or 0), 2)
        if metrics["lm_eval"] is not block
        else block.get("seconds")
    )
    art.put_metrics(metrics)
    for line in metric_lines(metrics["lm_eval"]):
        log(line)
    return metrics["lm_eval"]


def register(app: typer.Typer, client_factory, console_factory) -> None:
    """The `autoslm eval` command."""

    @app.command("eval")
    def eval_(
        run: Annotated[
            str, typer.Argument(help="run id, any unique prefix of it, or hf://owner/repo/<phase>/<run_id>", show_default=False)
        ],
        lm_eval: Annotated[
            list[str],
            typer.Option(
                "--lm-eval", help="an lm-eval task name (gsm8k) or a task YAML file; repeat for more", show_default=False
            ),
        ],
        shots: Annotated[
            Optional[int], typer.Option("--shots", min=0, help="few-shot examples (default: each task's own)")
        ] = None,
        limit: Annotated[
            Optional[int], typer.Option("--limit", min=1, help="score only the first N samples of each task")
        ] = None,
        device: Annotated[str, typer.Option("--device", help="cpu, cuda or mps")] = "cpu",
    ):
        """Score a run's base model and adapter with lm-evaluation-harness here; the scores join its metrics."""
        eval_command(
            client_factory(),
            run,
            lm_eval,
            shots=shots,
            limit=limit,
            device=device,
            log=lambda m: console_factory().print(m, markup=False, soft_wrap=True),
        )
