"""An export's work, once ``plan.make_plan`` has passed: merge, convert, quantize, write the Modelfile,
and rename the files into the destination. Everything is written into a staging folder inside the
destination first (same file system: the last step is renames), and the folder is removed whatever
happens, so a failure leaves no half-written file where the user looks.

Each step says when it starts and ends; a step that runs longer says so every ``TICK_S`` seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from autoslm.engine.export.plan import Plan
from autoslm.recipes.export import CONVERTER_VERSION, QUANTIZE_BINDINGS, gguf_name

TICK_S = 10.0


class Failed(Exception):
    """A step failed after the checks passed (exit 1): its last words."""


@contextmanager
def step(log, what: str):
    """``what`` said at the start, its seconds at the end, and a line every TICK_S while it runs."""
    t0 = time.monotonic()
    done = threading.Event()

    def tick():
        while not done.wait(TICK_S):
            log(f"  ... still {what} ({time.monotonic() - t0:.0f} s)")

    log(f"{what} ...")
    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
    log(f"{what}: done in {time.monotonic() - t0:.1f} s")


def export(plan: Plan, home: Path, log) -> list[Path]:
    """The export's files, in the destination."""
    req = plan.req
    dest = Path(req["dest"])
    created = not dest.exists()
    dest.mkdir(parents=True, exist_ok=True)
    stage = Path(req.get("stage") or dest / f".autoslm-export-{os.getpid()}")
    stage.mkdir(parents=True, exist_ok=False)
    try:
        names = _produce(plan, stage, home, log)
        return [_place(stage / n, dest / n) for n in names]
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if created and not any(dest.iterdir()):
            dest.rmdir()


def _produce(plan: Plan, stage: Path, home: Path, log) -> list[str]:
    """The files of the export, written under ``stage``; their names."""
    fmt, quant = plan.fmt, plan.quant
    if fmt == "gguf-lora":
        name = gguf_name(quant, lora=True)
        with step(log, f"converting the adapter to GGUF {quant} with llama.cpp's convert_lora_to_gguf.py ({CONVERTER_VERSION})"):
            _convert(plan, "lora", [plan.req["adapter"], "--base", str(plan.config_dir)], quant, stage / name, stage)
        _write_modelfile(plan, stage, name, adapter=True)
        return [name, "Modelfile"]
    merged = stage / "merged" if fmt != "merged" else stage
    with step(log, f"merging the adapter into {plan.req['model']} ({plan.req['dtype']})"):
        _merge(plan, home, merged)
    if fmt == "merged":
        return sorted(p.name for p in stage.iterdir() if p.is_file())
    name = gguf_name(quant)
    first = quant if plan.quantize_tool is None else "f16"
    with step(log, f"converting to GGUF {first} with llama.cpp's convert_hf_to_gguf.py ({CONVERTER_VERSION})"):
        pre = ["--pre", plan.pre] if plan.pre else []
        _convert(plan, "hf", [str(merged)], first, stage / gguf_name(first), stage, head=pre)
    if plan.quantize_tool is not None:
        with step(log, f"quantizing to {quant} with {_quantizer_name(plan.quantize_tool)}"):
            _quantize(plan.quantize_tool, stage / gguf_name(first), stage / name, quant, stage)
    _write_modelfile(plan, merged, name, adapter=False, out=stage)
    return [name, "Modelfile"]


def _merge(plan: Plan, home: Path, out: Path) -> None:
    from autoslm.engine.train.merge import merge

    merge(
        plan.req["model"],
        Path(plan.req["adapter"]),
        out,
        home,
        trust_remote_code=plan.req.get("trust_remote_code", False),
        dtype=plan.req["dtype"],
    )


