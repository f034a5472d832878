"""What `plan`, `launch` and `serve` show before anything is rented: the data check, the offers (one
row each) and the plan table with its best offer. Light to import: everything heavier is imported inside the function that needs it."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from autoslm.views.cli_kit import console as _console


def check_data(s, plan_only: Path | None = None) -> None:
    """A Hub dataset must exist and have usable columns (and an lm-eval task's data exist) before offers
    are shown or a pod is rented.
    ``plan_only`` (the spec's path): only prices are asked for, so a Hub that cannot be reached is a
    warning on stderr, not the end (`launch` checks again before renting)."""
    from autoslm.errors import StoreUnavailable
    from autoslm.store.hub_check import check_data

    try:
        check_data(s)
    except StoreUnavailable as e:
        if plan_only is None:
            raise
        sys.stderr.write(
            f"warning: {plan_only}: {e.message}; the plan below assumes the data is there, "
            "and `autoslm launch` checks it again before renting\n"
        )


def plan_rows(s, keyless: bool = False, problems: dict[str, str] | None = None, lookup: bool = False) -> list[dict]:
    """Offers for the spec. ``keyless``: a provider without a key still shows what it can (autoslm.controller.keyless).
    ``problems``, when given, receives why a provider could not be asked (said under the table instead of logged).
    ``lookup``: `plan` only looks, so each provider is tried once; a launch keeps the retries."""
    if s.compute.is_local:
        from autoslm.providers.local.provider import describe_processes

        n = s.compute.gpu_count
        return [
            {
                "provider": "local",
                "gpu": describe_processes(n, s.compute.nodes) or "this machine",
                "gpu_count": n,
                "price_per_hour": 0.0,
                "fits": True,
                "estimated_cost_usd": 0.0,
            }
        ]
    from dataclasses import asdict

    from autoslm.controller.placement import plan_placement
    from autoslm.providers import get_provider

    notes: dict[str, str] = {}
    if keyless:
        from autoslm.controller.keyless import plan_providers

        providers, notes = plan_providers(s.compute.providers)
    else:
        providers = {n: get_provider(n) for n in s.compute.providers}
    from autoslm.controller.images import choose_image, pod_vllm

    # What generates on each provider's pod decides the memory plan (vLLM's share or generate()'s KV);
    # the image the pods start (published or bootstrap), their set-up time.
    placement = plan_placement(
        s, providers, lookup=lookup, pod_vllm=lambda name: pod_vllm(s, name), image_mode=choose_image(s.compute.image).mode
    )
    if not placement.offers and placement.problems and len(placement.problems) == len(providers):
        raise next(iter(placement.problems.values()))  # as plan_offers: no provider answered, say why
    if problems is not None:  # each unreachable provider, to be said under the table
        problems.update({name: str(e) for name, e in placement.problems.items()})
    rows = [asdict(p) if not isinstance(p, dict) else p for p in placement.offers]
    for r in rows:
        if r["provider"] in notes:
            r["price_source"] = "catalog" if r.get("location") == "catalog" else "live"
            r["note"] = notes[r["provider"]] + (f"; {r['note']}" if r.get("note") else "")
    return rows


def render_plan(s, rows: list[dict], problems: dict[str, str] | None = None) -> None:
    import shutil

    from autoslm.views.plan import plan_table, wrap

    if not rows:
        _console().print("no offers match: try another gpu, a higher max_price_per_hour, or interruptible = true")
        raise typer.Exit(3)
    width = shutil.get_terminal_size().columns
    lines = [plan_table(rows, width, title=f"offers for {s.name} ({s.model})", problems=problems)]
    # The offer a launch takes, in one line that scripts can read.
    best = next((r for r in rows if r.get("usable", True)), None)
    if best is not None:
        est, most = best.get("estimated_cost_usd"), best.get("max_cost_usd")
        cost = (f"estimated cost ${est:.2f}" if est is not None else "estimated cost unknown") + (
            f", at most ${most:.2f} within the limits" if most is not None else ""
        )
        source = " (catalog price, not a live offer)" if best.get("price_source") == "catalog" else ""
        price, pods = best["price_per_hour"], best.get("nodes") or 1
        what = (
            f"{best['gpu']} at ${price:.3f}/hour"
            if pods == 1
            else f"{pods} pods of {best['gpu']} at ${price * pods:.3f}/hour (${price:.3f} each)"
        )
        lines.append(wrap(f"best offer: {best['provider']} {what}{source}; {cost}", width))
    if not s.compute.is_local:
        from autoslm.controller.images import describe

        lines += [wrap(describe(s), width), wrap(_on_the_pod(s), width)]
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()


def _on_the_pod(s) -> str:
    """What the pod runs, in one line: the training recipe (``recipe_summary``), or a serve's server."""
    if s.kind == "serve":
        a = s.adapter
        return f"on the pod: vLLM's OpenAI server, {s.model} with the adapter of run {a.source_run} (rank {a.lora_rank}) as model {a.lora_name}"
    from autoslm.catalog.spec_checks import recipe_summary

    return recipe_summary(s)


def no_offers(console, rows: list[dict]) -> int:
    """One line on what to change when nothing can be rented: the limit every offer fails, where they agree."""
    from autoslm.controller.placement import NO_OFFER_HINT, unusable_hint

    said = (
        f"no offer is usable: {unusable_hint([r.get('note') or '' for r in rows])}"
        if rows
        else f"no offers match: {NO_OFFER_HINT}"
    )
    console.print(said, markup=False)
    return 3


def confirm_best(s, console, *, yes: bool) -> None:
    """`launch` on a rented GPU: show the usable offers (or say why none is), then ask before renting the
    best one (``yes``: do not ask; no terminal to ask on: refuse, before anything is rented). The same
    question as a rented export's or serve's (views/rented.py)."""
    from autoslm.views.rented import confirm_offer

    confirm_offer("launch", s, (plan_rows, render_plan, no_offers), console, yes=yes)
