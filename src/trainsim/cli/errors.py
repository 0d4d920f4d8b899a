"""Turn TrainsimError into one line on stderr and exit code 2, never a traceback."""

import functools
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import typer
from pydantic import ValidationError

from trainsim.catalog.files import shown_path
from trainsim.errors import TrainsimError, one_line
from trainsim.specbase import config_error_from

P = ParamSpec("P")
R = TypeVar("R")


def handles_errors(command: Callable[P, R]) -> Callable[P, R]:
    @functools.wraps(command)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except TrainsimError as exc:
            print(one_line(f"error: {exc}"), file=sys.stderr)
            raise typer.Exit(2) from None
        except OSError as exc:  # a path the user named: too long, unreadable, a folder where a file was expected
            name = f"{shown_path(exc.filename)}: " if exc.filename is not None else ""
            print(one_line(f"error: {name}{exc.strerror or type(exc).__name__}"), file=sys.stderr)
            raise typer.Exit(2) from None
        except ValidationError as exc:  # a spec built from user input without Spec.parse: the same one line
            print(one_line(f"error: {config_error_from(exc)}"), file=sys.stderr)
            raise typer.Exit(2) from None

    return wrapper
