"""The report's charts as inline SVG, written with the standard library only (no plotting package to install).

    line_chart(title, points)                      one history column against the step; a noisy one gets its EMA
    bar_chart(title, categories, series, bands)    grouped bars: one group per category (all, level 1, ...), one
                                                   bar per series (rung), its recorded band drawn over it

Every chart is one well-formed `<svg>` element (xmlns set, text escaped) that a page can inline. Bars carry
`data-series` / `data-category` / `data-value` so the numbers stay readable from the markup.

Smoothing: a column with at least MIN_SMOOTH points whose raw step-to-step changes are more than NOISE_RATIO times
its smoothed line's (mean absolute differences) is drawn as faint raw points under a bias-corrected exponential
moving average (TensorBoard's: m_t = b m_(t-1) + (1 - b) x_t, shown as m_t / (1 - b^t)) with a span of
max(5, n / 50) points (a short lag even on a steep early fall) (b = 1 - 2 / (span + 1)). A smooth column (a falling loss, the few in-loop evaluations) is
drawn as it is."""

from __future__ import annotations

import math
from html import escape
from typing import Sequence

MIN_SMOOTH = 10
NOISE_RATIO = 2.0
MAX_RAW = 1500  # raw points drawn per line (a longer history is strided for the drawing; the EMA uses every point)
W, H = 360, 220  # a line chart's size in px
PAD_L, PAD_R, PAD_T, PAD_B = 52, 12, 26, 30
COLORS = ("#4a7ab5", "#d9822b", "#3a9e5f", "#b5484a", "#8a62b5", "#7a7a7a", "#c4a035")
FONT = "font-family='sans-serif' font-size='11'"


def ema(values: Sequence[float], span: int) -> list[float]:
    """Bias-corrected exponential moving average over `values` in order."""
    beta = 1.0 - 2.0 / (span + 1)
    out, m = [], 0.0
    for t, x in enumerate(values, 1):
        m = beta * m + (1.0 - beta) * x
        out.append(m / (1.0 - beta ** t))
    return out


