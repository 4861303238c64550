"""Tiny SVG charts as strings, for report pages that a headless Chromium screenshots.

No JavaScript, fonts or stylesheets from elsewhere: the page must render the same offline, on a host
that reaches nothing, and in a screenshot taken the moment it loads. Every element a test (or a reader of
the page source) looks for carries a class: `series`, `frontier`, `recommended`, `baseline`, `target`,
`nodata`. All text goes through escape()/quoteattr(), since labels come from inventories and hosts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from xml.sax.saxutils import escape, quoteattr

# Tableau 10, minus its grey and olive (too close to the axes and to green on a small screenshot)
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
RECOMMENDED_COLOUR = "#d62728"
BASELINE_COLOUR = "#111111"
POINT_COLOUR = "#1f77b4"
FONT = "font-family=\"sans-serif\""
KINDS = ("point", "baseline", "recommended", "failed")
# seconds between time ticks, the smallest that keeps the labels apart is taken
_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    label: str
    kind: str = "point"  # one of KINDS; "failed" is listed under the chart, not placed on it

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Point.kind: {self.kind!r} is not one of {', '.join(KINDS)}")


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 x 10^n steps) covering lo..hi, at most `count` + 1 of them.

    A zero-width range is widened first, so a single value still gets an axis."""
    lo, hi = _widen(lo, hi)
    raw = (hi - lo) / max(count - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step + 1e-9) * step
    ticks, v = [], first
    while v < hi - step * 1e-9:
        ticks.append(v)
        v = first + step * len(ticks)
    ticks.append(v)
    return [round(t, 10) for t in ticks]


def _widen(lo: float, hi: float) -> tuple[float, float]:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return 0.0, 1.0
    if hi < lo:
        lo, hi = hi, lo
    if hi - lo < 1e-12:
        if lo == 0:  # all zero: an axis from 0, not a negative one
            return 0.0, 1.0
        pad = abs(lo) * 0.1
        return lo - pad, hi + pad
    return lo, hi


def _with_zero(lo: float, hi: float) -> tuple[float, float]:
    """Start a positive axis at 0 when the data reach within half of it: the distances then read as
    ratios; a far-off 0 would only squash the points together."""
    return (0.0, hi) if 0 <= lo <= hi / 2 else (lo, hi)


def _fmt(v: float, step: float) -> str:
    if abs(v) >= 10_000 and step >= 1000:
        return f"{v / 1000:g}k"
    # as many decimals as the step has: 2.5 steps need one, 0.05 steps two
    decimals = next((d for d in range(7) if abs(round(step, d) - step) <= 1e-9 * max(1.0, abs(step))), 6)
    return f"{v:.{decimals}f}"


def _time_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Whole-second ticks on round clock times (every 5 s, 1 min, 15 min ...) inside lo..hi."""
    step = next((s for s in _TIME_STEPS if (hi - lo) / s <= count - 1), _TIME_STEPS[-1])
    first = math.ceil(lo / step) * step
    ticks = [float(first + i * step) for i in range(max(int((hi - first) // step) + 1, 0))]
    return ticks[:: math.ceil(len(ticks) / count)] if len(ticks) > count else ticks


def _hms(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S")


class _Frame:
    """The plot area's pixel box and the data-to-pixel mapping of both axes."""

    def __init__(self, left: float, top: float, right: float, bottom: float,
                 xr: tuple[float, float], yr: tuple[float, float]) -> None:
        self.left, self.top, self.right, self.bottom = left, top, right, bottom
        self.x0, self.x1 = _widen(*xr)
        self.y0, self.y1 = _widen(*yr)

    def px(self, x: float) -> float:
        return self.left + (x - self.x0) / (self.x1 - self.x0) * (self.right - self.left)

    def py(self, y: float) -> float:
        return self.bottom - (y - self.y0) / (self.y1 - self.y0) * (self.bottom - self.top)


