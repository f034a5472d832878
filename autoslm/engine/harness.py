"""lm-evaluation-harness on the base model and on the adapter: ``[eval] lm_eval`` after training on the
pod (engine/pod/lm_eval_phase.py) and ``autoslm eval RUN --lm-eval TASK`` on this machine.

It runs as its own process, ``python -m autoslm.engine.harness REQUEST.json OUT.json``: on a GPU pod
lm-eval's ``vllm`` model starts its own engine in a fresh CUDA context once the trainer's memory is
given back; elsewhere lm-eval's ``hf`` model (transformers, the adapter through ``peft=``). The model
arguments come from autoslm/recipes/harness.py (``max_lora_rank``, ``max_gen_toks``, ``enable_thinking``
always set). The request's ``models`` says which of "base" and "adapter" it scores (both, in that
order, by default): the worker starts one process per model, so each engine has the GPU to itself and a
failure of one keeps the other's scores. OUT.json is metrics.json's ``lm_eval`` block for them: lm-eval's
version, the backend and its arguments, the seconds, and per model and task every metric lm-eval
reports with its standard error, the task's version, shots and sample count.

The process dies with the one that started it (a worker killed at its pod's end leaves no engine
holding the GPU), and it must not be given a training rank's environment (engine/pod/lm_eval_phase.py
``harness_env``): lm-eval's ``hf`` model would wait for ranks that never come.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from autoslm.recipes.harness import args_string, hf_model_args, is_task_file, vllm_model_args
from autoslm.store.atomic import write_atomic

HF_BATCH = 8


def model_args(req: dict, adapter: str | None) -> dict:
    if req["backend"] == "vllm":
        return vllm_model_args(
            req["model"],
            adapter,
            lora_rank=req["lora_rank"],
            max_gen_toks=req["max_gen_toks"],
            max_model_len=req["max_model_len"],
            thinking=req["thinking"],
            gpu_memory_utilization=req.get("gpu_memory_utilization", 0.85),
            seed=req.get("seed", 0),
        )
    return hf_model_args(req["model"], adapter, thinking=req["thinking"], device=req.get("device", "cpu"))


def task_manager(tasks: list[str]):
    """lm-eval's task list; without its own (seconds to index) when every task is a YAML file."""
    from lm_eval.tasks import TaskManager

    files = [t for t in tasks if is_task_file(t)]
    include = sorted({str(Path(f).parent) for f in files}) or None
    return TaskManager(include_path=include, include_defaults=len(files) < len(tasks))


def scores(results: dict) -> dict:
    """Per task: every metric (and its standard error), the task's version, shots and samples."""
    out = {}
    for task, res in (results.get("results") or {}).items():
        metrics = {
            k: v
            for k, v in res.items()
            if k not in ("alias", "sample_len") and "_stderr," not in k and isinstance(v, (int, float))
        }
        stderr = {k.replace("_stderr,", ","): v for k, v in res.items() if "_stderr," in k and isinstance(v, (int, float))}
        n = (results.get("n-samples") or {}).get(task) or {}
        out[task] = {
            "version": (results.get("versions") or {}).get(task),
            "shots": (results.get("n-shot") or {}).get(task),
            "samples": n.get("effective", n.get("original")),
            "metrics": metrics,
            "stderr": stderr,
        }
    return out


def evaluate_one(req: dict, adapter: str | None, manager) -> dict:
    from lm_eval import simple_evaluate

    args = model_args(req, adapter)
    results = simple_evaluate(
        model=req["backend"],
        model_args=args,
        tasks=list(req["tasks"]),
        num_fewshot=req.get("shots"),
        limit=req.get("limit"),
        batch_size="auto" if req["backend"] == "vllm" else HF_BATCH,
        task_manager=manager,
        log_samples=False,
        random_seed=req.get("seed", 0),
        bootstrap_iters=req.get("bootstrap_iters", 1000),
        gen_kwargs=None if req["backend"] == "vllm" else {"max_gen_toks": req["max_gen_toks"]},
    )
    return scores(results or {})


def targets(req: dict) -> list[tuple[str, str | None]]:
    """(name, adapter path or None) of the models ``req`` scores, in order: ``req["models"]``, else the
    base and (when ``req["adapter"]``) the adapter."""
    names = req.get("models") or (["base", "adapter"] if req.get("adapter") else ["base"])
    return [(name, req["adapter"] if name == "adapter" else None) for name in names]


def run(req: dict, log=print) -> dict:
    """The ``lm_eval`` block for ``req``: each of its models (``targets``), one after the other."""
    import lm_eval

    t0 = time.time()
    manager = task_manager(list(req["tasks"]))
    block = {
        "version": getattr(lm_eval, "__version__", "?"),
        "backend": req["backend"],
        "tasks": list(req["tasks"]),
        "model_args": args_string(model_args(req, req.get("adapter"))),
        "models": {},
    }
    for name, adapter in targets(req):
        log(f"lm-eval: {name} ({req['backend']}) on {', '.join(req['tasks'])}")
        t = time.time()
        block["models"][name] = evaluate_one(req, adapter, manager)
        block.setdefault("model_seconds", {})[name] = round(time.time() - t, 2)
    block["seconds"] = round(time.time() - t0, 2)
    return block


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        sys.stderr.write("usage: python -m autoslm.engine.harness REQUEST.json OUT.json\n")
        return 2
    from autoslm.engine.distributed import die_with_launcher

    die_with_launcher()
    from autoslm.engine.gc_pause import collector_paused
    from autoslm.engine.unused_imports import import_stack_without_unused

    # lm-eval's imports as a worker's start makes them: the collector paused (engine/gc_pause.py), transformers
    # without scikit-learn and SciPy (engine/unused_imports.py; a task's metric that needs them imports them
    # as ever), peft's bitsandbytes without torch's compiler where there is no CUDA.
    with collector_paused():
        import_stack_without_unused()
        import lm_eval.evaluator  # noqa: F401 - simple_evaluate's module, imported here to be imported paused
    req = json.loads(Path(argv[0]).read_text())
    block = run(req, log=lambda m: print(m, flush=True))
    write_atomic(Path(argv[1]), json.dumps(block, indent=2).encode())  # the caller reads it whole, or not at all
    return 0


if __name__ == "__main__":
    sys.exit(main())
