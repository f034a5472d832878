"""`autoslm export RUN[@STEP] --format merged|gguf|gguf-lora [--quant Q] --to DIR`: the SDK's export
(sdk/export.py) on this machine, its progress as it goes, then what was written and the commands that
load it (`ollama create`, `llama-server`).

Light like the other views: the merge and the conversion run in the worker's export process.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from autoslm.recipes.export import FORMATS

ON_HELP = "where it runs: only this machine for now (a rented GPU is not offered yet)"


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


def register(app: typer.Typer, client_factory, console_factory) -> None:
    """The `autoslm export` command."""

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
            typer.Option("--quant", "-q", help="GGUF type: f16 (default), bf16, f32, q8_0, or q4_k_m... with llama-quantize"),
        ] = None,
        to: Annotated[
            Optional[Path], typer.Option("--to", help="folder to write into (default: ./<run name>-<format>[-<quant>])")
        ] = None,
        on: Annotated[str, typer.Option("--on", help=ON_HELP)] = "local",
    ):
        """Merge a run's adapter into its base model and write it as safetensors or GGUF (with an Ollama Modelfile)."""
        from autoslm.errors import UsageError
        from autoslm.sdk.export import export

        if on != "local":
            raise UsageError(
                f"--on {on}: exporting on a rented GPU is not offered yet",
                hint="export here (a model under ~8B merges and converts on a laptop's CPU), or on a machine with more memory",
            )
        console = console_factory()
        done = export(
            client_factory(),
            run,
            format=format,
            quant=quant,
            to=to,
            log=lambda m: console.print(m, markup=False, soft_wrap=True, highlight=False),
        )
        for line in export_lines(done):
            console.print(line, markup=False, soft_wrap=True, highlight=False)
