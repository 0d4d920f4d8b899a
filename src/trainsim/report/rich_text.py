"""Rich tables rendered to a string, exactly as rich would print them on standard output."""

import io

from rich.console import Console, RenderableType


def to_text(*items: RenderableType, width: int | None = None, terminal: bool = False) -> str:
    """Each item printed on its own line(s). A str is printed as is (no markup, no highlighting).

    width None is rich's own rule for standard output: $COLUMNS, else the terminal's width, else 80 columns.
    terminal True keeps the styles (bold headers) for a terminal; False leaves plain text, unless the
    FORCE_COLOR or TTY_COMPATIBLE variable asks for styles, as rich does for standard output."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=True if terminal else None)
    for item in items:
        if isinstance(item, str):
            console.print(item, markup=False, highlight=False)
        else:
            console.print(item)
    return buffer.getvalue()
