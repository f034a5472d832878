"""`autoslm export RUN --on runpod|vast|hfjobs`: the export as a run of its own on a rented GPU, for a
model too big to merge and convert on this machine.

An export run's JobSpec is the trained run's with ``[export]`` (which adapter, which format, the dtype
the run trained in), one seed, one GPU, and the limits the user gave: so it is planned, rented,
supervised, limited, cancelled and collected as every run is, and its pod runs
``engine/pod/exporting.py``. A rented export must say how much it may spend (``--max-usd``; its time cap
is ``--max-hours``, 1 by default) before anything is rented. Its files go to the run's store
(``export/``), from where the command fetches them into ``--to`` (and `autoslm download` fetches them
again). llama.cpp's quantize tool is not on a rented pod: the types the converter writes itself only.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from autoslm.errors import RunFailed, UsageError
from autoslm.recipes.export import needs_quantize_tool

DEFAULT_HOURS = 1.0


def export_spec(
    src, *, fmt: str, quant: str, dtype: str, on: str, gpu: str | None, max_usd: float | None, max_hours: float | None
):
    """The export run's JobSpec, or one line on what is missing. Nothing is rented here."""
    from pydantic import ValidationError

    from autoslm.providers import VENDORS
    from autoslm.spec import JobSpec

    if on not in VENDORS or not VENDORS[on].rented:
        rented = ", ".join(n for n, v in VENDORS.items() if v.rented)
        raise UsageError(
            f"--on {on!r}: not a provider that rents a GPU", hint=f"one of {rented}, or leave --on out to export here"
        )
    if needs_quantize_tool(fmt, quant):
        raise UsageError(
            f"--quant {quant}: llama.cpp's quantize tool writes it, and a rented pod does not have it",
            hint="export f16 there (--quant f16), then `llama-quantize model-f16.gguf model.gguf " + quant.upper() + "` here",
        )
    if max_usd is None:
        raise UsageError(
            f"an export on {on} needs --max-usd: a rented GPU works only within a money limit",
            hint=f"e.g. autoslm export {src.run_id} --on {on} --max-usd 2",
        )
    base = src.spec
    gpus = gpu or (None if base.compute.is_local else base.compute.gpu)
    if not gpus:
        raise UsageError(
            f"an export on {on} needs a GPU type (run {src.run_id} trained on this machine)", hint='pass --gpu, e.g. --gpu "L4"'
        )
    data = base.model_dump()
    data.update(
        name=f"{base.name[:41]}-export",
        seed=base.seeds[0],
        compute={**base.compute.model_dump(), "provider": on, "gpu": gpus, "gpu_count": 1, "nodes": 1},
        limits={**base.limits.model_dump(), "max_hours": max_hours or DEFAULT_HOURS, "max_usd": max_usd},
        export={
            "source_run": src.run_id,
            "store": src.store_uri,
            "adapter_path": src.adapter_path,
            "step": src.step,
            "format": fmt,
            "quant": quant,
            "dtype": dtype,
        },
    )
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        raise UsageError(f"cannot export run {src.run_id} on {on}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None


def run_remote(client, spec, dest: Path, log, *, poll_s: float | None = None) -> tuple[str, list[Path], float]:
    """Launch the export run, follow it to its end, fetch its files into ``dest``: (run id, files, seconds)."""
    import time

    from autoslm.controller.state import RunState
    from autoslm.layout import RunPaths
    from autoslm.store.artifacts import RunArtifacts

    t0 = time.monotonic()
    run = client.launch(spec, detach=True, supervise=True, poll_s=poll_s)
    log(
        f"export run {run.run_id} launched on {spec.compute.provider} ({spec.compute.gpu}); `autoslm watch {run.run_id}` follows it"
    )
    said: list[str] = []

    def on_update(st) -> None:
        first = st.first_seed
        line = f"{st.state}: {first.message}" if first is not None and first.message else str(st.state)
        if not said or said[-1] != line:
            said.append(line)
            log(f"  {line}")

    final = client.wait(run.run_id, poll_s=poll_s, on_update=on_update)
    if final.state is not RunState.SUCCEEDED:
        raise RunFailed(f"export run {run.run_id} ended {final.state}" + (f": {final.error}" if final.error else ""))
    record = client.resolve(run.run_id)
    seed = client.registry.replicas(run.run_id)[0].seed
    art = RunArtifacts(client.stores(record.store_uri), RunPaths(record.phase, run.run_id, seed))
    files = place_fetched(art, dest)
    return run.run_id, files, time.monotonic() - t0


def place_fetched(art, dest: Path) -> list[Path]:
    """An export run's files fetched from its store into ``dest``, each renamed into place whole."""
    import os

    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".autoslm-fetch-", dir=dest) as tmp:
        art.fetch_export(Path(tmp))
        names = sorted(p.name for p in Path(tmp).iterdir() if p.is_file())
        if not names:
            raise UsageError(f"no exported files in the store at {art.paths.export}")
        for n in names:
            os.replace(Path(tmp) / n, dest / n)
    gguf_first = sorted(names, key=lambda n: (not n.endswith(".gguf"), n != "Modelfile", n))
    return [dest / n for n in gguf_first]


def remove_if_empty(dest: Path) -> None:
    if dest.is_dir() and not any(dest.iterdir()):
        shutil.rmtree(dest, ignore_errors=True)
