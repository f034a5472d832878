"""The question before a command rents a GPU (`launch`, and an export or a serve on a provider): the
plan's offers, then "VERB on PROVIDER GPU at $X/hour?" (or --yes). No usable offer ends the command,
saying why."""

from __future__ import annotations

import sys

import typer


def confirm_offer(verb: str, spec, plan, console, *, yes: bool) -> None:
    """Show ``spec``'s offers and ask before renting; ``plan`` is (plan_rows, render_plan, no_offers) as the
    CLI builds them. Returns when the user agreed (or passed --yes); ends the command otherwise."""
    from autoslm.errors import UsageError

    plan_rows, render_plan, no_offers = plan
    problems: dict[str, str] = {}
    rows = plan_rows(spec, problems=problems)
    usable = [r for r in rows if r.get("usable", True)]
    if not usable:
        if rows:
            render_plan(spec, rows[:5], problems)
        raise typer.Exit(no_offers(console, rows))
    render_plan(spec, usable[:5], problems)
    best = usable[0]
    if not yes:
        if not sys.stdin.isatty():
            raise UsageError("refusing to rent a GPU without confirmation (no terminal to ask on): pass --yes")
        typer.confirm(f"{verb} on {best['provider']} {best['gpu']} at ${best['price_per_hour']:.3f}/hour?", abort=True)
