"""Inline SVG line plots for ``udpo report`` (no plotting library: the page must stand alone).

:func:`line_plot` draws one or more series of ``(x, y)`` points on shared axes with ticks, a legend
and a hover title on every point. Missing values (None, NaN) break a line rather than bend it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

#: line colours, one per series in order (colour-blind-safe Okabe-Ito, then greys)
PALETTE = ("#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#f0e442", "#000000", "#888888")

Series = Sequence[tuple[float, float | None]]


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    k = 0
    while start + k * step <= hi + step * 1e-9:
        ticks.append(round(start + k * step, 12))
        k += 1
    if ticks and ticks[-1] < hi:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def fmt(x: float) -> str:
    """A tick or hover label: short, without trailing zeros."""
    if x == 0:
        return "0"
    if abs(x) >= 1e4 or abs(x) < 1e-3:
        return f"{x:.2g}"
    return f"{x:.4g}"


def line_plot(
    series: Mapping[str, Series],
    title: str,
    xlabel: str = "iteration",
    ylabel: str = "",
    width: int = 460,
    height: int = 250,
) -> str:
    """An ``<svg>`` element plotting each named series; "" when no series has a finite point."""
    clean = {
        name: [(float(x), None if y is None or not math.isfinite(y) else float(y)) for x, y in points]
        for name, points in series.items()
    }
    xs = [x for pts in clean.values() for x, y in pts if y is not None]
    ys = [y for pts in clean.values() for _, y in pts if y is not None]
    if not ys:
        return ""
    legend_rows = (len(clean) + 1) // 2  # two legend entries a row
    left, right, top, bottom = 52, 12, 26, 40 + 15 * legend_rows
    total_height = height + 15 * legend_rows
    plot_w, plot_h = width - left - right, total_height - top - bottom
    xt = nice_ticks(min(xs), max(xs))
    yt = nice_ticks(min(ys), max(ys))
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * plot_w if x1 > x0 else left + plot_w / 2

    def py(y: float) -> float:
        return top + plot_h - (y - y0) / (y1 - y0) * plot_h if y1 > y0 else top + plot_h / 2

    parts = [
        f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total_height}" '
        f'viewBox="0 0 {width} {total_height}" role="img" aria-label="{escape(title)}">',
        f'<text x="{width / 2:.0f}" y="16" text-anchor="middle" class="plot-title">{escape(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" class="plot-area"/>',
    ]
    for y in yt:
        parts.append(
            f'<line x1="{left}" x2="{left + plot_w}" y1="{py(y):.1f}" y2="{py(y):.1f}" class="grid"/>'
        )
        parts.append(
            f'<text x="{left - 4}" y="{py(y) + 4:.1f}" text-anchor="end" class="tick">{fmt(y)}</text>'
        )
    for x in xt:
        parts.append(
            f'<text x="{px(x):.1f}" y="{top + plot_h + 14}" text-anchor="middle" class="tick">{fmt(x)}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.0f}" y="{top + plot_h + 30}" text-anchor="middle" class="axis">'
        f"{escape(xlabel)}</text>"
    )
    if ylabel:
        parts.append(
            f'<text transform="translate(12 {top + plot_h / 2:.0f}) rotate(-90)" text-anchor="middle" '
            f'class="axis">{escape(ylabel)}</text>'
        )
    for k, (name, points) in enumerate(clean.items()):
        colour = PALETTE[k % len(PALETTE)]
        for segment in _segments(points):
            coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in segment)
            parts.append(f'<polyline points="{coords}" fill="none" stroke="{colour}" stroke-width="1.6"/>')
        for x, y in points:
            if y is not None:
                parts.append(
                    f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.4" fill="{colour}">'
                    f"<title>{escape(name)}: {fmt(x)}, {fmt(y)}</title></circle>"
                )
        lx, ly = left + (k % 2) * (plot_w // 2), top + plot_h + 46 + 15 * (k // 2)
        parts.append(
            f'<line x1="{lx}" x2="{lx + 18}" y1="{ly - 4}" y2="{ly - 4}" stroke="{colour}" stroke-width="2"/>'
        )
        parts.append(f'<text x="{lx + 24}" y="{ly}" class="legend">{escape(name)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _segments(points: list[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    """Runs of consecutive finite points (a missing value ends a line)."""
    out: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if y is None:
            if out[-1]:
                out.append([])
        else:
            out[-1].append((x, y))
    return [s for s in out if s]
