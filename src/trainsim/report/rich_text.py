"""Rich tables rendered to a string, exactly as rich would print them on standard output."""

import io
from typing import Any

from rich import box
from rich.console import Console, RenderableType
from rich.table import Table


def compact_table(*headers: str, **options: Any) -> Table:
    """A table that fits a narrow terminal: a rule under the header only, one space between columns, and the
    first column (the name) kept whole; on a terminal too narrow rich narrows the widest other columns first
    and their cells wrap (fold), none is cut."""
    table = Table(*headers, box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, collapse_padding=True, **options)
    table.columns[0].no_wrap = True
    return table


def fold(table: Table) -> Table:
    """A cell too wide for its column wraps onto the next line, never ends in an ellipsis: what is printed is
    complete at any width (columns that cannot wrap, no_wrap=True, are the table's choice to keep whole)."""
    for column in table.columns:
        column.overflow = "fold"
    return table


def to_text(*items: RenderableType, width: int | None = None, terminal: bool = False) -> str:
    """Each item printed on its own line(s). A str is printed as is (no markup, no highlighting).

    width None is rich's own rule for standard output: $COLUMNS, else the terminal's width, else 80 columns.
    terminal True keeps the styles (bold headers) for a terminal; False leaves plain text, unless the
    FORCE_COLOR or TTY_COMPATIBLE variable asks for styles, as rich does for standard output."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=True if terminal else None)
    for item in items:
        if isinstance(item, Table):
            fold(item)
        if isinstance(item, str):
            console.print(item, markup=False, highlight=False)
        else:
            console.print(item)
    return buffer.getvalue()
