"""Headless Chromium for the report's browser tests: screenshots, the DOM after scripts ran,
and a small PNG reader (no imaging library needed) to check what the screenshot shows."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path

import pytest

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
SKIP_ENV = "LOOP_SKIP_BROWSER_TESTS"


def chromium() -> str:
    """The browser binary; a missing one fails the test (CI must run it) unless skipped."""
    for name in BROWSERS:
        if path := shutil.which(name):
            return path
    if os.environ.get(SKIP_ENV) == "1":
        pytest.skip(f"no Chromium and {SKIP_ENV}=1")
    pytest.fail(
        "headless Chromium is needed for the report's browser tests: `bash scripts/setup.sh "
        f"test` installs it (apt package chromium); or set {SKIP_ENV}=1 to skip them"
    )


def run_chromium(url: str, *args: str, timeout: float = 240) -> tuple[str, float]:
    """Run headless Chromium on `url` with `args`; returns (stdout, wall seconds)."""
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        command = [
            chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--hide-scrollbars", "--no-first-run", "--mute-audio", f"--user-data-dir={profile}",
            *args, url,
        ]  # fmt: skip
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        wall = time.monotonic() - started
    assert done.returncode == 0, f"chromium failed ({done.returncode}): {done.stderr[-2000:]}"
    return done.stdout, wall


def dump_dom(url: str, budget_ms: int = 10_000) -> tuple[str, float]:
    """The DOM once scripts (and their promises, within `budget_ms` of virtual time) ran."""
    return run_chromium(url, f"--virtual-time-budget={budget_ms}", "--dump-dom")


def screenshot(url: str, out: Path, size: str = "1400,2400", budget_ms: int = 10_000) -> float:
    """A PNG of the window after scripts ran; returns the wall seconds."""
    _, wall = run_chromium(
        url, f"--virtual-time-budget={budget_ms}", f"--window-size={size}", f"--screenshot={out}"
    )
    assert out.is_file() and out.stat().st_size > 0, f"no screenshot at {out}"
    return wall


def png_colors(path: Path) -> Counter[tuple[int, int, int]]:
    """How many pixels of each RGB colour a PNG has (Pillow when installed, else our reader)."""
    try:
        from PIL import Image
    except ImportError:
        return _png_colors(path)
    with Image.open(path) as image:
        rgb = image.convert("RGB")
        return Counter({color: n for n, color in rgb.getcolors(maxcolors=1 << 24) or []})


def _png_colors(path: Path) -> Counter[tuple[int, int, int]]:
    """An 8-bit RGB or RGBA PNG's colour counts in pure Python (slow: seconds a megapixel)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color_type, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color_type in (2, 6) and interlace == 0, (depth, color_type, interlace)
    channels = 3 if color_type == 2 else 4
    raw, stride = zlib.decompress(idat), width * channels
    counts: Counter[tuple[int, int, int]] = Counter()
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        line = _unfilter(
            raw[start], bytearray(raw[start + 1 : start + 1 + stride]), previous, channels
        )
        for x in range(0, stride, channels):
            counts[(line[x], line[x + 1], line[x + 2])] += 1
        previous = line
    return counts


def _unfilter(kind: int, line: bytearray, prev: bytearray, bpp: int) -> bytearray:
    for i in range(len(line)):
        a = line[i - bpp] if i >= bpp else 0
        b, c = prev[i], prev[i - bpp] if i >= bpp else 0
        if kind == 1:
            line[i] = (line[i] + a) & 0xFF
        elif kind == 2:
            line[i] = (line[i] + b) & 0xFF
        elif kind == 3:
            line[i] = (line[i] + (a + b) // 2) & 0xFF
        elif kind == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
    return line


def hex_rgb(color: str) -> tuple[int, int, int]:
    """ "#1a7f37" -> (26, 127, 55)."""
    value = color.lstrip("#")
    return (int(value[0:2], 16), int(value[2:4], 16), int(value[4:6], 16))
