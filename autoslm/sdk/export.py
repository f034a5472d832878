"""`autoslm export RUN[@STEP]` and ``Run.export``: a run's adapter merged into its base model and saved as
safetensors (``merged``), converted to GGUF by llama.cpp's pinned converter (``gguf``, with an Ollama
Modelfile), or the adapter alone as a GGUF LoRA (``gguf-lora``), on this machine.

The checks that need no model come first, here, before anything is fetched or written: the format and
quantization, the adapter in the store (the final one, or a kept checkpoint's with ``@STEP``), llama.cpp's
quantize tool for the types only it writes, the ``export`` extra. The worker's export
(``python -m autoslm.engine.export``, a process: this module never imports torch) then checks what needs
the model (the converter knows its architecture and tokenizer; the disk holds what it writes) and
does the work. A refusal from either is one line and exit 2.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from autoslm.errors import AutoslmError, UsageError
from autoslm.recipes.export import (
    checked_request,
    find_quantizer,
    needs_quantize_tool,
    quantize_tool_missing_hint,
)

EXPORT_EXTRA = ("torch", "transformers", "peft", "accelerate")
GGUF_EXTRA = ("gguf", "numpy")


@dataclass(frozen=True)
class Exported:
    """What an export wrote: ``files`` in ``dest`` (``gguf`` and ``modelfile`` when there are)."""

    run_id: str
    name: str  # the run's name: what `ollama create` calls the model
    format: str
    quant: str
    dest: Path
    files: list[Path]
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def gguf(self) -> Path | None:
        return next((f for f in self.files if f.suffix == ".gguf"), None)

    @property
    def modelfile(self) -> Path | None:
        return next((f for f in self.files if f.name == "Modelfile"), None)

    def commands(self, name: str | None = None) -> list[str]:
        """The commands that load the export: Ollama and llama.cpp's server for a GGUF."""
        if self.gguf is None:
            return []
        name = name or self.name.lower()
        if self.format == "gguf-lora":
            return [
                f"llama-server -m BASE.gguf --lora {self.gguf}   # BASE.gguf: the base model as GGUF",
                f"ollama create {name} -f {self.modelfile}   # once FROM names the base model's GGUF",
            ]
        return [f"ollama create {name} -f {self.modelfile}", f"llama-server -m {self.gguf}"]


def require_export_extra(fmt: str = "gguf") -> None:
    """The packages the worker's export imports for ``fmt`` (GGUF: the converter's too), or one line."""

    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except (ImportError, ValueError):
            return True

    missing = [m for m in EXPORT_EXTRA + (GGUF_EXTRA if fmt != "merged" else ()) if absent(m)]
    if missing:
        raise UsageError(
            f"autoslm export merges and converts here and needs the export extra ({', '.join(missing)} missing)",
            hint="pip install 'autoslm[export]'",
        )


def free_bytes(dest: Path) -> int:
    """What the disk that will hold ``dest`` has free (its nearest existing parent's)."""
    p = Path(dest).resolve()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


@dataclass(frozen=True)
class Rented:
    """Where a rented export runs and within what: ``confirm(spec)`` is asked before anything is rented
    (the CLI shows the plan and asks; None: the caller's ``max_usd`` is its consent)."""

    on: str
    gpu: str | None = None
    max_usd: float | None = None
    max_hours: float | None = None
    poll_s: float | None = None
    confirm: Callable | None = None


def export(
    client,
    ref: str,
    *,
    format: str = "merged",
    quant: str | None = None,
    to: str | Path | None = None,
    log: Callable[[str], None] | None = None,
    disk_free: Callable[[Path], int] = free_bytes,
    rented: Rented | None = None,
) -> Exported:
    """Export ``ref`` (``RUN`` or ``RUN@STEP``) into ``to``, here or (``rented``) as a run on a rented GPU;
    returns what was written. ``disk_free`` says what the destination's disk holds (injected by tests)."""
    from autoslm.sdk.adapter_source import find_source

    log = log or (lambda msg: None)
    quant = checked_request(format, quant)
    if rented is None:
        if needs_quantize_tool(format, quant) and find_quantizer() is None:
            raise UsageError(f"--quant {quant}: {quantize_tool_missing_hint()}")
        require_export_extra(format)
    src = find_source(client, ref, verb="export")
    dest = Path(to).expanduser() if to else Path.cwd() / f"{src.lora_name}-{format}{'-' + quant if quant else ''}"
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"--to {dest}: a file is there; the export writes a folder")
    if rented is not None:
        return _export_rented(client, src, format, quant, dest, rented, log)
    with tempfile.TemporaryDirectory(prefix="autoslm-export-") as tmp:
        req = _request(client, src, format, quant, dest, Path(tmp), disk_free(dest))
        result = _run_worker(req, Path(tmp), client.home, log)
    files = [Path(f) for f in result["files"]]
    return Exported(
        src.run_id, src.spec.name, format, quant, dest, files, float(result["seconds"]), list(result.get("notes") or [])
    )


