"""python benchmarks/gsm8k_steps.py --steps 4 --out gsm8k.json   # on a CUDA GPU: under 7 minutes, downloads nothing

Times a few GRPO steps of jobspecs/qwen2.5-0.5b-gsm8k-grpo-gpu.toml on this GPU and prints them beside what
`autoslm plan` estimates for the same spec on the same GPU. The same code paths on a CPU, with a tiny model
and batch, as a smoke test (a minute or two; its numbers mean nothing):

    python benchmarks/gsm8k_steps.py --device cpu --quick

What runs: the jobspec as `autoslm.spec.load_spec` reads it, with two things swapped because nothing can be
downloaded: the weights are Qwen2.5-0.5B-Instruct's shape with random values (Qwen2 architecture, 24 layers,
hidden 896, vocabulary 151936, tied embeddings) and the tokenizer is the one autoslm builds for its offline
tiny model; the GSM8K rows are synthetic word problems of about 100-200 prompt tokens after the chat
template and the jobspec's own prompt_template (GSM8K's questions with that instruction are about as long),
each with a "#### <number>" answer, given as a jsonl environment with the jobspec's answer_format. Its
[train] is the jobspec's untouched (prompts per step, group size, completion length, LoRA rank, beta, loss):
the trainer is the worker's own (`engine.train.grpo.build_trainer`) with the recipe the pod would choose on
this device, stopped after --steps steps.

A random model practically never samples EOS, so every completion runs to max_completion_tokens: the
planner's worst case, which is what it estimates. Generation is transformers' generate() (no vLLM here),
so the planner's number to compare with is its estimate without vLLM (what `autoslm plan` prints for a pod
without vllm, or for train.vllm.enabled = false); its vLLM estimate is printed too, labelled not measured.

Per step: seconds, and its phases as TRL 1.16 runs them: generation (``_generate``), log-probs (the
reference model's pass for beta > 0, and the old policy's where TRL computes it), rewards and the rest of
scoring, and the update (forward, backward, optimizer); tokens generated; decode steps and seconds per
decoded token of the batch; peak GPU memory (torch's allocator). The planner's step for this GPU in the same
parts (``catalog.step_seconds``: generation per decode wave, training at 8N FLOPs a token plus 2N per extra
forward pass), its decode step, micro-batch, generation batch and peak, and measured / planned. The plan
table also has the jobspec's own GPUs as `autoslm plan` judges them at RunPod's list prices (which one it
would rent), and this GPU. The first step warms up (CUDA kernels, allocator): the summary is the median of
the later ones. --budget-s bounds the run: no step starts that would end past it, and if one runs far past
it anyway, what was measured so far is printed and written, and the process exits 3.

Needs torch, transformers, trl, peft, accelerate, datasets, tokenizers and autoslm's own dependencies
(pydantic); HF_HUB_OFFLINE=1 is set first. Writes --out (JSON) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import tomllib
import warnings
from pathlib import Path

T0 = time.monotonic()
# Before anything imports huggingface_hub: never download, print no progress bars.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repo root: autoslm
sys.path.insert(0, str(Path(__file__).resolve().parent))  # grpo_bench

from grpo_bench import Probe, Quiet  # noqa: E402 - after the path fix above

SPEC = ROOT / "jobspecs" / "qwen2.5-0.5b-gsm8k-grpo-gpu.toml"
# Qwen/Qwen2.5-0.5B-Instruct's config.json shape (random weights: nothing is downloaded).
QWEN25_05B = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=151936,
    tie_word_embeddings=True,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    use_sliding_window=False,
)
# --quick: a tiny stand-in of the same architecture, and a batch a CPU runs in seconds.
QUICK_SHAPE = dict(
    QWEN25_05B,
    hidden_size=64,
    intermediate_size=192,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=2048,
)
QUICK_TRAIN = dict(prompts_per_step=2, max_completion_tokens=16, max_length=272, lora_rank=8, lora_alpha=8)
PROMPT_TOKENS = (100, 200)  # rendered prompt length, tokens: drawn uniformly per row

NAMES = ("Natalia", "Weng", "Betty", "Julie", "James", "Albert", "Ken", "Alexis", "Tina", "Randy", "Joy", "Marco")
ITEMS = ("clips", "apples", "pages", "cookies", "marbles", "eggs", "tickets", "books", "stickers", "cupcakes")
FACTS = (
    "{n} sold {a} {i} to her friends in April, and then she sold half as many {i} in May.",
    "{n} earns ${a} an hour for babysitting, and yesterday {n} did {b} minutes of babysitting.",
    "Each box holds {a} {i}, and {n} buys {b} boxes at the market on Monday morning.",
    "{n} gives {a} {i} to each of her {b} cousins and keeps the rest for herself.",
    "One pack of {i} costs ${a}, but every third pack is sold at a discount of {b} percent.",
    "{n} reads {a} pages every day for {b} days, then twice as many pages on the weekend.",
    "A farmer has {a} hens, and each hen lays {b} eggs a week; he sells the eggs at $2 a dozen.",
    "There are {a} students in the class, and {b} of them bring {i} for the school fair.",
    "{n} walks {a} miles on Tuesday, {b} miles on Wednesday and three times that distance on Thursday.",
    "The bakery made {a} {i} in the morning and sold all but {b} of them by noon.",
)
QUESTIONS = (
    "How many {i} does {n} have left?",
    "How much money does {n} spend in all?",
    "How many {i} are there altogether?",
    "How many more {i} does {n} need?",
)


# -- the spec: the jobspec's, with local data and a local store --------------------------------------------
def measured_spec(spec_path: Path, work: Path, data: Path, *, quick: bool):
    """The jobspec through autoslm's spec loader with [environment] pointing at the synthetic rows (same
    prompt_template and answer_format), [artifacts] at a local folder and the local provider; [train] as
    it is (--quick: ``QUICK_TRAIN`` over it)."""
    from autoslm.spec import validate_dict

    raw = tomllib.loads(spec_path.read_text(encoding="utf-8"))
    env = raw["environment"]
    env_params = env.get("params", {})
    raw["environment"] = {
        "id": f"jsonl:{data}",
        "answer_format": env.get("answer_format", "gsm8k"),
        "params": {
            "columns": {"prompt": "question"},
            "eval_fraction": 0,
            **({"prompt_template": env_params["prompt_template"]} if env_params.get("prompt_template") else {}),
        },
    }
    raw["artifacts"] = {"store": "local", "path": str(work / "store")}
    raw["compute"] = {**raw.get("compute", {}), "provider": ["local"]}  # a local store needs a local run
    if quick:
        raw["train"] = {**raw["train"], **QUICK_TRAIN}
    return validate_dict(raw, str(spec_path), base_dir=spec_path.parent)


def write_rows(path: Path, tokenizer, template: str | None, n: int, seed: int = 0) -> list[int]:
    """``n`` GSM8K-like rows ({"question", "answer": "... #### N"}) whose prompt, rendered as the worker
    renders it (chat template, the jobspec's prompt_template), is PROMPT_TOKENS long; their token counts."""
    rng = random.Random(seed)

    def rendered(text: str) -> int:
        content = template.format(prompt=text) if template else text
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=True, enable_thinking=False
        )
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)

    lengths = []
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(n):
            n_, i = rng.choice(NAMES), rng.choice(ITEMS)
            words = " ".join(
                rng.choice(FACTS).format(n=n_, i=i, a=rng.randint(2, 99), b=rng.randint(2, 60)) for _ in range(40)
            ).split()
            ask = rng.choice(QUESTIONS).format(n=n_, i=i)
            target = rng.randint(*PROMPT_TOKENS)

            def text(k: int, words=words, ask=ask) -> str:  # the first k words, ended as a sentence, then the question
                return " ".join(words[:k]).rstrip(",.;") + ". " + ask

            lo, hi = 1, len(words)  # the most words whose prompt stays within the target
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if rendered(text(mid)) <= target else (lo, mid - 1)
            question = text(lo)
            lengths.append(rendered(question))
            f.write(json.dumps({"question": question, "answer": f"She works it out. #### {rng.randint(1, 500)}"}) + "\n")
    return lengths


