"""Inline SVG charts (pure): a sparkline and a horizontal bar chart.

Every text is XML-escaped; numbers are formatted with fixed precision so the output is
deterministic (the unit tests compare it).
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape


def _n(value: float) -> str:
    return f"{value:.1f}".rstrip("0").rstrip(".")


def sparkline_svg(
    values: Sequence[float], width: int = 120, height: int = 24, *, label: str = ""
) -> str:
    """A polyline of ``values`` (oldest first) scaled to the box; the last point is
    marked. An empty series draws an empty box with a dash."""
    title = f"<title>{escape(label)}</title>" if label else ""
    box = (
        f'<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img"'
        f' aria-label="{escape(label or "trend")}">{title}'
    )
    if not values:
        mid = _n(height / 2)
        return f'{box}<line x1="0" y1="{mid}" x2="{width}" y2="{mid}" class="none"/></svg>'
    pad = 2.0
    top, bottom = max(values), min(0.0, min(values))
    span = (top - bottom) or 1.0
    step = (width - 2 * pad) / max(len(values) - 1, 1)

    def y(v: float) -> float:
        return height - pad - (v - bottom) / span * (height - 2 * pad)

    points = " ".join(f"{_n(pad + i * step)},{_n(y(v))}" for i, v in enumerate(values))
    last_x, last_y = _n(pad + (len(values) - 1) * step), _n(y(values[-1]))
    return (
        f'{box}<polyline fill="none" stroke="currentColor" stroke-width="1.5" '
        f'points="{points}"/><circle cx="{last_x}" cy="{last_y}" r="2"/></svg>'
    )


def bar_chart_svg(
    bars: Sequence[tuple[str, float]],
    *,
    unit: str = "",
    width: int = 560,
    bar_height: int = 22,
    chart_id: str = "",
) -> str:
    """Horizontal bars, one per (label, value), longest = the largest value. Each bar
    carries ``data-label`` and ``data-value`` attributes."""
    label_w, value_w, gap = 170, 80, 4
    plot_w = width - label_w - value_w
    height = max(len(bars), 1) * (bar_height + gap) + gap
    top = max((v for _, v in bars), default=0.0) or 1.0
    ident = f' id="{escape(chart_id)}"' if chart_id else ""
    out = [
        f'<svg class="bars"{ident} xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img">'
    ]
    if not bars:
        out.append(f'<text x="4" y="{bar_height - 6}" class="muted">nothing to show</text>')
    for i, (label, value) in enumerate(bars):
        y = gap + i * (bar_height + gap)
        w = max(value, 0.0) / top * plot_w
        text = f"{_n(value)}{unit}"
        out.append(
            f'<g class="bar" data-label="{escape(label)}" data-value="{_n(value)}">'
            f'<text x="{label_w - 6}" y="{y + bar_height - 6}" text-anchor="end">'
            f"{escape(label)}</text>"
            f'<rect x="{label_w}" y="{y}" width="{_n(w)}" height="{bar_height}"/>'
            f'<text x="{_n(label_w + w + 4)}" y="{y + bar_height - 6}">{escape(text)}</text>'
            "</g>"
        )
    out.append("</svg>")
    return "".join(out)