def _open(title: str, width: int, height: int) -> list[str]:
    return [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}" role="img" aria-label={quoteattr(title)} {FONT} font-size="11">',
            f"<title>{escape(title)}</title>",
            f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
            f'<text class="title" x="8" y="15" font-size="13" font-weight="bold">{escape(title)}</text>']


def _text(x: float, y: float, s: str, cls: str = "", anchor: str = "start", **attrs: str) -> str:
    extra = "".join(f" {k.replace('_', '-')}={quoteattr(v)}" for k, v in attrs.items())
    c = f" class={quoteattr(cls)}" if cls else ""
    return f'<text{c} x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{extra}>{escape(s)}</text>'


def _axes(f: _Frame, yticks: Sequence[float], xticks: Sequence[float], xlabel_of) -> list[str]:
    out = [f'<rect class="frame" x="{f.left:.1f}" y="{f.top:.1f}" width="{f.right - f.left:.1f}" '
           f'height="{f.bottom - f.top:.1f}" fill="none" stroke="#999999"/>']
    ystep = yticks[1] - yticks[0] if len(yticks) > 1 else 1.0
    for t in yticks:
        y = f.py(t)
        out.append(f'<line class="grid" x1="{f.left:.1f}" y1="{y:.1f}" x2="{f.right:.1f}" y2="{y:.1f}" '
                   'stroke="#e5e5e5"/>')
        out.append(_text(f.left - 4, y + 3.5, _fmt(t, ystep), "ytick", "end"))
    for t in xticks:
        x = f.px(t)
        out.append(f'<line class="xgrid" x1="{x:.1f}" y1="{f.top:.1f}" x2="{x:.1f}" y2="{f.bottom:.1f}" '
                   'stroke="#f0f0f0"/>')
        out.append(_text(x, f.bottom + 13, xlabel_of(t), "xtick", "middle"))
    return out


def _clamp(v: float, lo: float, hi: float) -> float:
    return min(max(v, lo), hi)


def line_chart(title: str, series: Sequence[tuple[str, Sequence[tuple[float, float]]]], unit: str = "",
               width: int = 460, height: int = 220) -> str:
    """Lines over wall-clock time (x: unix seconds, labelled HH:MM:SS UTC, as the hosts' journals are)."""
    # the legend wraps below the axis labels; its rows decide the bottom margin
    rows: list[list[tuple[int, str, float]]] = [[]]
    x = 8.0
    for i, (label, _) in enumerate(series):
        w = 18 + 6.2 * len(label) + 12
        if rows[-1] and x + w > width - 4:
            rows.append([])
            x = 8.0
        rows[-1].append((i, label, x))
        x += w
    legend_rows = len(rows) if series else 0
    left, top, right = 52.0, 34.0, width - 28.0  # room for half a clock label past the last tick
    bottom = height - 24.0 - 14.0 * legend_rows
    pts = [p for _, s in series for p in s if math.isfinite(p[0]) and math.isfinite(p[1])]
    out = _open(title, width, height)
    if unit:
        out.append(_text(left, top - 6, unit, "unit", "end"))
    if not pts:
        f = _Frame(left, top, right, bottom, (0, 1), (0, 1))
        out += _axes(f, [], [], str)
        out.append(_text((left + right) / 2, (top + bottom) / 2 + 4, "no data", "nodata", "middle",
                         fill="#777777"))
    else:
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        xlo, xhi = min(xs), max(xs)
        if xhi - xlo < 1:  # one sample: a minute around it
            xlo, xhi = xlo - 30, xhi + 30
        yticks = nice_ticks(*_with_zero(min(ys), max(ys)))
        f = _Frame(left, top, right, bottom, (xlo, xhi), (yticks[0], yticks[-1]))
        out += _axes(f, yticks, _time_ticks(xlo, xhi), _hms)
        for i, (label, s) in enumerate(series):
            colour = PALETTE[i % len(PALETTE)]
            good = sorted(p for p in s if math.isfinite(p[0]) and math.isfinite(p[1]))
            if not good:
                continue
            coords = " ".join(f"{f.px(px):.1f},{f.py(py):.1f}" for px, py in good)
            out.append(f'<polyline class="series" data-label={quoteattr(label)} points="{coords}" '
                       f'fill="none" stroke="{colour}" stroke-width="1.8"/>')
            if len(good) == 1:  # a one-point polyline draws nothing
                out.append(f'<circle class="dot" cx="{f.px(good[0][0]):.1f}" cy="{f.py(good[0][1]):.1f}" '
                           f'r="2.5" fill="{colour}"/>')
    for r, row in enumerate(rows if series else []):
        y = height - 8.0 - 14.0 * (legend_rows - 1 - r)
        for i, label, lx in row:
            colour = PALETTE[i % len(PALETTE)]
            out.append(f'<g class="legend" data-label={quoteattr(label)}>'
                       f'<rect x="{lx:.1f}" y="{y - 8:.1f}" width="12" height="8" fill="{colour}"/>'
                       + _text(lx + 16, y, label) + "</g>")
    out.append("</svg>")
    return "\n".join(out)