def random_model(work: Path, tokenizer, shape: dict) -> Path:
    """Qwen2.5-0.5B-Instruct's shape (or the --quick stand-in) with random bf16 weights, saved with the
    tokenizer: the worker loads it as it loads a downloaded checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        **shape, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.pad_token_id
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    path = work / "qwen2.5-0.5b-shape"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    del model
    return path


# -- what the planner says --------------------------------------------------------------------------------
def plan_row(spec, gpu: str, *, vllm: bool, price: float | None = None) -> dict:
    """`autoslm plan`'s judgement of one offer of ``gpu`` (``placement.judge_offer``: the micro-batch,
    generation batch, waves, peak and step time the pod will run at), with the step in its parts."""
    from autoslm import catalog
    from autoslm.controller.placement import judge_offer
    from autoslm.providers import VENDORS
    from autoslm.providers.base import Offer

    g = catalog.gpu_info(gpu)
    price = price if price is not None else VENDORS["runpod"].list_prices.get(g.name, 0.0)
    p = judge_offer(
        spec, Offer(provider="runpod", gpu=g.name, gpu_count=1, vram_gb=g.vram_gb, price_per_hour=price), has_vllm=vllm
    )
    row = {
        "gpu": g.name,
        "engine": p.generation,
        "step_s": p.step_s,
        "waves": p.waves,
        "micro_batch": p.micro_batch,
        "generation_batch": p.generation_batch,
        "peak_gib": p.vram_need_gb,
        "vllm_util": p.vllm_util,
        "fits": p.fits,
        "usable": p.usable,
        "price_per_hour": price,
        "est_hours": p.est_hours,
        "est_usd": p.estimated_cost_usd,
        "note": p.note,
    }
    row.update(planned_parts(spec, g, engine=p.generation, waves=p.waves))
    return row


def planned_parts(spec, g, *, engine: str, waves: int) -> dict:
    """``catalog.step_seconds`` split as it adds up: generation (``generation_seconds`` x decode waves) and
    training, the latter split as its FLOP count is (8N a token for the update, 2N for each extra forward
    pass: the reference model's where beta > 0, the old policy's where rollouts come from vLLM). Also the
    planner's seconds per decoded token of the batch (``decode_step_seconds``). {} if the cost model no
    longer has these functions."""
    from autoslm import catalog
    from autoslm.catalog import cost

    try:
        info, train, vllm = catalog.model_info(spec.model), spec.train, engine == "vllm"
        quant = catalog.quant_tier(info, train)
        waves = max(1, waves)
        step = cost.step_seconds(info, g, train, waves=waves, has_vllm=vllm)
        gen = cost.generation_seconds(info, g, train, vllm=vllm, quant=quant) * waves
        extra = (1 if vllm else 0) + (1 if train.beta > 0 else 0)
        rest = step - gen
        logps = rest * 2 * extra / (8 + 2 * extra)
        return {
            "step_s_exact": round(step, 3),
            "generation_s": round(gen, 3),
            "logps_s": round(logps, 3),
            "update_s": round(rest - logps, 3),
            "decode_step_ms": round(1000 * cost.decode_step_seconds(info, g, vllm=vllm, quant=quant), 2),
        }
    except (AttributeError, TypeError) as e:  # the cost model changed shape: the total still stands
        return {"parts_error": f"{type(e).__name__}: {e}"}


def planner_choice(spec) -> dict:
    """The offer `autoslm plan` puts first for the jobspec without keys: RunPod at its list prices (Vast's
    live offers are not asked here), in plan's own order (``placement.plan_placement``, ``choose_offer``)."""
    from autoslm.controller.keyless import ListPriceCatalog
    from autoslm.controller.placement import choose_offer, plan_placement
    from autoslm.providers import VENDORS

    try:
        placement = plan_placement(spec, {"runpod": ListPriceCatalog(VENDORS["runpod"])}, lookup=True)
        best = choose_offer(placement.offers, placement.problems)
        return {"gpu": best.gpu, "price_per_hour": best.price_per_hour, "order": [o.gpu for o in placement.offers]}
    except Exception as e:  # noqa: BLE001 - NoCapacity or a provider error: said, not fatal
        return {"gpu": None, "error": f"{type(e).__name__}: {e}"}


