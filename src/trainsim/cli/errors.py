"""Turn TrainsimError into one line on stderr and exit code 2, never a traceback."""

import functools
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import typer

from trainsim.errors import TrainsimError, one_line

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

    return wrapper