def _wrap(text: str, chars: int) -> list[str]:
    """Greedy word wrap: a long point label ("knob=v knob=v ...") becomes lines of at most `chars`."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= chars:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


def _padded(lo: float, hi: float) -> tuple[float, float]:
    """A little room past the data, so a point at the extreme is not cut in half by the frame."""
    lo, hi = _with_zero(lo, hi)
    pad = (hi - lo) * 0.05
    return (lo if lo == 0 else lo - pad), hi + pad


def scatter(title: str, points: Sequence[Point], frontier: Sequence[tuple[float, float]], xlabel: str,
            ylabel: str, width: int = 560, height: int = 360, target_x: float | None = None) -> str:
    """A trade-off chart: each trial a dot, the non-dominated ones joined, the inventory's values and the
    recommendation marked, and the latency target as a dashed line. Failed trials have no coordinates
    worth showing, so they are named under the chart instead."""
    placed = [p for p in points if p.kind != "failed" and math.isfinite(p.x) and math.isfinite(p.y)]
    failed = [p for p in points if p not in placed]
    fail_lines = [f"failed: {p.label}" for p in failed[:3]]
    if len(failed) > 3:
        fail_lines.append(f"... and {len(failed) - 3} more failed")
    left, top, right = 60.0, 46.0, width - 16.0
    bottom = height - 40.0 - 13.0 * len(fail_lines)
    out = _open(title, width, height)
    # the legend has a line of its own under the title; widths are estimated at 6.6 px a character
    lx = left
    for cls, colour, r, text in (("point", POINT_COLOUR, 4, "trial"),
                                 ("baseline", BASELINE_COLOUR, 5, "inventory's values"),
                                 ("recommended", RECOMMENDED_COLOUR, 6, "recommended")):
        out.append(f'<circle class="legend-{cls}" cx="{lx + r:.1f}" cy="29" r="{r}" fill="{colour}"/>')
        out.append(_text(lx + 2 * r + 4, 33, text, f"legend-{cls}"))
        lx += 2 * r + 4 + 6.6 * len(text) + 14
    out.append(f'<line class="legend-frontier" x1="{lx:.1f}" y1="29" x2="{lx + 16:.1f}" y2="29" '
               'stroke="#2ca02c" stroke-width="1.5"/>')
    out.append(_text(lx + 20, 33, "best trade-offs", "legend-frontier"))
    data_x = [p.x for p in placed] + [fx for fx, _ in frontier]
    targets = [target_x] if target_x is not None and math.isfinite(target_x) else []
    # a target far past every point would squeeze the points against the axis: it is named instead
    beyond = [t for t in targets if data_x and t > 2 * max(data_x)]
    targets = [t for t in targets if t not in beyond]
    xs = data_x + targets
    ys = [p.y for p in placed] + [fy for _, fy in frontier]
    if not xs:
        f = _Frame(left, top, right, bottom, (0, 1), (0, 1))
        out += _axes(f, [], [], str)
        out.append(_text((left + right) / 2, (top + bottom) / 2 + 4, "no data", "nodata", "middle",
                         fill="#777777"))
    else:
        xticks = nice_ticks(*_padded(min(xs), max(xs)))
        yticks = nice_ticks(*_padded(min(ys), max(ys))) if ys else nice_ticks(0, 1)
        xstep = xticks[1] - xticks[0] if len(xticks) > 1 else 1.0
        f = _Frame(left, top, right, bottom, (xticks[0], xticks[-1]), (yticks[0], yticks[-1]))
        out += _axes(f, yticks, xticks, lambda t: _fmt(t, xstep))
        for t in targets:
            tx = f.px(t)
            out.append(f'<line class="target" x1="{tx:.1f}" y1="{f.top:.1f}" x2="{tx:.1f}" '
                       f'y2="{f.bottom:.1f}" stroke="#555555" stroke-dasharray="5,4"/>')
            near_right = tx > right - 70
            out.append(_text(tx - 3 if near_right else tx + 3, f.bottom - 5, f"target {t:g}",
                             "target-label", "end" if near_right else "start", fill="#555555"))
        for t in beyond:
            out.append(_text(right - 3, f.top + 12, f"target {t:g} (right of every point)", "target-label",
                             "end", fill="#555555"))
        if frontier:
            coords = " ".join(f"{f.px(fx):.1f},{f.py(fy):.1f}" for fx, fy in frontier)
            out.append(f'<polyline class="frontier" points="{coords}" fill="none" stroke="#2ca02c" '
                       'stroke-width="1.5"/>')
        # recommended last, so it sits on top of the point it may share coordinates with
        order = {"point": 0, "baseline": 1, "recommended": 2}
        style = {"point": (4.0, POINT_COLOUR, ' fill-opacity="0.75"'),
                 "baseline": (5.5, BASELINE_COLOUR, ' fill-opacity="0.9"'),
                 "recommended": (8.0, RECOMMENDED_COLOUR, ' stroke="#ffffff" stroke-width="1.5"')}
        for p in sorted(placed, key=lambda p: order[p.kind]):
            cx, cy = f.px(p.x), f.py(p.y)
            radius, colour, more = style[p.kind]
            out.append(f'<circle class="{p.kind}" data-label={quoteattr(p.label)} cx="{cx:.1f}" '
                       f'cy="{cy:.1f}" r="{radius:g}" fill="{colour}"{more}>'
                       f"<title>{escape(p.label)}</title></circle>")
            if p.kind == "recommended":
                out.append(_point_label(p.label, cx, cy, left, right, top, bottom))
    out.append(_text((left + right) / 2, bottom + 28, xlabel, "xlabel", "middle"))
    cy = (top + bottom) / 2
    out.append(_text(14, cy, ylabel, "ylabel", "middle", transform=f"rotate(-90 14 {cy:.1f})"))
    for i, line in enumerate(fail_lines):
        out.append(_text(8, bottom + 42 + 13 * i, line, "failed", fill="#a00000"))
    out.append("</svg>")
    return "\n".join(out)


def _point_label(label: str, cx: float, cy: float, left: float, right: float, top: float,
                 bottom: float) -> str:
    """The recommended point's label beside it, on the side with more room, wrapped to fit the frame."""
    on_left = cx - left > right - cx
    room = (cx - left if on_left else right - cx) - 14
    lines = _wrap(label, max(int(room / 6.6), 8))
    y0 = _clamp(cy - 4 - 6.5 * (len(lines) - 1), top + 11, bottom - 4 - 13 * (len(lines) - 1))
    x = cx - 12 if on_left else cx + 12
    spans = "".join(f'<tspan x="{x:.1f}" y="{y0 + 13 * i:.1f}">{escape(line)}</tspan>'
                    for i, line in enumerate(lines))
    anchor = "end" if on_left else "start"
    return (f'<text class="recommended-label" x="{x:.1f}" y="{y0:.1f}" text-anchor="{anchor}" '
            f'fill="{RECOMMENDED_COLOUR}" font-weight="bold" stroke="#ffffff" stroke-width="3" '
            f'paint-order="stroke">{spans}</text>')