def plan(spec, gpu: str | None) -> dict:
    """Both estimates for ``gpu`` (without vLLM: what is measured; with vLLM: for reference), and the
    jobspec's own GPUs without and with vLLM."""
    rows = []
    for name in dict.fromkeys([*([gpu] if gpu else []), *spec.compute.gpus]):
        for vllm in (False, True):
            rows.append({**plan_row(spec, name, vllm=vllm), "this_gpu": name == gpu})
    return {"gpu": gpu, "rows": rows, "choice": planner_choice(spec)}


# -- the run ----------------------------------------------------------------------------------------------
class DecodeClock:
    """Times the policy's forward passes while ``_generate`` runs (a pre-hook on the input embedding): the
    first of each generate() call is the prefill, each later one decodes a token for the whole batch. The
    sampler reads its result every token (the end-of-sequence check), so the times are the GPU's."""

    def __init__(self, trainer):
        self.active, self.calls = False, []
        trainer.model.get_input_embeddings().register_forward_pre_hook(self._hook)
        inner = trainer._generate

        def generate(*a, **k):
            self.calls.append([])
            self.active = True
            try:
                return inner(*a, **k)
            finally:
                self.active = False

        trainer._generate = generate

    def _hook(self, module, args):
        if self.active:
            self.calls[-1].append(time.perf_counter())

    def take(self) -> dict:
        """The generate() calls since the last take: forward passes and seconds per decoded token."""
        calls, self.calls = [c for c in self.calls if c], []
        steps = [len(c) - 1 for c in calls]
        spans = [c[-1] - c[0] for c in calls if len(c) > 1]
        return {
            "generate_calls": len(calls),
            "decode_steps": sum(steps),
            "decode_step_ms": round(1000 * sum(spans) / sum(steps), 2) if sum(steps) else None,
        }


