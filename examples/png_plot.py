"""A line plot written as PNG, and PNG files written, with numpy and zlib only (no plotting or imaging library)."""

from __future__ import annotations

import struct
import zlib

import numpy as np

# 5x7 bitmap digits and a few letters for axis labels
_GLYPHS = {
    "0": "01110100011001110101110011000101110", "1": "00100011000010000100001000010001110",
    "2": "01110100010000100010001000100011111", "3": "11111000100010000010000011000101110",
    "4": "00010001100101010010111110001000010", "5": "11111100001111000001000011000101110",
    "6": "00110010001000011110100011000101110", "7": "11111000010001000100010000100001000",
    "8": "01110100011000101110100011000101110", "9": "01110100011000101111000010001001100",
    ".": "00000000000000000000000000110001100", "-": "00000000000000011111000000000000000",
}


def _text(img, x, y, text, color):
    for ch in text:
        glyph = _GLYPHS.get(ch)
        if glyph is not None:
            bits = np.array([int(b) for b in glyph], dtype=bool).reshape(7, 5)
            h, w = img.shape[:2]
            region = img[y:y + 7, x:x + 5]
            region[bits[:region.shape[0], :region.shape[1]]] = color
        x += 6


def _line(img, x0, y0, x1, y1, color):
    steps = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
    xs = np.linspace(x0, x1, steps).round().astype(int)
    ys = np.linspace(y0, y1, steps).round().astype(int)
    ok = (xs >= 0) & (xs < img.shape[1]) & (ys >= 0) & (ys < img.shape[0])
    for dy in (0, 1):
        img[np.clip(ys[ok] + dy, 0, img.shape[0] - 1), xs[ok]] = color


def plot_lines(path: str, series: dict[str, list[float]], width: int = 800, height: int = 400) -> None:
    """Draws each series (name -> y values over steps) as a line; legend colours in order: blue, orange, green."""
    colors = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]
    img = np.full((height, width, 3), 255, dtype=np.uint8)
    left, right, top, bottom = 50, 20, 20, 30
    values = np.concatenate([np.asarray(v, dtype=float) for v in series.values()])
    lo, hi = float(values.min()), float(values.max())
    hi = hi if hi > lo else lo + 1
    steps = max(len(v) for v in series.values())
    sx = lambda i: left + i * (width - left - right) / max(steps - 1, 1)
    sy = lambda v: top + (hi - v) * (height - top - bottom) / (hi - lo)
    _line(img, left, top, left, height - bottom, (0, 0, 0))
    _line(img, left, height - bottom, width - right, height - bottom, (0, 0, 0))
    for frac in (0.0, 0.5, 1.0):
        v = lo + frac * (hi - lo)
        _text(img, 2, int(sy(v)) - 3, f"{v:.2f}", (0, 0, 0))
    _text(img, width - right - 30, height - bottom + 8, str(steps), (0, 0, 0))
    for k, (name, ys) in enumerate(series.items()):
        color = colors[k % len(colors)]
        for i in range(1, len(ys)):
            _line(img, sx(i - 1), sy(ys[i - 1]), sx(i), sy(ys[i]), color)
        img[top + 4 + 10 * k: top + 8 + 10 * k, width - 80: width - 60] = color
    write_png(path, img)


def write_png(path: str, img: np.ndarray, level: int = 9) -> None:
    """An RGB image, uint8 of shape (height, width, 3), as a PNG file (8-bit truecolour, no filter)."""
    if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"img must be uint8 of shape (height, width, 3), got {img.dtype} of shape {img.shape}")
    height, width = img.shape[:2]
    raw = b"".join(b"\x00" + img[row].tobytes() for row in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    png += chunk(b"IDAT", zlib.compress(raw, level)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(png)
