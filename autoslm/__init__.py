"""autoslm: fine-tune small language models on rented GPUs, or locally, from one TOML JobSpec.

The SDK surface, for notebooks (the CLI calls the same functions)::

    import autoslm
    run = autoslm.launch("jobspecs/quickstart.toml", detach=True)
    run.wait()
    autoslm.status(run.run_id)["state"]

Importing this package is cheap: nothing heavy (torch, transformers) is imported until a worker runs.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["Client", "JobSpec", "Run", "cancel", "download", "launch", "list_runs", "load_spec", "logs", "status", "wait"]


def __getattr__(name):
    # Lazy: `import autoslm` must stay fast and torch-free.
    if name in ("Client", "Run"):
        from autoslm import sdk

        return getattr(sdk, name)
    if name in ("JobSpec", "load_spec"):
        from autoslm import spec

        return getattr(spec, name)
    raise AttributeError(name)


def _client(home=None):
    from autoslm.sdk import Client

    return Client(home)


def launch(spec, *, detach: bool = False, home=None, on_update=None):
    """Launch a run from a JobSpec (path or object). Blocks until it ends unless ``detach``."""
    return _client(home).launch(spec, detach=detach, on_update=on_update)


def status(run_id: str, *, home=None) -> dict:
    return _client(home).status(run_id)


def wait(run_id: str, *, timeout: float | None = None, home=None) -> dict:
    return _client(home).wait(run_id, timeout=timeout)


def cancel(run_id: str, *, home=None) -> dict:
    return _client(home).cancel(run_id)


def logs(run_id: str, *, seed: int | None = None, home=None) -> str:
    path = _client(home).log_file(run_id, seed)
    return path.read_text(errors="replace") if path.exists() else ""


def download(run_id: str, to=None, *, home=None):
    return _client(home).download(run_id, to)


def list_runs(*, home=None) -> list[dict]:
    return _client(home).list_runs()