def stopper(args, probe: Probe, clock: DecodeClock, deadline: float, notes: list[str]):
    """Ends training after ``args.steps`` steps, or before a step that would end past ``deadline``
    (the last step's time, plus a tenth). Adds the decode clock's numbers to each step."""
    from transformers import TrainerCallback

    class Stop(TrainerCallback):
        def on_step_end(self, a, state, control, **kw):
            if probe.steps:
                probe.steps[-1].update(clock.take())
            done = len(probe.steps)
            if done >= args.steps:
                control.should_training_stop = True
            elif probe.steps and time.monotonic() + 1.1 * probe.steps[-1]["step_s"] > deadline:
                notes.append(f"stopped after {done} of {args.steps} steps: another would end past --budget-s {args.budget_s:g}")
                control.should_training_stop = True

    return Stop()


def train_steps(args, spec, path: Path, result: dict) -> None:
    """The worker's GRPO trainer on this device, ``args.steps`` steps, timed; fills ``result``."""
    import torch

    from autoslm.catalog import model_info
    from autoslm.engine.train import models
    from autoslm.engine.train.grpo import build_trainer
    from autoslm.engine.train.recipe import Device
    from autoslm.envs.task_table import load_environment

    device = Device.detect() if result["cuda"] else Device("cpu", packages=Device.detect().packages)
    info = model_info(spec.model)
    load = models.load_kwargs(spec, info, device)
    model = models.attach_adapter(models.load_model(str(path), load), spec, info)
    tok = models.load_tokenizer(str(path), False)
    trainer = build_trainer(
        spec,
        model=model,
        tokenizer=tok,
        env=load_environment(spec),
        seed=0,
        output_dir=Path(result["work"]) / "out",
        callbacks=[],
        reporter=Quiet(),
        device=device,
        adjust=lambda kw: {**kw, "logging_steps": 1, "save_strategy": "no", "report_to": "none"},
    )
    a = trainer.args
    result["recipe"] = {
        "dtype": str(load.get("dtype", "")),
        "attention": getattr(model.config, "_attn_implementation", None),
        "micro_batch": a.per_device_train_batch_size,
        "gradient_accumulation_steps": a.gradient_accumulation_steps,
        "steps_per_generation": a.steps_per_generation,
        "generation_batch": a.generation_batch_size,
        "gradient_checkpointing": a.gradient_checkpointing,
        "use_vllm": bool(getattr(a, "use_vllm", False)),
        "packages": sorted(device.packages),
    }
    per_step = spec.train.prompts_per_step * spec.train.group_size
    probe = Probe(trainer, torch, result["cuda"], per_step)
    probe.wrap_scoring()
    clock = DecodeClock(trainer)
    result["clock"] = clock
    trainer.add_callback(probe.callback())
    trainer.add_callback(stopper(args, probe, clock, T0 + args.budget_s, result["notes"]))
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    result["steps"] = probe.steps  # the same list: a watchdog's dump sees the steps done so far
    result["probe"] = probe  # the watchdog reads the step in progress from it
    print(
        f"[gsm8k_steps] training {args.steps} steps of {per_step} completions x {spec.train.max_completion_tokens} tokens "
        f"(micro-batch {a.per_device_train_batch_size}, generation batch {a.generation_batch_size}) ...",
        flush=True,
    )
    trainer.train()


