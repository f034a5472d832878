"""autoslm: fine-tune small language models on rented GPUs, or locally, from one TOML JobSpec.

The SDK surface, for notebooks (the CLI calls the same functions)::

    import autoslm
    run = autoslm.launch("jobspecs/quickstart.toml", detach=True)
    run.wait()
    autoslm.status(run.run_id).state  # typed: .step, .seeds, .metrics...; .to_json() for a dict

Importing this package is cheap: nothing heavy (torch, transformers) is imported until a worker runs.
"""

from __future__ import annotations

import os

from autoslm.version import __version__

__all__ = [
    "Client",
    "JobSpec",
    "Run",
    "__version__",
    "attach",
    "cancel",
    "download",
    "launch",
    "list_runs",
    "load_spec",
    "logs",
    "runs",
    "serve",
    "status",
    "sweep",
    "wait",
]


def __getattr__(name):
    # Lazy: `import autoslm` must stay fast and torch-free.
    if name == "Client":
        from autoslm.sdk import Client

        return Client
    if name == "Run":
        from autoslm.views.run import Run

        return Run
    if name in ("JobSpec", "load_spec"):
        from autoslm import spec

        return getattr(spec, name)
    raise AttributeError(name)


def _client(home=None):
    from autoslm.sdk import Client

    return Client(home)


def launch(spec, *, detach: bool = False, progress: bool = True, home=None, on_update=None):
    """Launch a run from a JobSpec (a TOML path, a JobSpec, or a dict of its fields). Returns a ``Run``.

    Blocks until the run ends (with a progress bar unless ``progress=False``) unless ``detach``.
    A file with a ``[sweep]`` table is launched as a sweep: the answer is then ``sweep()``'s handle."""
    from autoslm.views.run import Run

    spec_path = None
    if isinstance(spec, (str, os.PathLike)):
        from autoslm.sweep import Sweep, load_any

        spec_path, spec = str(spec), load_any(spec)  # read and parsed once
        if isinstance(spec, Sweep):
            return sweep(spec, detach=detach, home=home, spec_path=spec_path)

    client = _client(home)
    run = Run(client, client.launch(spec, detach=True, spec_path=spec_path).run_id)
    if not detach:
        run.wait(on_update=on_update, progress=progress and on_update is None)
    return run


def attach(ref: str, *, home=None):
    """A ``Run`` for a run started elsewhere: a run id (or unique prefix) here, or ``hf://owner/repo/<phase>/<run_id>[/seedN]``."""
    from autoslm.views.run import Run

    client = _client(home)
    if ref.startswith("hf://"):
        client.status(ref)  # a bad reference fails here, not at the first look
        return Run(client, ref)
    return Run(client, client.resolve(ref).run_id)


def runs(*, home=None):
    """A pandas DataFrame of the runs launched from this machine, newest first."""
    from autoslm.views.notebook import runs_frame

    return runs_frame(_client(home).list_runs())


def serve(ref: str, *, on: str = "local", ttl=None, max_usd=None, gpu=None, port=None, wait_s: float = 3600.0, home=None):
    """`autoslm serve REF[@STEP]`: the adapter behind vLLM's OpenAI server, here or ``on`` a provider (then
    within ``ttl``, "2h" or seconds, and ``max_usd``). Waits up to ``wait_s`` for the endpoint. Returns a
    ``Serve``: ``url``, ``curl()``, ``chat(message)``, ``status()``, ``cancel()``."""
    from autoslm.sdk.serve import serve as start_serve

    return start_serve(_client(home), ref, on=on, ttl=ttl, max_usd=max_usd, gpu=gpu, port=port, wait_s=wait_s)


def _target(client, ref: str):
    from autoslm.sdk.sweep import resolve_target

    return resolve_target(client, ref)


def status(ref: str, *, home=None):
    """A run's status (a run id, a prefix, an ``hf://`` reference) or a sweep's (its id): a ``RunStatus``
    or a ``SweepStatus`` (autoslm/controller/status.py); ``.to_json()`` gives what ``status --json`` prints."""
    client = _client(home)
    if (target := _target(client, ref)).sweep:
        from autoslm.sdk.sweep import sweep_status

        return sweep_status(client, target.id)
    return client.status(ref)


def wait(ref: str, *, timeout: float | None = None, home=None):
    """Block until the run or the sweep ends (or ``timeout`` seconds); returns its status."""
    client = _client(home)
    if (target := _target(client, ref)).sweep:
        from autoslm.sdk.sweep import wait_sweep

        return wait_sweep(client, target.id, timeout=timeout)
    return client.wait(ref, timeout=timeout)


def cancel(ref: str, *, home=None):
    """Cancel a run, or every run of a sweep (and start no more of them)."""
    client = _client(home)
    if (target := _target(client, ref)).sweep:
        from autoslm.sdk.sweep import cancel_sweep

        return cancel_sweep(client, target.id)
    return client.cancel(ref)


def logs(run_id: str, *, seed: int | None = None, home=None) -> str:
    """The run's own output: its worker's log here, or its job's where the vendor keeps it; "" where neither."""
    return "".join(line + "\n" for line in _client(home).own_logs(run_id, seed) or [])


def download(run_id: str, to=None, *, home=None):
    return _client(home).download(run_id, to)


def list_runs(*, home=None) -> list:
    """The newest runs here, a ``RunStatus`` each."""
    return _client(home).list_runs()


def sweep(spec, *, detach: bool = True, home=None, poll_s: float | None = None, spec_path: str | None = None):
    """Launch a sweep (a JobSpec file with a ``[sweep]`` table). Returns a handle: ``status()``, ``wait()``,
    ``cancel()``, ``report()``, and ``frame()`` (a row per run, the swept values as columns).

    A string that names a sweep already launched here (its id) attaches to it instead."""
    from pathlib import Path

    from autoslm.sdk.sweep import launch_sweep, resolve_sweep
    from autoslm.views.run import SweepHandle

    client = _client(home)
    if isinstance(spec, str) and not Path(spec).exists() and (rec := resolve_sweep(client, spec)) is not None:
        return SweepHandle(client, rec.sweep_id)
    handle = SweepHandle(client, launch_sweep(client, spec, poll_s=poll_s, spec_path=spec_path))
    if not detach:
        handle.wait()
    return handle
