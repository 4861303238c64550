"""Open a page in Debian's headless Chromium as a person would: a screenshot to look at, and the DOM the
browser built (what it drew, not the file's text). Chromium is installed by scripts/setup.sh."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
# as root, on a machine without a network: no sandbox, no GPU, no background connections
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-device-scale-factor=1"]


def _chromium() -> str:
    found = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    if found is None:
        pytest.fail("chromium is missing: scripts/setup.sh installs it as root (make test does), or "
                    "apt-get install -y --no-install-recommends chromium")
    return found


def _run(args: list[str]) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        return subprocess.run([_chromium(), *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                              text=True, timeout=120)


def screenshot(page: Path, png: Path, width: int = 1000, height: int = 1400) -> Path:
    out = _run([f"--window-size={width},{height}", f"--screenshot={png}", page.resolve().as_uri()])
    assert png.exists() and png.stat().st_size > 0, out.stderr[-2000:]
    return png


def dom(page: Path) -> str:
    out = _run(["--dump-dom", page.resolve().as_uri()])
    assert out.returncode == 0 and "<html" in out.stdout, out.stderr[-2000:]
    return out.stdout


def colour_pixels(png: Path, rgb: tuple[int, int, int], box: tuple[int, int, int, int] | None = None,
                  tolerance: int = 40) -> int:
    """How many pixels of the screenshot (within `box`) are close to `rgb`: a drawn line or point of
    that colour is there, or it is not."""
    from PIL import Image

    with Image.open(png) as image:
        pixels = image.convert("RGB").crop(box) if box else image.convert("RGB")
        data = pixels.get_flattened_data() if hasattr(pixels, "get_flattened_data") else pixels.getdata()
        return sum(1 for p in data if all(abs(a - b) <= tolerance for a, b in zip(p, rgb, strict=True)))