def summarize(result: dict) -> None:
    """The measured medians (the first step left out when there are more), and measured / planned."""
    steps = [s for s in result.get("steps", []) if "step_s" in s]
    if not steps:
        return
    timed = steps[1:] if len(steps) > 1 else steps
    keys = (
        "step_s",
        "generation_s",
        "logps_s",
        "reward_s",
        "other_s",
        "update_s",
        "decode_step_ms",
        "completion_tokens",
        "peak_gib",
    )
    med = {k: round(statistics.median(s[k] for s in timed), 3) for k in keys if all(s.get(k) is not None for s in timed)}
    med["steps_timed"], med["first_step_s"] = len(timed), round(steps[0]["step_s"], 3)
    if med.get("completion_tokens") and med.get("step_s"):
        med["completion_tokens_per_s"] = round(med["completion_tokens"] / med["step_s"], 1)
    result["measured"] = med
    row = next((r for r in result["plan"]["rows"] if r["this_gpu"] and r["engine"] == "transformers"), None)
    if row:
        planned = {**row, "step_s": row.get("step_s_exact") or row["step_s"]}
        result["measured_over_planned"] = {
            k: round(med[k] / planned[k], 2)
            for k in ("step_s", "generation_s", "logps_s", "update_s", "decode_step_ms", "peak_gib")
            if med.get(k) and planned.get(k)
        }


# -- output -----------------------------------------------------------------------------------------------
def fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec) if isinstance(x, float) else str(x)


def _measured_row(label: str, m: dict) -> str:
    """One measured line of the table: a step's seconds, or their median."""
    return (
        f"{label:24} {fmt(m.get('step_s')):>7} {fmt(m.get('generation_s')):>7} {fmt(m.get('logps_s')):>7} "
        f"{fmt(m.get('other_s')):>7} {fmt(m.get('update_s')):>7} {fmt(m.get('decode_step_ms'), '.1f'):>7} "
        f"{fmt(m.get('completion_tokens'), '.0f'):>8} {fmt(m.get('peak_gib')):>8}"
    )


