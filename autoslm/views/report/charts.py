"""Line charts without a plotting library: inline SVG for the HTML report, PNG for a model card.

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


def svg_chart(series: dict[str, list[tuple[float, float]]], *, title: str, width: int = 640, height: int = 280,
              x_label: str = "step", markers: bool = False) -> str:
    """An inline <svg> with axes, ticks, a legend and one polyline per series."""
    left, right, top, bottom = 56, 16, 28, 36
    pw, ph = width - left - right, height - top - bottom
    x0, x1, y0, y1 = _bounds(series)

    def px(x, y):
        return left + (x - x0) / (x1 - x0) * pw, top + (1 - (y - y0) / (y1 - y0)) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
           f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
           f'<text x="{left}" y="18" font-size="14" font-family="sans-serif" font-weight="bold">{html.escape(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>']
    for i in range(5):
        yv = y0 + (y1 - y0) * i / 4
        _, yp = px(x0, yv)
        out.append(f'<line x1="{left}" y1="{yp:.1f}" x2="{left + pw}" y2="{yp:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - 6}" y="{yp + 4:.1f}" font-size="11" text-anchor="end" font-family="sans-serif">{_fmt(yv)}</text>')
        xv = x0 + (x1 - x0) * i / 4
        xp, _ = px(xv, y0)
        out.append(f'<text x="{xp:.1f}" y="{top + ph + 16}" font-size="11" text-anchor="middle" font-family="sans-serif">{_fmt(xv)}</text>')
    out.append(f'<text x="{left + pw / 2}" y="{height - 4}" font-size="11" text-anchor="middle" font-family="sans-serif">{x_label}</text>')
    for i, (name, pts) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        pts = [(x, y) for x, y in pts if math.isfinite(y)]
        if len(pts) == 1 or markers:
            for x, y in pts:
                cx, cy = px(x, y)
                out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4" fill="{color}"/>')
        if len(pts) > 1:
            coords = " ".join(f"{a:.1f},{b:.1f}" for a, b in (px(x, y) for x, y in pts))
            out.append(f'<polyline class="curve" fill="none" stroke="{color}" stroke-width="2.5" points="{coords}"/>')
        lx = left + pw - 150
        ly = top + 14 + 16 * i
        out.append(f'<line x1="{lx}" y1="{ly - 4}" x2="{lx + 18}" y2="{ly - 4}" stroke="{color}" stroke-width="3"/>')
        out.append(f'<text x="{lx + 24}" y="{ly}" font-size="11" font-family="sans-serif">{html.escape(name)}</text>')
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
            px_buf[i:i + 3] = bytes(rgb)

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
    raw = b"".join(b"\x00" + bytes(px_buf[y * width * 3:(y + 1) * width * 3]) for y in range(height))

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