def span_for(n: int) -> int:
    return max(5, n // 50)


def _mean_abs_diff(values: Sequence[float]) -> float:
    return sum(abs(b - a) for a, b in zip(values, values[1:])) / max(len(values) - 1, 1)


def smoothed(values: Sequence[float]) -> list[float] | None:
    """The EMA to draw over `values`, or None when they are few or smooth enough to read as they are."""
    if len(values) < MIN_SMOOTH:
        return None
    line = ema(values, span_for(len(values)))
    return line if _mean_abs_diff(values) > NOISE_RATIO * _mean_abs_diff(line) else None


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 2.5 or 5 times a power of ten apart)."""
    if not hi > lo:
        lo, hi = lo - (abs(lo) * 0.1 or 0.5), hi + (abs(hi) * 0.1 or 0.5)
    raw = (hi - lo) / max(count - 1, 1)
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = [first]
    while ticks[-1] < hi - step * 1e-9:
        ticks.append(first + step * len(ticks))
    return ticks


def _fmt(value: float) -> str:
    return f"{value:.4g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"


def _svg(width: int, height: int, body: list[str], title: str) -> str:
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
            f"viewBox='0 0 {width} {height}' role='img' aria-label='{escape(title)}'>"
            f"<text x='{width / 2:.0f}' y='15' text-anchor='middle' {FONT} font-weight='bold'>{escape(title)}"
            f"</text>{''.join(body)}</svg>")


class _Frame:
    """Data -> pixel mapping of a plot area with axes, ticks and grid lines."""

    def __init__(self, xs: tuple[float, float], ys: list[float], width: int, height: int):
        self.x0, self.x1 = xs if xs[1] > xs[0] else (xs[0] - 0.5, xs[0] + 0.5)
        self.yticks = ys
        self.left, self.right, self.top, self.bottom = PAD_L, width - PAD_R, PAD_T, height - PAD_B

    def x(self, v: float) -> float:
        return self.left + (v - self.x0) / (self.x1 - self.x0) * (self.right - self.left)

    def y(self, v: float) -> float:
        lo, hi = self.yticks[0], self.yticks[-1]
        return self.bottom - (v - lo) / (hi - lo) * (self.bottom - self.top)

    def axes(self, xticks: Sequence[float] = (), xlabel: str = "") -> list[str]:
        out = []
        for t in self.yticks:
            y = self.y(t)
            out.append(f"<line x1='{self.left}' y1='{y:.1f}' x2='{self.right}' y2='{y:.1f}' stroke='#e3e3e3'/>"
                       f"<text x='{self.left - 4}' y='{y + 3.5:.1f}' text-anchor='end' {FONT}>{_fmt(t)}</text>")
        for t in xticks:
            x = self.x(t)
            out.append(f"<text x='{x:.1f}' y='{self.bottom + 13}' text-anchor='middle' {FONT}>{_fmt(t)}</text>")
        out.append(f"<path d='M{self.left} {self.top}V{self.bottom}H{self.right}' fill='none' stroke='#555'/>")
        if xlabel:
            out.append(f"<text x='{(self.left + self.right) / 2:.0f}' y='{self.bottom + 26}' text-anchor='middle' "
                       f"{FONT}>{escape(xlabel)}</text>")
        return out


def _polyline(frame: _Frame, xs: Sequence[float], ys: Sequence[float], attrs: str) -> str:
    pts = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in zip(xs, ys))
    return f"<polyline points='{pts}' fill='none' {attrs}/>"


def line_chart(title: str, points: Sequence[tuple[float, float]], color: str = COLORS[0]) -> str:
    """One column of a history: value against step; its EMA over faint raw points where it is noisy."""
    xs, ys = [float(s) for s, _ in points], [float(v) for _, v in points]
    smooth = smoothed(ys)
    frame = _Frame((min(xs), max(xs)), nice_ticks(min(ys), max(ys)), W, H)
    body = frame.axes([t for t in nice_ticks(min(xs), max(xs), 4) if frame.x0 <= t <= frame.x1], "step")
    stride = max(1, math.ceil(len(xs) / MAX_RAW))
    raw_x, raw_y = xs[::stride], ys[::stride]
    if smooth is not None:
        body.append(_polyline(frame, raw_x, raw_y, f"stroke='{color}' stroke-opacity='0.35' stroke-width='1'"))
        body.append(_polyline(frame, xs, smooth, f"stroke='{color}' stroke-width='2' class='ema'"))
        body.append(f"<text x='{W - PAD_R}' y='{PAD_T - 2}' text-anchor='end' {FONT} fill='#555'>"
                    f"EMA span {span_for(len(ys))} over raw</text>")
    else:
        body.append(_polyline(frame, raw_x, raw_y, f"stroke='{color}' stroke-width='1.5'"))
        if len(xs) <= 30:  # few points (in-loop evaluations): mark each
            body += [f"<circle cx='{frame.x(x):.1f}' cy='{frame.y(y):.1f}' r='2.5' fill='{color}'/>"
                     for x, y in zip(xs, ys)]
    return _svg(W, H, body, title)


LEGEND_W, LEGEND_ROW = 90, 4  # px per legend entry, entries per legend row


def _bar(frame: _Frame, x: float, bar_w: float, name: str, cat: str, value: float, color: str) -> str:
    y = frame.y(value)
    return (f"<rect x='{x:.1f}' y='{y:.1f}' width='{bar_w - 2:.1f}' height='{frame.bottom - y:.1f}' fill='{color}' "
            f"data-series='{escape(name)}' data-category='{escape(cat)}' data-value='{value:.4f}'>"
            f"<title>{escape(f'{name}, {cat}: {value:.3f}')}</title></rect>"
            f"<text x='{x + (bar_w - 2) / 2:.1f}' y='{y - 3:.1f}' text-anchor='middle' font-family='sans-serif' "
            f"font-size='9'>{value:.2f}</text>")


def _bracket(frame: _Frame, cx: float, name: str, cat: str, band: Sequence[float]) -> str:
    top, bot = frame.y(band[1]), frame.y(band[0])
    return (f"<path d='M{cx - 5:.1f} {top:.1f}H{cx + 5:.1f}M{cx:.1f} {top:.1f}V{bot:.1f}M{cx - 5:.1f} {bot:.1f}"
            f"H{cx + 5:.1f}' stroke='#222' stroke-width='1.5' fill='none' class='band'>"
            f"<title>{escape(f'{name}, {cat}: recorded band {band[0]:.3f}-{band[1]:.3f}')}</title></path>")


def _legend(names: Sequence[str], bands: bool) -> list[str]:
    out = []
    for i, name in enumerate([*names, *(["recorded band"] if bands else [])]):
        lx, ly = PAD_L + (i % LEGEND_ROW) * LEGEND_W, H + 4 + 18 * (i // LEGEND_ROW)
        mark = (f"<rect x='{lx}' y='{ly}' width='10' height='10' fill='{COLORS[i % len(COLORS)]}'/>"
                if i < len(names) else
                f"<path d='M{lx} {ly}H{lx + 10}M{lx + 5} {ly}V{ly + 10}M{lx} {ly + 10}H{lx + 10}' stroke='#222' "
                f"fill='none'/>")
        out.append(f"{mark}<text x='{lx + 14}' y='{ly + 9}' {FONT}>{escape(name)}</text>")
    return out


def bar_chart(title: str, categories: Sequence[str], series: Sequence[tuple[str, Sequence[float | None]]],
              bands: dict[tuple[str, str], Sequence[float]] | None = None, ylabel: str = "") -> str:
    """Grouped bars in [0, 1]: `series` = [(name, one value per category, None = not measured)]; `bands`:
    {(series, category): [lo, hi]} drawn as a bracket over that bar."""
    bands = bands or {}
    entries = len(series) + bool(bands)
    group_w = max(24 * len(series) + 16, 60)
    width = PAD_L + PAD_R + max(group_w * len(categories), LEGEND_W * min(entries, LEGEND_ROW))
    frame = _Frame((0.0, 1.0), [0.0, 0.25, 0.5, 0.75, 1.0], width, H)
    body = frame.axes()
    if ylabel:
        mid = (PAD_T + H - PAD_B) / 2
        body.append(f"<text x='12' y='{mid:.0f}' text-anchor='middle' {FONT} transform='rotate(-90 12 {mid:.0f})'>"
                    f"{escape(ylabel)}</text>")
    bar_w = (group_w - 16) / max(len(series), 1)
    for ci, cat in enumerate(categories):
        gx = PAD_L + ci * group_w + 8
        body.append(f"<text x='{gx + (group_w - 16) / 2:.1f}' y='{H - PAD_B + 13}' text-anchor='middle' {FONT}>"
                    f"{escape(cat)}</text>")
        for si, (name, values) in enumerate(series):
            if values[ci] is None:
                continue
            x = gx + si * bar_w
            body.append(_bar(frame, x, bar_w, name, cat, values[ci], COLORS[si % len(COLORS)]))
            if (name, cat) in bands:
                body.append(_bracket(frame, x + (bar_w - 2) / 2, name, cat, bands[(name, cat)]))
    body += _legend([name for name, _ in series], bool(bands))
    height = H + 18 * ((entries + LEGEND_ROW - 1) // LEGEND_ROW)
    return _svg(int(width), int(height), body, title)
