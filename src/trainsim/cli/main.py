"""Entry point of the `trainsim` command.

Commands load lazily: the command line names every command up front, but a command's module (and what it
imports: numpy, rich tables, the measurement harness) is imported only when that command runs or when help
lists the commands, so `trainsim predict` pays for the prediction path alone.
"""

import importlib
from typing import Any

import typer
from typer.core import TyperGroup
from typer.main import get_command_from_info

# command -> module under trainsim.cli, in the order help lists them. A module exposes `register(app)`, or
# (predict) a function named after its command.
COMMAND_MODULES: dict[str, str] = {
    "predict": "predict", "models": "catalog_cmds", "hardware": "catalog_cmds", "search": "search",
    "validate": "validate", "calibrate": "calibrate", "profile": "profile",
    "profile-embedding": "profile_embedding", "graph": "graph", "measure": "measure",
    "shard": "shard",
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


app = typer.Typer(
    help="trainsim: predict training iteration time, memory and the best parallel plan before using GPUs.",
    no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False, cls=LazyCommands,
)


@app.callback()
def _root() -> None:
    """trainsim: predict training iteration time, memory and the best parallel plan before using GPUs."""


def main() -> None:
    """Run the app; a usage mistake (bad flag, wrong type) is one line on stderr and exit code 2."""
    import sys

    from typer._click import exceptions as click_errors  # typer vendors click; its errors live here

    try:
        code = app(standalone_mode=False)
    except click_errors.NoArgsIsHelpError as exc:
        print(exc.ctx.get_help() if exc.ctx else "trainsim --help")
        sys.exit(0)
    except click_errors.ClickException as exc:
        print(f"error: {exc.format_message()}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
