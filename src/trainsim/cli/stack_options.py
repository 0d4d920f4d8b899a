"""The training-stack flags of predict, search and validate: --stack NAME and one flag per behaviour, generated
from StackSpec's fields as cli/strategy_options.py generates the strategy flags (a bool behaviour becomes
--name/--no-name, the others take a value). Every flag defaults to None, "not given".

A command declares one parameter `stack_flags: StackFlags = GIVEN_STACK` and receives {"stack": name,
"overrides": {behaviour: value}} with what was given. The stack's attention kernel has no flag here: the
strategy's --attention sets the job's kernel, and wins over the stack's.
"""

import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal, get_args, get_origin

import typer

from trainsim.cli.strategy_options import options_in_place_of
from trainsim.strategy.stack import BEHAVIOURS, StackSpec, stack_names

STACK_PARAM = "stack_flags"
StackFlags = Mapping[str, Any]
GIVEN_STACK: StackFlags = MappingProxyType({})
STACK_FLAG_FIELDS: tuple[str, ...] = tuple(name for name in BEHAVIOURS if name != "attention")


def _option(field: str) -> inspect.Parameter:
    info = StackSpec.model_fields[field]
    flag = "--" + field.replace("_", "-")
    decls = [f"{flag}/--no-{field.replace('_', '-')}"] if info.annotation is bool else [flag]
    literal = get_origin(info.annotation) is Literal
    choices = f"; one of {' | '.join(get_args(info.annotation))}" if literal else ""
    option = typer.Option(*decls, help=f"stack behaviour: {info.description}{choices} (default: the stack's)",
                          show_default=False)
    value_type: Any = bool if info.annotation is bool else int if info.annotation is int else \
        str if literal else float
    return inspect.Parameter(field, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                             annotation=Annotated[value_type | None, option])


def _stack_option(help_text: str) -> inspect.Parameter:
    option = typer.Option("--stack", help=help_text + ": " + " | ".join(stack_names()), show_default=False)
    return inspect.Parameter("stack", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                             annotation=Annotated[str | None, option])


def stack_options(help_text: str = "training stack (catalog/data/stacks; default generic)"
                  ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command --stack and the behaviour flags; it receives them as `stack_flags`."""

    def given(kwargs: dict[str, Any]) -> StackFlags:
        name = kwargs.pop("stack", None)
        values = {field: kwargs.pop(field, None) for field in STACK_FLAG_FIELDS}
        return {"stack": name, "overrides": {key: value for key, value in values.items() if value is not None}}

    return options_in_place_of(
        STACK_PARAM, lambda: [_stack_option(help_text), *(_option(field) for field in STACK_FLAG_FIELDS)], given)
