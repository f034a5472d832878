"""Charts without a plotting library: inline SVG for the HTML report (curves, before/after bars), PNG
for a model card. Ticks sit on round numbers (1-2-5 steps) and never past a bound the data cannot
cross (a learning rate below 0, a score above 1).

Kept dependency-free on purpose so the CLI stays light (no matplotlib on the `report` or `push`
path). A chart is a few series of (x, y) points on shared axes; that is all the curves need.
"""

from __future__ import annotations

import html
import math
import struct
import zlib

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")


def _bounds(series: dict[str, list[tuple[float, float]]]):
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts if math.isfinite(y)]
    if not xs or not ys:
        return 0.0, 1.0, 0.0, 1.0
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    if x1 == x0:
        x1 = x0 + 1
    if y1 == y0:
        y0, y1 = y0 - 0.5, y1 + 0.5
    pad = (y1 - y0) * 0.05
    return x0, x1, y0 - pad, y1 + pad


def _fmt(v: float) -> str:
    return f"{v:.3g}"


def nice_step(span: float, n: int = 5) -> float:
    """The 1-2-5 x 10^k step that cuts ``span`` into about ``n`` parts."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / n
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag * 1.0000001:
            return m * mag
    return 10 * mag


def nice_axis(
    lo: float, hi: float, *, floor: float | None = None, ceil: float | None = None, n: int = 5
) -> tuple[float, float, list[float]]:
    """(axis low, axis high, ticks): round numbers that enclose [lo, hi], never past ``floor``/``ceil``,
    bounds the data cannot cross (a learning rate is >= 0, a score lies in [0, 1])."""
    if floor is not None:
        lo = max(lo, floor)
    if ceil is not None:
        hi = min(hi, ceil)
    if hi <= lo:
        pad = abs(lo) * 0.1 or 0.5
        lo, hi = lo - pad, hi + pad
        if floor is not None:
            lo = max(lo, floor)
        if ceil is not None:
            hi = min(hi, ceil)
    step = nice_step(hi - lo, n)
    a, b = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
    if floor is not None:
        a = max(a, floor)
    if ceil is not None:
        b = min(b, ceil)
    count = int(round((b - a) / step))
    ticks = [a + i * step for i in range(count + 1)]
    return a, b, ticks


def _decimals(step: float) -> int:
    """Decimals that write every multiple of ``step`` exactly (one more for a 2.5 step)."""
    d = max(0, -math.floor(math.log10(step) + 1e-9))
    scaled = step * 10**d
    return d + (abs(scaled - round(scaled)) > 1e-6)


def tick_label(v: float, step: float) -> str:
    """A tick as people write it: "0.5", "250", "2e-4", "1.5e-5"; no float noise, no "-0"."""
    if abs(v) < step * 1e-6:
        return "0"
    if step < 1e-3 or abs(v) >= 1e6:
        e = math.floor(math.log10(abs(v)) + 1e-9)
        mant = f"{v / 10**e:.{_decimals(step / 10**e)}f}"
        if "." in mant:
            mant = mant.rstrip("0").rstrip(".")
        return f"{mant}e{e}"
    return f"{v:.{_decimals(step)}f}"


def _text(x, y, s, *, size=11, anchor="middle", weight="normal", fill="#222") -> str:
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" font-weight="{weight}" '
        f'fill="{fill}" font-family="sans-serif">{html.escape(s)}</text>'
    )


def _mean_series(series: dict[str, list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """The seeds' mean at each step every seed logged."""
    by_x: dict[float, list[float]] = {}
    for pts in series.values():
        for x, y in pts:
            if math.isfinite(y):
                by_x.setdefault(x, []).append(y)
    return [(x, sum(v) / len(v)) for x, v in sorted(by_x.items()) if len(v) == len(series)]


SMOOTHING = 0.6  # TensorBoard's default smoothing weight


def ema(points: list[tuple[float, float]], weight: float = SMOOTHING) -> list[tuple[float, float]]:
    """TensorBoard's smoothing: an exponential moving average, s = weight * s + (1 - weight) * y, with the
    start debiased (divided by 1 - weight^n) so the line begins at the data rather than at zero."""
    out, last, n = [], 0.0, 0
    for x, y in points:
        if not math.isfinite(y):
            continue
        n += 1
        last = last * weight + (1 - weight) * y
        out.append((x, last / (1 - weight**n) if weight > 0 else last))
    return out