def table(r: dict) -> str:
    b = r["batch"]
    out = [
        f"GRPO steps of {r['spec']} ({r['model']} shape, random weights{', --quick: tiny shapes, a smoke test' if r['quick'] else ''})",
        f"on {r['device']}: {b['prompts_per_step']} prompts x {b['group_size']} completions x {b['max_completion_tokens']} tokens "
        f"(every completion runs to full length: no EOS from a random model), LoRA rank {b['lora_rank']}, beta {b['beta']}; "
        f"prompts {r['prompt_tokens']['mean']:.0f} tokens on average ({r['prompt_tokens']['min']}-{r['prompt_tokens']['max']})",
    ]
    rec = r.get("recipe")
    if rec:
        out.append(
            f"recipe: micro-batch {rec['micro_batch']} x {rec['gradient_accumulation_steps']}, generation batch {rec['generation_batch']}, "
            f"{rec['dtype']}/{rec['attention']}, checkpointing {rec['gradient_checkpointing']}, generate() {'vLLM' if rec['use_vllm'] else 'transformers'}"
        )
    head = (
        f"{'':24} {'s/step':>7} {'gen s':>7} {'logp s':>7} {'rew+ s':>7} {'upd s':>7} {'ms/tok':>7} {'tokens':>8} {'peak GiB':>8}"
    )
    out += ["", head, "-" * len(head)]
    out += [_measured_row(f"step {s['step']}", s) for s in r.get("steps", []) if "step_s" in s]
    if r.get("measured"):
        out.append(_measured_row("measured (median)", r["measured"]))
    for row in r["plan"]["rows"]:
        if row["this_gpu"]:
            label = f"plan {row['engine']}" + ("" if row["engine"] == "transformers" else " (not measured)")
            out.append(
                f"{label:24} {fmt(row['step_s']):>7} {fmt(row.get('generation_s')):>7} {fmt(row.get('logps_s')):>7} "
                f"{'':>7} {fmt(row.get('update_s')):>7} {fmt(row.get('decode_step_ms'), '.1f'):>7} {'':>8} {fmt(row['peak_gib']):>8}"
            )
    ratio = r.get("measured_over_planned")
    if ratio:
        out.append("measured / planned (transformers): " + ", ".join(f"{k} {v:.2f}x" for k, v in ratio.items()))
    out += [
        "",
        f"`autoslm plan` for this spec ({'' if r['plan']['gpu'] else 'no '}this GPU: {r['plan']['gpu'] or '-'}; the jobspec's GPUs "
        f"at RunPod list prices), 116-step run estimates:",
    ]
    head = f"{'gpu':16} {'engine':12} {'s/step':>7} {'gen s':>7} {'waves':>5} {'micro':>5} {'gen batch':>9} {'peak GiB':>8} {'$/h':>5} {'hours':>6} usable"
    out += [head, "-" * len(head)]
    for row in r["plan"]["rows"]:
        out.append(
            f"{row['gpu'] + (' *' if row['this_gpu'] else ''):16} {row['engine']:12} {fmt(row['step_s'], '.1f'):>7} "
            f"{fmt(row.get('generation_s'), '.1f'):>7} {fmt(row['waves']):>5} {fmt(row['micro_batch']):>5} "
            f"{fmt(row['generation_batch']):>9} {fmt(row['peak_gib'], '.1f'):>8} {fmt(row['price_per_hour']):>5} "
            f"{fmt(row['est_hours']):>6} {'yes' if row['usable'] else 'no: ' + row['note'][:70]}"
        )
    c = r["plan"]["choice"]
    out.append(
        f"plan would rent: {c['gpu']} at ${c.get('price_per_hour')}/h (RunPod list prices; Vast's live offers not asked)"
        if c.get("gpu")
        else f"plan would rent: nothing ({c.get('error')})"
    )
    out += [f"note: {n}" for n in r["notes"]]
    return "\n".join(out)


def finish(args, result: dict) -> None:
    summarize(result)
    result["wall_s"] = round(time.monotonic() - T0, 1)
    clean = {k: v for k, v in result.items() if k not in ("probe", "clock", "work")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(clean, indent=2, default=str) + "\n")
    print(table(result))
    print(f"wrote {args.out} ({result['wall_s']} s)", flush=True)


def watchdog(args, result: dict) -> threading.Timer:
    """Past the budget by --grace-s (a step much slower than the last): print and write what there is, exit 3."""

    def fire():
        cur = dict(result["probe"].cur) if result.get("probe") else {}
        t0 = cur.pop("t0", None)
        if result.get("clock"):  # how far generate() got: its decoded tokens and their pace
            cur.update({k: v for k, v in result["clock"].take().items() if v})
        result["notes"].append(
            f"incomplete: still in step {len(result.get('steps', [])) + 1} at --budget-s {args.budget_s:g} + "
            f"--grace-s {args.grace_s:g}"
            + (f", {time.perf_counter() - t0:.0f} s into it" if t0 else "")
            + (f" (so far: {json.dumps({k: round(v, 2) for k, v in cur.items()})})" if cur else "")
        )
        result["incomplete"] = True
        try:
            finish(args, result)
        finally:
            os._exit(3)

    timer = threading.Timer(max(1.0, T0 + args.budget_s + args.grace_s - time.monotonic()), fire)
    timer.daemon = True
    timer.start()
    return timer