def _export_rented(client, src, fmt: str, quant: str, dest: Path, rented: Rented, log) -> Exported:
    from autoslm.sdk.export_remote import export_spec, remove_if_empty, run_remote

    r = rented
    spec = export_spec(
        src, fmt=fmt, quant=quant, dtype=trained_dtype(client, src), on=r.on, gpu=r.gpu, max_usd=r.max_usd, max_hours=r.max_hours
    )
    if r.confirm is not None:
        r.confirm(spec)
    existed = dest.exists()
    try:
        run_id, files, seconds = run_remote(client, spec, dest, log, poll_s=r.poll_s)
    except BaseException:
        if not existed:
            remove_if_empty(dest)
        raise
    return Exported(src.run_id, src.spec.name, fmt, quant, dest, files, seconds, [f"exported by run {run_id} on {r.on}"])


def _request(client, src, fmt: str, quant: str, dest: Path, tmp: Path, free: int) -> dict:
    from autoslm.store.adapters import AdapterDamaged, check_adapter

    adapter = tmp / "adapter"
    client.stores(src.store_uri).download(src.adapter_path, adapter)
    try:
        check_adapter(adapter)
    except AdapterDamaged as e:
        raise UsageError(
            f"run {src.run_id}: its adapter in {src.store_uri} {src.adapter_path}: {e.path.name}: {e.problem}"
        ) from None
    spec = src.spec
    train = spec.train
    return {
        "run_id": src.run_id,
        "model": spec.model,
        "trust_remote_code": bool(spec.trust_remote_code),
        "adapter": str(adapter),
        "format": fmt,
        "quant": quant,
        "dtype": trained_dtype(client, src),
        "dest": str(dest.resolve()),
        "free_bytes": int(free),
        "thinking": bool(spec.thinking),
        # A GRPO run's sampling temperature is the one its policy learned at.
        "sampling": {"temperature": getattr(train, "temperature", None)} if train.method == "grpo" else {},
    }


def trained_dtype(client, src) -> str:
    """The dtype the run's model was loaded in for training (its "model_loaded" event); float32 if unsaid."""
    from autoslm.layout import RunPaths
    from autoslm.store.artifacts import RunArtifacts

    run = client.resolve(src.run_id)
    seed = client.registry.replicas(src.run_id)[0].seed
    events = RunArtifacts(client.stores(src.store_uri), RunPaths(run.phase, src.run_id, seed)).read_events()
    loaded = [e.data.get("dtype") for e in events if e.kind == "model_loaded" and e.data.get("dtype")]
    return loaded[-1] if loaded and loaded[-1] in ("float32", "bfloat16", "float16") else "float32"


def _run_worker(req: dict, tmp: Path, home: Path, log) -> dict:
    """The worker's export as a process, its progress lines passed to ``log``; its result."""
    (tmp / "request.json").write_text(json.dumps(req), encoding="utf-8")
    out = tmp / "result.json"
    cmd = [sys.executable, "-m", "autoslm.engine.export", str(tmp / "request.json"), str(out)]
    env = {**os.environ, "AUTOSLM_HOME": str(home)}
    with open(tmp / "stderr.log", "wb") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        for line in p.stdout:
            log(line.rstrip("\n"))
        code = p.wait()
    said = [line for line in (tmp / "stderr.log").read_text(errors="replace").splitlines() if line.strip()]
    last = said[-1] if said else f"exit {code}"
    if code == 2 and last.startswith("refused: "):
        raise UsageError(last.removeprefix("refused: "))
    if code != 0 or not out.is_file():
        if os.environ.get("AUTOSLM_DEBUG"):
            log("\n".join(said[-40:]))
        raise AutoslmError(
            f"export of run {req['run_id']} failed: {last.removeprefix('failed: ')}",
            hint=None if os.environ.get("AUTOSLM_DEBUG") else "AUTOSLM_DEBUG=1 shows the worker's whole output",
        )
    if os.environ.get("AUTOSLM_DEBUG") and said:
        log("\n".join(said))
    return json.loads(out.read_text(encoding="utf-8"))