def svg_chart(
    series: dict[str, list[tuple[float, float]]],
    *,
    title: str,
    width: int = 460,
    height: int = 260,
    x_label: str = "step",
    markers: bool = False,
    y_floor: float | None = None,
    y_ceil: float | None = None,
    smoothing: float | None = None,
) -> str:
    """An inline <svg>: axes with ticks on round numbers (never past ``y_floor``/``y_ceil``), a legend,
    one polyline per series; several series (seeds) are drawn thin, under their mean drawn thick.
    ``smoothing`` (an EMA weight, as TensorBoard's slider): each line is drawn smoothed over its raw
    series drawn faint behind it, and the chart says so under its title."""
    left, right, top, bottom = 64, 16, 30, 38
    pw, ph = width - left - right, height - top - bottom
    xs = [x for pts in series.values() for x, _ in pts]
    ys = [y for pts in series.values() for _, y in pts if math.isfinite(y)]
    x0, x1, xt = nice_axis(min(xs + [0.0]), max(xs, default=1.0), floor=0.0)  # steps: from 0
    y0, y1, yt = nice_axis(min(ys, default=0.0), max(ys, default=1.0), floor=y_floor, ceil=y_ceil)

    def px(x, y):
        return left + (x - x0) / (x1 - x0) * pw, top + (1 - (y - y0) / (y1 - y0)) * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        _text(left, 18, title, size=14, anchor="start", weight="bold"),
    ]
    if smoothing is not None:  # named at the top right (start-anchored: "end" is the y-axis labels' anchor)
        note = f"smoothed: EMA {smoothing:g} (faint: raw)"
        out.append(_text(width - right - 5.4 * len(note), 18, note, size=10, anchor="start", fill="#666"))
    out += _axes(px, (x0, xt), (y0, yt), (left, top, pw, ph), x_label, height)
    several = len(series) > 1
    drawn = list(series.items())
    if several:
        drawn.append(("mean", _mean_series(series)))
    legend: list[str] = []  # drawn last, on a white backing, so no curve hides it
    for i, (name, pts) in enumerate(drawn):
        is_mean = several and i == len(drawn) - 1
        color = "#222222" if is_mean else COLORS[i % len(COLORS)]
        stroke = 2.5 if (is_mean or not several) else 1.2
        opacity = "1" if (is_mean or not several) else "0.55"
        pts = [(x, y) for x, y in pts if math.isfinite(y)]
        if len(pts) == 1 or markers:
            for x, y in pts:
                cx, cy = px(x, y)
                out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4" fill="{color}"/>')
        if len(pts) > 1:
            if smoothing is not None:  # the raw series faint behind its smoothed line
                if not is_mean:  # a mean of seeds is already smoother than any seed: no raw copy of it
                    out.append(_polyline(pts, px, color, 1.2, "0.3", "raw"))
                pts = ema(pts, smoothing)
            out.append(_polyline(pts, px, color, stroke, opacity, "curve"))
        if len(drawn) > 1:
            lx, ly = left + pw - 110, top + 14 + 16 * i
            legend.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 18}" y2="{ly - 4}" stroke="{color}" stroke-width="3"/>')
            legend.append(_text(lx + 24, ly, name, anchor="start"))
    if legend:
        out.append(
            f'<rect x="{left + pw - 116}" y="{top + 2}" width="108" height="{16 * len(drawn) + 4}" '
            f'fill="#ffffff" fill-opacity="0.85"/>'
        )
        out += legend
    out.append("</svg>")
    return "\n".join(out)


