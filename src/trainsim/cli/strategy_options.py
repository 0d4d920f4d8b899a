"""The strategy flags of predict, search and measure, generated once from ParallelSpec's field descriptions.

A field `micro_batch` becomes `--micro-batch`, a bool field `sp` becomes `--sp/--no-sp`, a choice field lists
its choices (from the Literal that defines them, the same tuple jobfile checks). Every flag defaults to None,
"not given", so a job file's value stands unless the flag overrides it; the help shows the strategy's default.

A command takes the flags with the decorator `strategy_options(fields, ...)`: it declares one parameter
`strategy_flags: StrategyFlags = GIVEN` and receives the flags that were given, by field name. The decorator rewrites
the command's signature (inspect.Signature, which typer reads), putting the generated options where that
parameter stood, so `--help` lists them in place.
"""

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Annotated, Any, Literal, get_args, get_origin

import typer
from pydantic.fields import FieldInfo

from trainsim.strategy.parallel import ParallelSpec

STRATEGY_PARAM = "strategy_flags"
StrategyFlags = Mapping[str, Any]  # field name -> the value its flag was given
GIVEN: StrategyFlags = MappingProxyType({})  # the declared default; the decorator passes the given flags
ALL_FIELDS: tuple[str, ...] = tuple(ParallelSpec.model_fields)


def flag_name(field: str) -> str:
    """--kebab-case of a field name."""
    return "--" + field.replace("_", "-")


def choices_of(info: FieldInfo) -> tuple[str, ...]:
    """The allowed values of a choice (Literal) field; () for any other field."""
    annotation = info.annotation
    return tuple(get_args(annotation)) if get_origin(annotation) is Literal else ()


def field_help(field: str, note: str = "") -> str:
    """The field's description, its choices (each with its own help where the field gives one), and `note`
    (what a command adds: a restriction, how it runs the setting)."""
    info = ParallelSpec.model_fields[field]
    text = info.description or field
    choices = choices_of(info)
    if choices:
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        choice_help = extra.get("choice_help", {})
        assert isinstance(choice_help, dict)
        text += ": " + " | ".join(f"{c} ({choice_help[c]})" if c in choice_help else c for c in choices)
    return f"{text}; {note}" if note else text


def _shown_default(field: str) -> str:
    default = ParallelSpec.model_fields[field].default
    if isinstance(default, bool):
        kebab = field.replace("_", "-")
        return kebab if default else f"no-{kebab}"
    if isinstance(default, tuple):
        return ",".join(str(item) for item in default) or "none"
    return str(default)


def _option(field: str, note: str, default: str | None) -> inspect.Parameter:
    info = ParallelSpec.model_fields[field]
    decls = [f"{flag_name(field)}/--no-{field.replace('_', '-')}"] if info.annotation is bool else [flag_name(field)]
    # NB: the default is written into the help: the option's own default is None ("not given")
    shown = default if default is not None else _shown_default(field)
    option = typer.Option(*decls, help=f"{field_help(field, note)} (default {shown})", show_default=False)
    value_type: Any = bool if info.annotation is bool else int if info.annotation is int else str
    return inspect.Parameter(field, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                             annotation=Annotated[value_type | None, option])


def strategy_options(fields: Sequence[str] = ALL_FIELDS, *, notes: Mapping[str, str] | None = None,
                     defaults: Mapping[str, str] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the flags of the strategy fields `fields` (a subset of ParallelSpec's, in this order).

    notes: per field, text appended to the help (how this command treats the setting); defaults: per field, the
    default to show where the command's differs from the strategy's. The command receives the given flags as
    `strategy_flags` (field name -> value; flags left out are absent)."""
    notes, defaults = dict(notes or {}), dict(defaults or {})
    unknown = sorted((set(fields) | set(notes) | set(defaults)) - set(ALL_FIELDS))
    assert not unknown, f"not strategy fields: {unknown}"  # a programming error in a command, not user input

    def given(kwargs: dict[str, Any]) -> StrategyFlags:
        values = {field: kwargs.pop(field, None) for field in fields}
        return {field: value for field, value in values.items() if value is not None}

    return options_in_place_of(
        STRATEGY_PARAM, lambda: [_option(field, notes.get(field, ""), defaults.get(field)) for field in fields], given)


def options_in_place_of(placeholder: str, make_options: Callable[[], list[inspect.Parameter]],
                        fold: Callable[[dict[str, Any]], Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator giving a command the options make_options makes where it declares the parameter
    `placeholder` (its signature rewritten: typer reads it, and --help lists them in place); the command
    receives, as that parameter, what `fold` makes of the options' values (fold pops them from the keyword
    arguments)."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command)
        assert placeholder in signature.parameters, f"{command.__name__} lacks a {placeholder} parameter"
        params: list[inspect.Parameter] = []
        for param in signature.parameters.values():
            if param.name == placeholder:
                params += make_options()
            else:
                params.append(param)

        @functools.wraps(command)
        def with_flags(*args: Any, **kwargs: Any) -> Any:
            kwargs[placeholder] = fold(kwargs)
            return command(*args, **kwargs)

        with_flags.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        return with_flags

    return decorate
