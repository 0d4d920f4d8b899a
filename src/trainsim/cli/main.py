"""Entry point of the `trainsim` command.

Commands load lazily: the command line names every command up front, but a command's module (and what it
imports: numpy, rich tables, the measurement harness) is imported only when that command runs or when help
lists the commands, so `trainsim predict` pays for the prediction path alone.
"""

import gc
import importlib
import os
from typing import Annotated, Any

import typer
from typer.core import TyperGroup
from typer.main import get_command_from_info, get_group_from_info

# command -> module under trainsim.cli, in the order help lists them. A module exposes `register(app)`, or
# (predict) a function named after its command.
COMMAND_MODULES: dict[str, str] = {
    "predict": "predict", "models": "catalog_cmds", "hardware": "catalog_cmds", "search": "search",
    "validate": "validate", "compare": "compare", "report": "report", "calibrate": "calibrate",
    "profile": "profile", "profile-embedding": "profile_embedding", "graph": "graph", "measure": "measure",
    "shard": "shard", "stages": "stages",
}


class LazyCommands(TyperGroup):
    """The root group: builds a command from its module the first time it is asked for."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*COMMAND_MODULES, *(name for name in self.commands if name not in COMMAND_MODULES)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in self.commands and cmd_name in COMMAND_MODULES:
            self._load(COMMAND_MODULES[cmd_name], cmd_name)
        return self.commands.get(cmd_name)

    def _load(self, module_name: str, cmd_name: str) -> None:
        try:
            module = importlib.import_module(f"trainsim.cli.{module_name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"trainsim.cli.{module_name}":
                raise
            return  # an optional command that is not installed
        commands = typer.Typer()
        if hasattr(module, "register"):
            module.register(commands)
        else:
            commands.command(cmd_name)(getattr(module, cmd_name))
        for info in commands.registered_commands:
            command = get_command_from_info(info, pretty_exceptions_short=app.pretty_exceptions_short,
                                            rich_markup_mode=app.rich_markup_mode)
            if command.name:
                self.commands[command.name] = command
        for group_info in commands.registered_groups:  # a command with subcommands (stages collect | ...)
            group = get_group_from_info(group_info, pretty_exceptions_short=app.pretty_exceptions_short,
                                        suggest_commands=True, rich_markup_mode=app.rich_markup_mode)
            if group.name:
                self.commands[group.name] = group


app = typer.Typer(
    help="trainsim: predict training iteration time, memory and the best parallel plan before using GPUs.",
    no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False, cls=LazyCommands,
)


def _print_version(value: bool) -> None:
    if value:
        from trainsim.version import __version__

        typer.echo(f"trainsim {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", help="print the version and exit", is_eager=True,
                                                callback=_print_version)] = False) -> None:
    """trainsim: predict training iteration time, memory and the best parallel plan before using GPUs."""
    _start_up.end()  # the command's module is loaded: the garbage collector runs again while it works


class _StartUp:
    """The process's start-up, as `main` runs it: the cyclic garbage collector paused while the command line and
    the command's module load, and frozen (gc.freeze) when they have loaded and when the process exits.

    Loading makes ~38,000 objects the collector tracks (modules' dicts, classes, functions, pydantic schemas),
    nearly all living as long as the process: without the pause, the collector walks them again and again while
    they load (~4% of `trainsim predict`); at exit CPython clears the modules and its last collection frees the
    cycles that leaves (~13%); frozen, they are left to the operating system (atexit handlers and the standard
    streams' flush run as before). The command itself runs with the collector on, as before; it only no longer
    walks the frozen start-up objects. Only `main` (the `trainsim` process) pauses anything: a caller of
    `command_line` in its own process (the fuzz harness) keeps its collector as it is."""

    def __init__(self) -> None:
        self.paused = False

    def begin(self) -> None:
        if gc.isenabled():
            gc.disable()
            self.paused = True

    def end(self) -> None:
        if self.paused:
            self.paused = False
            gc.freeze()
            gc.enable()


_start_up = _StartUp()


def main() -> None:
    """The `trainsim` process (the console script and `python -m trainsim`): command_line() with the start-up
    tuned for a process that ends when the command does (_StartUp). Pydantic's plugins are off unless the
    environment says otherwise (PYDANTIC_DISABLE_PLUGINS, pydantic/plugin/_loader.py, pydantic 2.x): looking
    them up reads the entry points of every installed distribution (importlib.metadata) when the first spec
    is validated; trainsim's specs take no plugin. `PYDANTIC_DISABLE_PLUGINS=` (empty) loads them again."""
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    _start_up.begin()
    try:
        command_line()
    finally:
        _start_up.end()
        gc.freeze()  # what the command made, too: nothing left for the collector at exit


def command_line() -> None:
    """Run the app; a usage mistake (bad flag, wrong type) is one line on stderr and exit code 2.

    typer's usage errors are click's exceptions, which typer vendors in a private module; they are recognized
    by their interface (format_message, exit_code; the no-arguments case by its class name), so no private
    module is imported."""
    import sys


    try:
        code = app(standalone_mode=False)
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":
            ctx = getattr(exc, "ctx", None)
            print(ctx.get_help() if ctx is not None else "trainsim --help")
            sys.exit(0)
        message, exit_code = getattr(exc, "format_message", None), getattr(exc, "exit_code", None)
        if not callable(message) or not isinstance(exit_code, int):
            raise
        print(f"error: {message()}", file=sys.stderr)
        sys.exit(exit_code)
    sys.exit(code if isinstance(code, int) else 0)