def _axes(px, x_axis, y_axis, box, x_label: str, height: int) -> list[str]:
    """Grid lines and tick labels on the round numbers, the two axes and the x axis's label.
    ``x_axis``/``y_axis``: (the axis's start, its ticks); ``box``: the plot's (left, top, width, height)."""
    (x0, xt), (y0, yt), (left, top, pw, ph) = x_axis, y_axis, box
    out = []
    ystep = yt[1] - yt[0] if len(yt) > 1 else 1.0
    for yv in yt:
        _, yp = px(x0, yv)
        out.append(f'<line x1="{left}" y1="{yp:.1f}" x2="{left + pw}" y2="{yp:.1f}" stroke="#e6e6e6"/>')
        out.append(_text(left - 6, yp + 4, tick_label(yv, ystep), anchor="end"))
    xstep = xt[1] - xt[0] if len(xt) > 1 else 1.0
    for xv in xt:
        xp, _ = px(xv, y0)
        out.append(f'<line x1="{xp:.1f}" y1="{top + ph}" x2="{xp:.1f}" y2="{top + ph + 4}" stroke="#888"/>')
        out.append(_text(xp, top + ph + 16, tick_label(xv, xstep)))
    out.append(f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#888"/>')
    out.append(f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="#888"/>')
    out.append(_text(left + pw / 2, height - 6, x_label))
    return out


def _polyline(pts, px, color: str, stroke: float, opacity: str, cls: str) -> str:
    coords = " ".join(f"{a:.1f},{b:.1f}" for a, b in (px(x, y) for x, y in pts))
    return (
        f'<polyline class="{cls}" fill="none" stroke="{color}" stroke-width="{stroke}" '
        f'stroke-opacity="{opacity}" stroke-linejoin="round" points="{coords}"/>'
    )


BEFORE, AFTER = "#b0b7c0", COLORS[0]


def svg_bars(
    groups: dict[str, tuple[float | None, float | None]],
    *,
    title: str,
    width: int = 460,
    height: int = 260,
    y_floor: float | None = 0.0,
    y_ceil: float | None = None,
) -> str:
    """Before/after as paired bars, one pair per group (a seed, or a measure: greedy, sampled, pass@k),
    each bar labelled with its value; wider than ``width`` where the groups need the room."""
    left, right, top, bottom = 64, 84, 30, 38  # the legend sits right of the bars
    width = max(width, left + right + 110 * len(groups))
    pw, ph = width - left - right, height - top - bottom
    vals = [v for pair in groups.values() for v in pair if v is not None and math.isfinite(v)]
    lo = min(vals + [0.0]) if y_floor is not None and y_floor <= 0 else min(vals, default=0.0)
    hi = y_ceil if y_ceil is not None and y_floor is not None else max(vals, default=1.0)  # a score: all of [0, 1]
    y0, y1, yt = nice_axis(lo, hi + 0.08 * (hi - lo), floor=y_floor, ceil=y_ceil)  # room for the value labels

    def py(v):
        return top + (1 - (v - y0) / (y1 - y0)) * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart bars" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        _text(left, 18, title, size=14, anchor="start", weight="bold"),
    ]
    ystep = yt[1] - yt[0] if len(yt) > 1 else 1.0
    for yv in yt:
        out.append(f'<line x1="{left}" y1="{py(yv):.1f}" x2="{left + pw}" y2="{py(yv):.1f}" stroke="#e6e6e6"/>')
        out.append(_text(left - 6, py(yv) + 4, tick_label(yv, ystep), anchor="end"))
    out.append(f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#888"/>')
    slot = pw / max(1, len(groups))
    bar = min(56.0, slot * 0.32)
    base = py(max(y0, 0.0)) if y0 <= 0 <= y1 else top + ph
    for g, (name, pair) in enumerate(groups.items()):
        cx = left + slot * (g + 0.5)
        for k, (v, color) in enumerate(zip(pair, (BEFORE, AFTER))):
            if v is None or not math.isfinite(v):
                continue
            x = cx - bar - 3 + k * (bar + 6)
            yv = py(v)
            out.append(
                f'<rect class="bar" x="{x:.1f}" y="{min(yv, base):.1f}" width="{bar:.1f}" '
                f'height="{abs(base - yv):.1f}" fill="{color}"/>'
            )
            out.append(_text(x + bar / 2, min(yv, base) - 4, f"{v:.3g}", size=11))
        out.append(_text(cx, top + ph + 16, name))
    for k, (label, color) in enumerate((("before", BEFORE), ("after", AFTER))):
        lx, ly = left + pw + 14, top + 14 + 16 * k
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="12" height="10" fill="{color}"/>')
        out.append(_text(lx + 18, ly, label, anchor="start"))
    out.append("</svg>")
    return "\n".join(out)


def png_chart(series: dict[str, list[tuple[float, float]]], *, width: int = 640, height: int = 320) -> bytes:
    """A plain PNG of the same curves (axes box, grid, lines; no text): for a model card's image."""
    px_buf = bytearray(b"\xff" * (width * height * 3))
    left, right, top, bottom = 12, 12, 12, 12
    pw, ph = width - left - right, height - top - bottom
    x0, x1, y0, y1 = _bounds(series)

    def put(x: int, y: int, rgb: tuple[int, int, int]) -> None:
        if 0 <= x < width and 0 <= y < height:
            i = (y * width + x) * 3
            px_buf[i : i + 3] = bytes(rgb)

    def line(xa, ya, xb, yb, rgb, thick=1):
        steps = int(max(abs(xb - xa), abs(yb - ya))) + 1
        for s in range(steps + 1):
            t = s / steps
            x, y = round(xa + (xb - xa) * t), round(ya + (yb - ya) * t)
            for dx in range(-(thick // 2), thick // 2 + 1):
                for dy in range(-(thick // 2), thick // 2 + 1):
                    put(x + dx, y + dy, rgb)

    for i in range(5):
        y = top + round(ph * i / 4)
        line(left, y, left + pw, y, (230, 230, 230))
    line(left, top, left + pw, top, (136, 136, 136))
    line(left, top + ph, left + pw, top + ph, (136, 136, 136))
    line(left, top, left, top + ph, (136, 136, 136))
    line(left + pw, top, left + pw, top + ph, (136, 136, 136))
    for i, pts in enumerate(series.values()):
        h = COLORS[i % len(COLORS)].lstrip("#")
        rgb = (int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16))
        mapped = [(left + (x - x0) / (x1 - x0) * pw, top + (1 - (y - y0) / (y1 - y0)) * ph) for x, y in pts if math.isfinite(y)]
        for (xa, ya), (xb, yb) in zip(mapped, mapped[1:]):
            line(xa, ya, xb, yb, rgb, thick=3)
        if len(mapped) == 1:
            line(mapped[0][0] - 3, mapped[0][1], mapped[0][0] + 3, mapped[0][1], rgb, thick=5)
    raw = b"".join(b"\x00" + bytes(px_buf[y * width * 3 : (y + 1) * width * 3]) for y in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )
