"""`autoslm export RUN[@STEP] --format merged|gguf|gguf-lora [--quant Q] --to DIR`: the SDK's export
(sdk/export.py) on this machine, its progress as it goes, then what was written and the commands that
load it (`ollama create`, `llama-server`).

Light like the other views: the merge and the conversion run in the worker's export process, here or,
with ``--on``, in an export run's pod (sdk/export_remote.py), after the plan's offers and a question as
`launch` asks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from autoslm.recipes.export import FORMATS

ON_HELP = 'where: "local" (this machine, the default) or a provider that rents GPUs, for a model too big for it'


def confirm_rented(plan, console, *, yes: bool):
    """``confirm(spec)`` for a rented export: the offers and the question `launch` asks (views/rented.py)."""
    from autoslm.views.rented import confirm_offer

    def confirm(spec) -> None:
        confirm_offer("export", spec, plan, console, yes=yes)

    return confirm


def export_lines(done) -> list[str]:
    """What the command prints once the export is written."""
    what = {"merged": "merged weights", "gguf": f"GGUF {done.quant}", "gguf-lora": f"GGUF LoRA adapter {done.quant}"}
    lines = [f"run {done.run_id}: {what[done.format]} written to {done.dest} in {done.seconds:.0f} s"]
    lines += [f"  {f.name}" for f in done.files]
    lines += [f"note: {n}" for n in done.notes]
    if done.format == "merged":
        lines.append(f'load it with transformers: AutoModelForCausalLM.from_pretrained("{done.dest}")')
    commands = done.commands()
    if commands:
        lines.append("load it with:")
        lines += [f"  {c}" for c in commands]
    return lines


def register(app: typer.Typer, client_factory, console_factory, plan=None) -> None:
    """The `autoslm export` command. ``plan``: the CLI's (offer rows, plan table, no-offer line), which a
    rented export shows as `launch` does."""

    @app.command("export")
    def export_(
        run: Annotated[
            str,
            typer.Argument(
                help="run id or a unique prefix; RUN@STEP exports a kept checkpoint (or the kept best)", show_default=False
            ),
        ],
        format: Annotated[str, typer.Option("--format", "-f", help=f"one of {', '.join(FORMATS)}")] = "merged",
        quant: Annotated[
            Optional[str],
            typer.Option(
                "--quant", "-q", help="GGUF type: f16 (default), bf16, f32, q8_0, or q4_k_m... with llama.cpp's quantizer"
            ),
        ] = None,
        to: Annotated[
            Optional[Path], typer.Option("--to", help="folder to write into (default: ./<run name>-<format>[-<quant>])")
        ] = None,
        on: Annotated[str, typer.Option("--on", help=ON_HELP)] = "local",
        gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU type to rent (default: the run's compute.gpu)")] = None,
        max_usd: Annotated[
            Optional[float], typer.Option("--max-usd", min=0.01, help="money limit (required on a rented GPU)")
        ] = None,
        max_hours: Annotated[
            Optional[float], typer.Option("--max-hours", min=0.01, help="time limit on a rented GPU (default: 1)")
        ] = None,
        yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask before renting a GPU")] = False,
        poll_s: Annotated[Optional[float], typer.Option("--poll-s", hidden=True)] = None,
    ):
        """Merge a run's adapter into its base model and write it as safetensors or GGUF (with an Ollama Modelfile),
        here or on a rented GPU (--on, within --max-usd)."""
        from autoslm.sdk.export import Rented, export

        console = console_factory()
        rented = None
        if on != "local":
            rented = Rented(on, gpu, max_usd, max_hours, poll_s, confirm_rented(plan, console, yes=yes) if plan else None)
        done = export(
            client_factory(),
            run,
            format=format,
            quant=quant,
            to=to,
            log=lambda m: console.print(m, markup=False, soft_wrap=True, highlight=False),
            rented=rented,
        )
        for line in export_lines(done):
            console.print(line, markup=False, soft_wrap=True, highlight=False)
