"""The lab's Hugging Face-compatible mirror: olah (a hub mirror server from PyPI) run offline on the
controller, serving the tiny model as a local git repository with two revisions.

Why olah: the lab may not download from the public hub, and a site mirror is how fleets without a
route to the hub get models; olah serves a local repository (`mirrors-path`) with the hub's API
(revision, tree, resolve) and no upstream (`offline = true`). It listens on HUB_ADDRESS, an address of
the controller every lab host reaches through its default route, so one `hf_endpoint` serves the fleet,
and a test can cut one host off it (`cut_off`) while the controller and the other hosts still reach it.

Usage: ``python -m fleetlab.hubmirror serve`` (foreground, for trying things by hand).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from fleetlab import LabHost, _run, tinymodel

OLAH_VERSION = "0.5.4"
CACHE = Path(os.environ.get("VLLM_FLEET_CACHE", "/var/cache/vllm-fleet"))
OLAH_VENV = CACHE / f"olah-{OLAH_VERSION}"
HUB_ADDRESS = "10.77.0.1"  # on the controller's loopback: in no lab host's own /24
PORT = 18090
REPO = "fleetlab/tiny-llama"
SEEDS = (0, 1)  # the repository's two revisions: the tiny model with each seed, in this order


@dataclass
class Mirror:
    url: str
    repo: str
    shas: tuple[str, ...]  # commits, oldest first
    process: subprocess.Popen
    workdir: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def answers(self) -> bool:
        return _answers(self.url)


def olah() -> Path:
    """olah in a venv of its own (it pins its own huggingface_hub and pydantic), made once."""
    if not (OLAH_VENV / "bin" / "olah-cli").exists():
        tmp = OLAH_VENV.with_name(OLAH_VENV.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(tmp)])
        _run([str(tmp / "bin" / "pip"), "install", "-q", f"olah=={OLAH_VERSION}"])
        shutil.rmtree(OLAH_VENV, ignore_errors=True)
        tmp.rename(OLAH_VENV)  # its scripts' #! lines name the old path: olah runs through the interpreter
    return OLAH_VENV / "bin" / "python"


def hub_address() -> str:
    """HUB_ADDRESS on the controller's loopback (idempotent; no dummy links in every kernel): lab hosts
    reach it through their default route, the controller as its own."""
    if f" {HUB_ADDRESS}/32 " not in _run(["ip", "-o", "addr", "show", "dev", "lo"]).stdout:
        _run(["ip", "addr", "add", f"{HUB_ADDRESS}/32", "dev", "lo"])
    return HUB_ADDRESS


def cut_off(host: LabHost, cut: bool = True) -> None:
    """A lab host loses (or regains) its route to the mirror, as behind a broken site link; SSH and
    the rest of the lab are untouched."""
    _run(["ip", "-n", host.name, "route", "del" if not cut else "add", "unreachable", f"{HUB_ADDRESS}/32"],
         check=cut)


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "fleetlab", "GIT_AUTHOR_EMAIL": "lab@fleet.invalid",
           "GIT_COMMITTER_NAME": "fleetlab", "GIT_COMMITTER_EMAIL": "lab@fleet.invalid",
           "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def build_repository(workdir: Path) -> tuple[str, ...]:
    """mirrors/models/<org>/<name>, a git checkout with one commit per seed (tag v1 on the first);
    dated commits, so the shas are the same on every run."""
    repo = workdir / "mirrors" / "models" / REPO
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    shas = []
    for i, seed in enumerate(SEEDS):
        made = workdir / f"seed{seed}"
        tinymodel.make_tiny_model(made, seed=seed)
        for f in repo.iterdir():
            if f.name != ".git":
                f.unlink()
        for f in made.iterdir():
            shutil.copy(f, repo / f.name)  # dated now: git sees the change of a same-sized file
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"tiny-llama, seed {seed}")
        shas.append(_git(repo, "rev-parse", "HEAD"))
        if i == 0:
            _git(repo, "tag", "v1")
    return tuple(shas)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/api/models/{REPO}/revision/main", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def start(workdir: Path, port: int = PORT, timeout: float = 60) -> Mirror:
    workdir.mkdir(parents=True, exist_ok=True)
    shas = build_repository(workdir)
    address = hub_address()
    url = f"http://{address}:{port}"
    config = workdir / "olah.toml"
    config.write_text(f"""[basic]
host = "{address}"
port = {port}
repos-path = "{workdir / 'repos'}"
mirrors-path = ["{workdir / 'mirrors'}"]
hf-scheme = "http"
hf-netloc = "127.0.0.1:9"
hf-lfs-netloc = "127.0.0.1:9"
mirror-scheme = "http"
mirror-netloc = "{address}:{port}"
mirror-lfs-netloc = "{address}:{port}"

[accessibility]
offline = true
""")
    log = open(workdir / "olah.log", "w")  # noqa: SIM115 - handed to the child
    launch = "import sys; from olah.server import cli; sys.argv[0] = 'olah-cli'; sys.exit(cli())"
    proc = subprocess.Popen([str(olah()), "-c", launch, "-c", str(config)], cwd=workdir,
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    mirror = Mirror(url, REPO, shas, proc, workdir)
    deadline = time.monotonic() + timeout
    while not mirror.answers():
        if proc.poll() is not None or time.monotonic() > deadline:
            mirror.stop()
            raise RuntimeError(f"olah did not answer at {url}: see {workdir / 'olah.log'}")
        time.sleep(0.3)
    return mirror


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m fleetlab.hubmirror")
    ap.add_argument("command", choices=["serve"])
    ap.add_argument("--dir", default="lab/hub")
    args = ap.parse_args(argv)
    m = start(Path(args.dir).resolve())
    print(f"olah serving {m.repo} at {m.url}: revisions {', '.join(s[:12] for s in m.shas)} (v1 = first)")
    try:
        m.process.wait()
    except KeyboardInterrupt:
        m.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
