"""The training worker: ``python -m autoslm.engine`` (a provider starts it; see engine/context.py)."""

from autoslm.engine.runner import run_worker

if __name__ == "__main__":
    raise SystemExit(run_worker())