def versions() -> dict:
    from importlib import metadata

    out = {"python": sys.version.split()[0]}
    for pkg in (
        "torch",
        "transformers",
        "trl",
        "peft",
        "accelerate",
        "datasets",
        "tokenizers",
        "huggingface_hub",
        "pydantic",
        "pyarrow",
        "fsspec",
        "numpy",
        "typing_extensions",
    ):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", type=Path, default=SPEC, help="the GRPO jobspec (default: the GSM8K one)")
    p.add_argument("--steps", type=int, default=4, help="optimizer steps, the first a warm-up (default 4)")
    p.add_argument("--budget-s", type=float, default=330, help="seconds from start: no step starts that would end past it")
    p.add_argument("--grace-s", type=float, default=60, help="past --budget-s by this much: write what there is and exit 3")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--gpu", help="catalog GPU the plan rows are for (default: this CUDA device's name; on a CPU: H200)")
    p.add_argument("--quick", action="store_true", help="tiny model and batch: a smoke test of every code path")
    p.add_argument("--out", default="gsm8k_steps.json", help="where the JSON goes")
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore")

    import torch
    from transformers.utils import logging as hf_logging

    from autoslm import catalog
    from autoslm.engine.train.tiny import build_tokenizer
    from autoslm.spec import load_spec

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    cuda = args.device != "cpu" and torch.cuda.is_available()
    if args.device == "cuda" and not cuda:
        sys.exit("gsm8k_steps: --device cuda but torch sees no CUDA device (try --device cpu --quick)")
    notes: list[str] = []
    device_name = torch.cuda.get_device_name(0) if cuda else "cpu"
    gpu = args.gpu or (device_name if cuda else "H200")
    g = catalog.gpu_info(gpu, torch.cuda.get_device_properties(0).total_memory / 2**30 if cuda and not args.gpu else None)
    if g is None:
        notes.append(f"{gpu!r} is not in autoslm's GPU catalog: no plan row for it (pass --gpu NAME)")
    elif not cuda:
        notes.append(f"no CUDA: the plan rows are for {g.name}, not this machine; measured numbers are a smoke test")
    spec = load_spec(args.spec)  # what `autoslm plan` reads
    with tempfile.TemporaryDirectory(prefix="gsm8k_steps-") as tmp:
        work = Path(tmp)
        tok = build_tokenizer()
        t = spec.train
        data = work / "gsm8k-like.jsonl"
        template = (spec.environment.params or {}).get("prompt_template")
        lengths = write_rows(data, tok, template, t.prompts_per_step * (args.steps + 2) if not args.quick else 16)
        run_spec = measured_spec(args.spec, work, data, quick=args.quick)
        if not args.quick:
            assert run_spec.train == spec.train, "the measured [train] must be the jobspec's"
        rt = run_spec.train
        result = {
            "spec": str(args.spec.relative_to(ROOT) if args.spec.is_relative_to(ROOT) else args.spec),
            "model": spec.model,
            "device": device_name,
            "cuda": cuda,
            "quick": args.quick,
            "work": str(work),
            "versions": versions(),
            "shape": QUICK_SHAPE if args.quick else QWEN25_05B,
            "batch": {
                k: getattr(rt, k)
                for k in (
                    "prompts_per_step",
                    "group_size",
                    "max_completion_tokens",
                    "max_length",
                    "lora_rank",
                    "lora_alpha",
                    "beta",
                    "loss_type",
                    "learning_rate",
                )
            },
            "prompt_tokens": {"mean": round(statistics.mean(lengths), 1), "min": min(lengths), "max": max(lengths)},
            # The jobspec as loaded (--quick: with the tiny [train]): its providers, GPUs and limits.
            "plan": plan(spec.model_copy(update={"train": rt}), g.name if g else None),
            "notes": notes,
            "steps": [],
        }
        if args.quick:
            notes.append("--quick: the plan rows are for the tiny batch with the 0.5B model; nothing here is a measurement")
        watchdog(args, result)
        print(f"[gsm8k_steps] {device_name}: building the model ({time.monotonic() - T0:.0f} s) ...", flush=True)
        path = random_model(work, tok, QUICK_SHAPE if args.quick else QWEN25_05B)
        failed = 0
        try:
            train_steps(args, run_spec, path, result)
        except Exception as e:  # noqa: BLE001 - the steps done so far are still printed
            import traceback

            traceback.print_exc()
            failed = 1
            notes.append(f"FAILED: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}")
        finish(args, result)
    return failed


if __name__ == "__main__":
    sys.exit(main())
