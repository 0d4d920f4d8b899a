"""Entry point of the `trainsim` command."""

import typer

from trainsim.cli import predict as predict_cmd

app = typer.Typer(
    help="trainsim: predict training iteration time, memory and the best parallel plan before using GPUs.",
    no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
)
app.command("predict")(predict_cmd.predict)


@app.callback()
def _root() -> None:
    """trainsim: predict training iteration time, memory and the best parallel plan before using GPUs."""



def _register_optional() -> None:
    """Commands that live in their own modules; each module exposes `register(app)`."""
    import importlib

    for module in ("catalog_cmds", "search", "validate", "calibrate", "profile", "graph", "measure"):
        try:
            mod = importlib.import_module(f"trainsim.cli.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"trainsim.cli.{module}":
                raise
            continue
        mod.register(app)


_register_optional()


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
