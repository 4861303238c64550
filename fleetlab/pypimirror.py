"""The lab's PyPI mirror: proxpi (a caching PyPI proxy from PyPI) run on the controller, so lab hosts,
which have no route to a registry, install wheels from PyPI through it.

Why proxpi: a fleet without a route to PyPI gets its wheels from a site mirror, and the deploy under test
must work against one. proxpi speaks the simple API (HTML and PEP 691 JSON, with PEP 658 metadata), keeps
downloaded files in a size-limited cache directory that survives restarts, and serves file links relative
to its own index, so a host only ever talks to the mirror. It listens on hubmirror.HUB_ADDRESS, the
controller address every lab host reaches through its default route.

Clients: the mirror is plain HTTP on an address that is not localhost, so pip needs
``--trusted-host 10.77.0.1``; and a file proxpi has not cached yet is answered only once proxpi has it
whole, so a client's read timeout must outlast the largest wheel's download (pip --timeout, uv
UV_HTTP_TIMEOUT).

Usage: ``python -m fleetlab.pypimirror start|stop|url``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import fleetlab as lab
from fleetlab import CACHE_DIR, _run
from fleetlab.hubmirror import HUB_ADDRESS, hub_address

PROXPI_VERSION = "1.3.1"
GUNICORN_VERSION = "23.0.0"
VENV = CACHE_DIR / f"proxpi-{PROXPI_VERSION}"
FILES = CACHE_DIR / "pypi-mirror-cache"  # kept across restarts and labs: wheels are immutable
PIDFILE = CACHE_DIR / "pypi-mirror.pid"
LOG = CACHE_DIR / "pypi-mirror.log"
PORT = 18091
UPSTREAM = os.environ.get("VLLM_FLEET_PYPI_UPSTREAM", "https://pypi.org/simple/")
# A vLLM install with its CUDA torch is ~6 GiB of wheels; twice that leaves room for a second version
# before proxpi evicts (least-used first).
CACHE_BYTES = 12 * 2**30
# proxpi redirects a client to the upstream file URL when a download takes longer than this (0.9 s by
# default); lab hosts have no route there, so a client waits for the whole file instead.
DOWNLOAD_WAIT_S = 3600
# proxpi's index and file cache live in one process's memory: one worker, threads for concurrency.
THREADS = 16


def index_url(port: int = PORT) -> str:
    return f"http://{HUB_ADDRESS}:{port}/index/"


def proxpi() -> Path:
    """proxpi and gunicorn in a venv of their own (flask, lxml, requests stay out of the product's),
    made once; returns the venv's python."""
    if not (VENV / "bin" / "gunicorn").exists():
        tmp = VENV.with_name(VENV.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(tmp)])
        _run([str(tmp / "bin" / "pip"), "install", "-q", f"proxpi=={PROXPI_VERSION}",
              f"gunicorn=={GUNICORN_VERSION}"])
        shutil.rmtree(VENV, ignore_errors=True)
        tmp.rename(VENV)  # its scripts' #! lines name the old path: gunicorn runs through the interpreter
    return VENV / "bin" / "python"


def environment() -> dict[str, str]:
    """proxpi is configured only through its environment (read at import)."""
    return {
        **os.environ,
        "PROXPI_INDEX_URL": UPSTREAM,
        "PROXPI_CACHE_DIR": str(FILES),
        "PROXPI_CACHE_SIZE": str(CACHE_BYTES),
        "PROXPI_DOWNLOAD_TIMEOUT": str(DOWNLOAD_WAIT_S),
        # without these a stalled upstream holds a download thread (and its waiting clients) forever
        "PROXPI_CONNECT_TIMEOUT": "10",
        "PROXPI_READ_TIMEOUT": "120",
        "PROXPI_BINARY_FILE_MIME_TYPE": "1",
    }


def command(port: int = PORT) -> list[str]:
    """gthread workers: a request that waits minutes for a large wheel does not trip gunicorn's worker
    timeout, which only watches the worker's heartbeat."""
    return [str(proxpi()), "-m", "gunicorn", "--workers", "1", "--worker-class", "gthread",
            "--threads", str(THREADS), "--bind", f"{HUB_ADDRESS}:{port}", "--timeout", "60",
            "--access-logfile", "-", "proxpi.server:app"]


def answers(port: int = PORT) -> bool:
    try:
        with urllib.request.urlopen(f"http://{HUB_ADDRESS}:{port}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _pid() -> int | None:
    """The recorded gunicorn, if it still runs (a recycled pid belongs to someone else: left alone)."""
    try:
        pid = int(PIDFILE.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"proxpi.server:app" in cmdline else None


def start(log=print, port: int = PORT, timeout: float = 60) -> str:
    """Start the mirror unless it already answers; returns its index URL (for pip's --index-url)."""
    hub_address()
    url = index_url(port)
    if _pid() and answers(port):
        return url
    stop()
    FILES.mkdir(parents=True, exist_ok=True)
    out = open(LOG, "a")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(command(port), cwd=CACHE_DIR, env=environment(), stdin=subprocess.DEVNULL,
                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    PIDFILE.write_text(str(proc.pid))
    deadline = time.monotonic() + timeout
    while not answers(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop()
            raise RuntimeError(f"proxpi did not answer at {url}: see {LOG}")
        time.sleep(0.3)
    log(f"PyPI mirror (proxpi {PROXPI_VERSION}) at {url}, files cached in {FILES}")
    return url


def stop() -> None:
    """Stop the mirror; its file cache stays for the next start."""
    pid = _pid()
    if pid:
        # gunicorn's arbiter stops its worker; killed, its own session takes the worker with it
        lab.terminate(pid, group=True)
    PIDFILE.unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m fleetlab.pypimirror")
    ap.add_argument("command", choices=["start", "stop", "url"])
    args = ap.parse_args(argv)
    if args.command == "start":
        print(start(log=lambda _: None))
    elif args.command == "stop":
        stop()
    else:
        print(index_url())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
