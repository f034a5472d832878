"""The command line's plumbing over typer and click, kept apart from the commands themselves (cli.py).

Each piece makes the first screen cheaper or an error plainer: a flag's help shows no type, a plain
str/int/float/bool option is read without pydantic, only the invoked command is built, the top-level
help is click's plain format, and click's errors are caught without importing click to catch them.
"""

import os
import sys
from typing import NoReturn

import typer


def install_fast_paths() -> None:
    _flags_show_no_type()
    _plain_values_without_pydantic()


def _flags_show_no_type() -> None:
    """typer's help prints a type beside every option, "<bool>" beside a flag that takes no value
    (`--help <bool>`): a flag shows none."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich
    if getattr(shown, "autoslm_flags", False):
        return

    def display_type_rich(self, ctx):
        return None if self.is_flag else shown(self, ctx)

    display_type_rich.autoslm_flags = True
    TyperOption.display_type_rich = display_type_rich


class _PlainValue:
    """Reads a str, int, float or bool option the way click does, with no pydantic TypeAdapter."""

    def __init__(self, kind: type):
        self.kind = kind

    def coerce(self, value, param=None, ctx=None):
        if value is None or isinstance(value, self.kind):
            return value
        try:
            if self.kind is bool:
                return {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}[
                    str(value).strip().lower()
                ]
            return self.kind(value)
        except (TypeError, ValueError, KeyError):
            from typer._click.exceptions import BadParameter

            name = {int: "integer", float: "float", bool: "boolean"}.get(self.kind, self.kind.__name__)
            raise BadParameter(f"{value!r} is not a valid {name}.", ctx=ctx, param=param) from None


def _plain_values_without_pydantic() -> None:
    """typer reads every option's value through a pydantic TypeAdapter, and so imports pydantic (a third
    of the start of `status` or `list`) to read an int: a plain str, int, float or bool is read here instead
    (anything with a range, a choice, a list or a path still goes through typer's own)."""
    from typing import Union, get_args, get_origin

    try:  # typer's own internals (0.29): another typer reads values its way, only slower
        from typer.core import _TyperParameter

        built = _TyperParameter.get_runtime_param
    except (ImportError, AttributeError):
        return
    if getattr(built, "autoslm_plain", False):
        return

    def get_runtime_param(self):
        if self._runtime_param is None:
            d = self.type_descriptor
            kind = d.annotation
            if get_origin(kind) is Union and type(None) in get_args(kind) and len(get_args(kind)) == 2:
                kind = next(a for a in get_args(kind) if a is not type(None))
            if kind in (str, int, float, bool) and not d.is_ranged and not d.is_choice and not d.is_file:
                self._runtime_param = _PlainValue(kind)
        return built(self)

    get_runtime_param.autoslm_plain = True
    _TyperParameter.get_runtime_param = get_runtime_param


def click_errors():
    """(ClickException, UsageError, Abort) classes of typer's own copy of click, and of click itself
    where something loaded it (not loaded, it raised nothing: importing it only to catch would cost every command)."""
    mods = []
    try:
        from typer._click import exceptions as vendored

        mods.append(vendored)
    except ImportError:  # a typer that uses click itself
        import click  # noqa: F401 - loaded: sys.modules has it below
    if "click" in sys.modules:
        mods.append(sys.modules["click"].exceptions)

    def of(name: str) -> tuple:
        return tuple(getattr(m, name) for m in mods if hasattr(m, name))

    return of("ClickException"), of("UsageError"), of("Abort") + (typer.Abort,)


def usage_error(e, command_names: list[str]) -> None:
    """Usage line, the error, and the nearest command or option: then exit 2."""
    import difflib
    import re

    if type(e).__name__ == "NoArgsIsHelpError":  # `autoslm` alone: the help, on stdout, and exit 2
        sys.stdout.write(e.format_message() + "\n")
        sys.exit(2)
    ctx = getattr(e, "ctx", None)
    if ctx is not None:
        sys.stderr.write(ctx.get_usage() + "\n")
    msg = e.format_message()
    sys.stderr.write(f"error: {msg}\n")
    if "Did you mean" not in msg:
        m = re.search(r"No such command '([^']+)'", msg)
        if m:
            near = difflib.get_close_matches(m.group(1), sorted(command_names), n=1, cutoff=0.0)
            if near:
                sys.stderr.write(f"error: the nearest command is '{near[0]}'\n")
    sys.stderr.write("error: `autoslm --help` lists the commands; `autoslm COMMAND --help` their options\n")
    sys.exit(2)


def _name(c) -> str:
    return c.name or c.callback.__name__.replace("_", "-")


def command_names(app) -> list[str]:
    return [_name(c) for c in app.registered_commands]


def command_for(app, argv: list[str]):
    """The click group to run. typer builds every command's parameters before it runs one (a sixth of
    `status`'s start): when the first argument names a command, only that one is built."""
    import typer.main

    if argv and argv[0] in command_names(app):
        only = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, help=app.info.help)
        only.registered_commands = [c for c in app.registered_commands if _name(c) == argv[0]]
        return typer.main.get_group(only)
    command = typer.main.get_command(app)
    # `autoslm --help`, the first screen, in click's plain format: rich's would cost more than all the rest
    # of it (each command's own --help keeps rich's panels).
    command.rich_markup_mode = None
    for sub in command.commands.values():  # whole, wrapped: click would cut each at the terminal's width
        sub.short_help = sub.short_help or (sub.help or "").strip().split("\n\n")[0]
    return command


def console():
    """Every line printed whole: rich never hard-wraps it (soft wrap). A terminal folds a long line for
    the eye and copies it back as one; a pipe or a file gets it as written. Hard wrapping at the
    console's width (80 where the output is not a terminal) would break a path or a run id in two
    wherever the machine's paths happened to put the edge."""
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


class InterruptAnswered(Exception):
    """Raised by a command once it has answered Ctrl-C (said what keeps going and how to stop it):
    ``cli.main`` then ends the process with ``code`` at once (``leave_now``)."""

    def __init__(self, code: int = 0):
        super().__init__(code)
        self.code = code


def leave_now(code: int) -> NoReturn:
    """End the process at once, its output flushed. After Ctrl-C the user is owed nothing more, and the
    interpreter's own teardown (freeing every module and object it loaded) takes seconds on a loaded
    machine. A command is here only after every ``with`` it opened has closed: no transaction is open
    and no file half-written, so what is skipped is the teardown alone."""
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach the reader anyway
            pass
    os._exit(code)


def signals_interrupt() -> None:
    import signal

    def interrupt(signum, _frame):
        signal.signal(signum, signal.SIG_IGN)  # once: the teardown it starts must not be cut short again
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, interrupt)
