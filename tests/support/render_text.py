"""dsctl rendering's unit-test helper: a rendered table as plain text."""

from __future__ import annotations

from rich.console import Console


def text_of(renderable: object) -> str:
    console = Console(width=250, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()
