"""Small charts as inline SVG (no library, no network): horizontal bars (grouped or stacked) and a
line chart. Every chart is an ``<svg class="chart">`` whose marks carry ``data-series``,
``data-row`` and ``data-value`` and a ``<title>`` (the browser's tooltip), and whose legend names
every series, so a test (or a reader's script) can check what was drawn.
"""

from __future__ import annotations

import math
from html import escape

PALETTE = ("#4269d0", "#efb118", "#ff725c", "#6cc5b0", "#3ca951", "#ff8ab7", "#a463f2", "#97bbf5", "#9c6b4e", "#9498a0")
WIDTH = 760
ROW = 20
LABEL_W = 190
RIGHT_PAD = 90
#: a legend line's height, and the longest name a legend entry shows whole
LEGEND_LINE = 18
LEGEND_CHARS = 70


def fmt(v: float) -> str:
    """A number for a label: thousands separators, at most 3 significant decimals."""
    if v == int(v) and abs(v) >= 1:
        return f"{int(v):,}"
    return f"{v:,.3g}"


def nice_max(v: float) -> float:
    """The axis end: 1, 2, 2.5 or 5 times a power of ten, at least ``v``."""
    if v <= 0:
        return 1.0
    p = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if m * p >= v:
            return m * p
    return 10 * p


def _legend(series: list[str], colors: dict[str, str], y: float) -> tuple[str, float]:
    """The legend above a chart, wrapped to the chart's width (a long name, e.g. a filter's SQL, is
    cut with an ellipsis; the full name stays in ``data-series`` and the tooltip); its height."""
    out, x, line_y = [f'<g class="legend" transform="translate({LABEL_W},{y})">'], 0.0, 0.0
    room = WIDTH - LABEL_W
    for s in series:
        text = s if len(s) <= LEGEND_CHARS else s[:LEGEND_CHARS - 1] + "…"
        w = 28 + 7 * len(text)
        if x and x + w - 6 > room:
            x, line_y = 0.0, line_y + LEGEND_LINE
        out.append(f'<g class="legend-item" data-series="{escape(s)}" transform="translate({x:.0f},{line_y:.0f})" tabindex="0">'
                   f'<title>{escape(s)}</title><rect class="hit" x="-2" y="-2" width="{w - 6}" height="16" fill="#fff" fill-opacity="0"/>'
                   f'<rect width="12" height="12" fill="{colors[s]}"/><text x="16" y="10">{escape(text)}</text></g>')
        x += w
    out.append("</g>")
    return "".join(out), line_y + LEGEND_LINE - 2


def _svg(chart_id: str, title: str, height: float, series: list[str], body: str) -> str:
    return (f'<svg class="chart" id="{escape(chart_id)}" role="img" aria-label="{escape(title)}" '
            f'data-series="{escape("|".join(series))}" viewBox="0 0 {WIDTH} {height:.0f}" width="{WIDTH}" height="{height:.0f}" '
            f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>{body}</svg>')


def _axis(x0: float, x1: float, top: float, bottom: float, vmax: float, unit: str) -> str:
    out = []
    for i in range(5):
        v = vmax * i / 4
        x = x0 + (x1 - x0) * i / 4
        out.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{bottom}"/>'
                   f'<text class="tick" x="{x:.1f}" y="{bottom + 12}" text-anchor="middle">{fmt(v)}</text>')
    if unit:
        out.append(f'<text class="unit" x="{x1:.1f}" y="{bottom + 26}" text-anchor="end">{escape(unit)}</text>')
    return "".join(out)