def _convert(plan: Plan, kind: str, args: list[str], quant: str, out: Path, stage: Path, head: list[str] = ()) -> None:
    cmd = [sys.executable, "-m", "autoslm.engine.export.gguf_convert", str(plan.converter), kind, *head, "--"]
    cmd += [*args, "--outtype", quant, "--outfile", str(out)]
    _run(cmd, stage / f"convert-{kind}.log", what="llama.cpp's converter")
    if not out.is_file():
        raise Failed(f"llama.cpp's converter ended without writing {out.name}")


def _quantize(tool: str, src: Path, out: Path, quant: str, stage: Path) -> None:
    """llama.cpp's quantizer on the f16 file: its tool, or the same function in its library (quantize.py)."""
    if tool == QUANTIZE_BINDINGS:
        cmd = [sys.executable, "-m", "autoslm.engine.export.quantize", str(src), str(out), quant]
    else:
        cmd = [tool, str(src), str(out), quant.upper()]
    what = Path(_quantizer_name(tool)).name
    _run(cmd, stage / "quantize.log", what=what)
    src.unlink()
    if not out.is_file():
        raise Failed(f"{what} ended without writing {out.name}")


def _quantizer_name(tool: str) -> str:
    """How the progress lines name the quantizer (a failure, by its file name): the tool's path, or the bindings."""
    return "llama-cpp-python's libllama" if tool == QUANTIZE_BINDINGS else tool


def _run(cmd: list[str], log_file: Path, what: str) -> None:
    """A converter or the quantize tool, its output kept in ``log_file``; its last line when it fails."""
    with open(log_file, "wb") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if p.returncode != 0:
        lines = [line for line in log_file.read_text(errors="replace").splitlines() if line.strip()]
        raise Failed(f"{what} failed (exit {p.returncode}): {lines[-1].strip() if lines else 'no output'}")


def _write_modelfile(plan: Plan, tokenizer_dir: Path, gguf: str, *, adapter: bool, out: Path | None = None) -> None:
    from autoslm.engine.export.modelfile import go_template, modelfile, turn_text
    from autoslm.engine.train import models

    req = plan.req
    tok = models.load_tokenizer(str(tokenizer_dir if not adapter else plan.config_dir), req.get("trust_remote_code", False))
    thinking = bool(req.get("thinking", False))

    def render(messages, generation):
        return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation, enable_thinking=thinking)

    text = modelfile(
        gguf,
        go_template(turn_text(render)),
        stop_tokens(tok, plan.config_dir),
        sampling(plan.config_dir, req.get("sampling") or {}),
        base=req["model"],
        run_id=req["run_id"],
        adapter=adapter,
    )
    (out or tokenizer_dir).joinpath("Modelfile").write_text(text, encoding="utf-8")


def stop_tokens(tok, config_dir: Path) -> list[str]:
    """The model's end-of-turn tokens: its generation config's eos ids and the tokenizer's eos."""
    import json

    ids: list[int] = []
    gen = config_dir / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text(encoding="utf-8")).get("eos_token_id")
        ids += eos if isinstance(eos, list) else ([eos] if isinstance(eos, int) else [])
    if tok.eos_token_id is not None:
        ids.append(tok.eos_token_id)
    names = [tok.convert_ids_to_tokens(i) for i in dict.fromkeys(ids)]
    return [n for n in names if n]


def sampling(config_dir: Path, run: dict) -> dict:
    """The sampling Ollama uses: the base model's generation config, with the run's own (a GRPO run's
    temperature) over it."""
    import json

    gen = config_dir / "generation_config.json"
    cfg = json.loads(gen.read_text(encoding="utf-8")) if gen.is_file() else {}
    out = {k: cfg[k] for k in ("temperature", "top_p", "top_k") if cfg.get("do_sample") and cfg.get(k) is not None}
    out.update({k: v for k, v in run.items() if v is not None})
    return out


def _place(src: Path, dst: Path) -> Path:
    """A finished file renamed into the destination (whole, or not at all)."""
    if dst.is_dir():
        raise Failed(f"{dst} is a folder: the export's file of that name cannot replace it")
    os.replace(src, dst)
    return dst
