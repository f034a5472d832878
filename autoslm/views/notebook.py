"""Notebook views of runs: pandas frames, matplotlib figures, a progress bar for ``Run.wait``.

Needs the ``notebook`` extra (``pip install 'autoslm[notebook]'``: pandas, matplotlib, tqdm). The CLI
never imports this module; the SDK imports it only inside the methods that need it, so a missing
extra is one clear error at that call, not at ``import autoslm``.
"""

from __future__ import annotations

from autoslm.errors import UsageError
from autoslm.views.runview import eval_rows, read_events, train_rows

# Columns a frame always has first, in this order (the rest follow as TRL logged them).
LEAD = [
    "seed",
    "step",
    "kind",
    "when",
    "loss",
    "learning_rate",
    "reward",
    "reward_std",
    "kl",
    "tokens_per_s",
    "eval_loss",
    "eval_score",
]


def _need(module: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(
            f"{module} is not installed: it comes with the notebook extra", hint="pip install 'autoslm[notebook]'"
        ) from None


def metrics_frame(events: list[dict]):
    """One row per (seed, step) of training, plus one row per held-out evaluation (kind == "eval")."""
    pd = _need("pandas")
    rows = train_rows(events) + eval_rows(events)
    df = pd.DataFrame(rows)
    if df.empty:
        return pd.DataFrame(columns=LEAD + ["time"])
    for col in LEAD:
        if col not in df.columns:
            df[col] = None if col in ("kind", "when") else float("nan")
    df["time"] = pd.to_datetime(df["time"], unit="s", utc=True)
    df = df.sort_values(["seed", "step", "kind"], kind="stable").reset_index(drop=True)
    return df[LEAD + [c for c in df.columns if c not in LEAD]]


def plot_frame(df, title: str = ""):
    """A matplotlib Figure: the loss (and reward, for GRPO) per step, and eval before/after."""
    _need("matplotlib")
    if _in_notebook():
        # pyplot sets up Jupyter's inline display; closing the figure leaves showing it to the cell's
        # return value (shown once, not twice).
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=(5 * n_panels(df), 3.6), layout="constrained")
        plt.close(fig)
    else:
        from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global figure list

        fig = Figure(figsize=(5 * n_panels(df), 3.6), layout="constrained")

    train = df[df["kind"] == "train"] if not df.empty else df
    evals = df[df["kind"] == "eval"] if not df.empty else df
    panels, eval_keys = _panels(df)
    axes = fig.subplots(1, n_panels(df), squeeze=False)[0]
    for ax, key in zip(axes, panels):
        for seed, g in train.groupby("seed"):
            g = g[g[key].notna()]
            ax.plot(g["step"], g[key].astype(float), label=f"seed{seed}")
        ax.set_title(key)
        ax.set_xlabel("step")
        ax.legend()
    if eval_keys:
        ax = axes[len(panels)]
        last = int(train["step"].max()) if not train.empty else 1
        for key in eval_keys:
            for seed, g in evals.groupby("seed"):
                g = g[g[key].notna()]
                x = [last if w == "after" else s for w, s in zip(g["when"], g["step"])]
                ax.plot(x, g[key].astype(float), marker="o", label=f"{key} seed{seed}")
        ax.set_title("eval before -> after")
        ax.set_xlabel("step")
        ax.legend()
    if title:
        fig.suptitle(title)
    return fig


def _panels(df) -> tuple[list[str], list[str]]:
    if df.empty:
        return [], []
    train, evals = df[df["kind"] == "train"], df[df["kind"] == "eval"]
    panels = [k for k in ("loss", "reward") if k in train.columns and train[k].notna().any()]
    eval_keys = [k for k in ("eval_loss", "eval_score") if k in evals.columns and evals[k].notna().any()]
    return panels, eval_keys


def n_panels(df) -> int:
    panels, eval_keys = _panels(df)
    return max(1, len(panels) + (1 if eval_keys else 0))


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython

        return get_ipython() is not None
    except ImportError:
        return False


def runs_frame(rows: list):
    """A frame of runs (``Client.list_runs``'s statuses), a row each."""
    pd = _need("pandas")
    cols = [
        "run_id",
        "name",
        "state",
        "phase",
        "step",
        "total_steps",
        "provider",
        "restarts",
        "cost_usd",
        "last_heartbeat_age_s",
        "created_at",
    ]
    df = pd.DataFrame([{c: getattr(r, c, None) for c in cols} for r in rows], columns=cols)
    df["created_at"] = pd.to_datetime(df["created_at"], unit="s", utc=True)
    return df


def wait_with_progress(client, run_id: str, *, timeout: float | None = None, poll_s: float | None = None):
    """``Client.wait`` with a progress bar (a widget in Jupyter, text elsewhere)."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return client.wait(run_id, timeout=timeout, poll_s=poll_s)
    bar = tqdm(total=None, desc=run_id, unit="step")

    def update(st) -> None:
        if st.total_steps and bar.total != st.total_steps:
            bar.total = st.total_steps
        bar.n = st.step or 0
        loss = st.first_seed.loss if st.first_seed else None
        bar.set_postfix_str(f"{st.state}" + (f" loss {loss:.3f}" if loss is not None else ""), refresh=False)
        bar.refresh()

    try:
        return client.wait(run_id, timeout=timeout, poll_s=poll_s, on_update=update)
    finally:
        bar.close()


def run_metrics(client, ref: str):
    return metrics_frame(read_events(client, ref))