def hbars(chart_id: str, title: str, rows: list[tuple[str, dict[str, float]]], series: list[str], unit: str = "",
          stacked: bool = False, notes: dict[str, str] | None = None) -> str:
    """One row per label: its series' values side by side (grouped) or end to end (stacked).
    ``notes`` adds a text after a row's bars (e.g. a rate)."""
    colors = {s: PALETTE[i % len(PALETTE)] for i, s in enumerate(series)}
    per_row = 1 if stacked else max(1, len(series))
    row_h = ROW * per_row + 8
    legend, legend_h = _legend(series, colors, 4)
    top = 4 + legend_h + 6
    totals = [sum(v.values()) if stacked else max(v.values(), default=0) for _, v in rows]
    vmax = nice_max(max(totals, default=0))
    x0, x1 = LABEL_W, WIDTH - RIGHT_PAD
    bottom = top + row_h * len(rows)
    parts = [legend, _axis(x0, x1, top, bottom, vmax, unit)]
    for r, (label, values) in enumerate(rows):
        y = top + r * row_h + 4
        parts.append(f'<text class="row-label" x="{x0 - 6}" y="{y + row_h / 2 + 1:.1f}" text-anchor="end">{escape(label)}</text>')
        x = x0
        for i, s in enumerate(series):
            if s not in values:
                continue
            v = values[s]
            w = (x1 - x0) * v / vmax
            by = y if stacked else y + i * ROW
            bx = x if stacked else x0
            parts.append(f'<rect class="bar" data-series="{escape(s)}" data-row="{escape(label)}" data-value="{v}" x="{bx:.1f}" '
                         f'y="{by:.1f}" width="{max(w, 0.5):.1f}" height="{ROW - 4}" fill="{colors[s]}">'
                         f'<title>{escape(label)} · {escape(s)}: {fmt(v)}{(" " + escape(unit)) if unit else ""}</title></rect>')
            if not stacked:
                parts.append(f'<text class="value" x="{bx + w + 4:.1f}" y="{by + ROW - 8:.1f}">{fmt(v)}</text>')
            x += w if stacked else 0
        if stacked:
            note = (notes or {}).get(label, fmt(sum(values.values())))
            parts.append(f'<text class="value" x="{x + 4:.1f}" y="{y + ROW - 8:.1f}">{escape(note)}</text>')
    return _svg(chart_id, title, bottom + 34, series, "".join(parts))


def line(chart_id: str, title: str, points: list[tuple[float, float]], series: str, x_label: str, y_label: str) -> str:
    """One series as a line over x (e.g. the training loss per step), with a dot on every point when few."""
    colors = {series: PALETTE[0]}
    h, top, x0, x1 = 300, 26, 60, WIDTH - 20
    bottom = h - 40
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    xmin, xmax = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    ymax = nice_max(max(ys))
    ymin = 0.0 if min(ys) >= 0 else -nice_max(-min(ys))

    def px(x: float) -> float:
        return x0 + (x1 - x0) * (x - xmin) / (xmax - xmin)

    def py(y: float) -> float:
        return bottom - (bottom - top) * (y - ymin) / (ymax - ymin)

    parts = [_legend([series], colors, 4)[0]]
    for i in range(5):
        v = ymin + (ymax - ymin) * i / 4
        parts.append(f'<line class="grid" x1="{x0}" x2="{x1}" y1="{py(v):.1f}" y2="{py(v):.1f}"/>'
                     f'<text class="tick" x="{x0 - 4}" y="{py(v) + 4:.1f}" text-anchor="end">{fmt(v)}</text>')
    for i in range(5):
        v = xmin + (xmax - xmin) * i / 4
        parts.append(f'<text class="tick" x="{px(v):.1f}" y="{bottom + 14}" text-anchor="middle">{fmt(round(v))}</text>')
    parts.append(f'<text class="unit" x="{(x0 + x1) / 2:.0f}" y="{bottom + 30}" text-anchor="middle">{escape(x_label)}</text>'
                 f'<text class="unit" transform="translate(14,{(top + bottom) / 2:.0f}) rotate(-90)" text-anchor="middle">{escape(y_label)}</text>')
    d = " ".join(f"{'M' if i == 0 else 'L'}{px(x):.1f},{py(y):.1f}" for i, (x, y) in enumerate(points))
    parts.append(f'<path class="series" data-series="{escape(series)}" data-points="{len(points)}" d="{d}" fill="none" '
                 f'stroke="{colors[series]}" stroke-width="2"><title>{escape(series)}: {fmt(ys[0])} → {fmt(ys[-1])}</title></path>')
    if len(points) <= 80:
        parts += [f'<circle class="point" data-series="{escape(series)}" data-value="{y}" cx="{px(x):.1f}" cy="{py(y):.1f}" r="2.5" '
                  f'fill="{colors[series]}"><title>{escape(x_label)} {fmt(x)}: {fmt(y)}</title></circle>' for x, y in points]
    return _svg(chart_id, title, h, [series], "".join(parts))


def empty(chart_id: str, title: str, why: str) -> str:
    """A chart with nothing to show says why (an empty box is never drawn silently)."""
    return _svg(chart_id, title, 40, [], f'<text class="empty" x="{LABEL_W}" y="24">{escape(why)}</text>')
