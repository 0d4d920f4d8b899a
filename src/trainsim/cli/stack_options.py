"""The training-stack flags of predict, search and validate: --stack NAME and one flag per behaviour, generated
from StackSpec's fields as cli/strategy_options.py generates the strategy flags (a bool behaviour becomes
--name/--no-name, the others take a value). Every flag defaults to None, "not given".

A command declares one parameter `stack_flags: StackFlags = GIVEN_STACK` and receives {"stack": name,
"overrides": {behaviour: value}} with what was given. The stack's attention kernel has no flag here: the
strategy's --attention sets the job's kernel, and wins over the stack's.
"""

import functools
import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal, get_args, get_origin

import typer

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

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command)
        assert STACK_PARAM in signature.parameters, f"{command.__name__} lacks a {STACK_PARAM} parameter"
        params: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            if param.name == STACK_PARAM:
                params += [_stack_option(help_text), *(_option(field) for field in STACK_FLAG_FIELDS)]
            else:
                params.append(param)

        @functools.wraps(command)
        def with_flags(*args: Any, **kwargs: Any) -> Any:
            name = kwargs.pop("stack", None)
            given = {field: kwargs.pop(field, None) for field in STACK_FLAG_FIELDS}
            kwargs[STACK_PARAM] = {"stack": name,
                                   "overrides": {key: value for key, value in given.items() if value is not None}}
            return command(*args, **kwargs)

        with_flags.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        return with_flags

    return decorate
