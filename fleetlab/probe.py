"""What a lab host's clients would see while the deploy works on it: /health sampled on the host itself,
and a slow link to it (for work that must take long enough to be seen, like a model fetch)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator

from fleetlab import LabHost, ssh

LOG = "/tmp/lab-health-poll.log"
UNIT = "lab-health-poll"


class HealthPoll:
    """/health every 0.2 s from a transient unit on the host: (unix time, HTTP code) samples."""

    def __init__(self, host: LabHost, port: int = 8000):
        self.host, self.port = host, port

    def start(self) -> None:
        ssh(self.host, f"systemctl stop {UNIT} 2>/dev/null; rm -f {LOG}; "
                       f"systemd-run --quiet --collect --unit={UNIT} sh -c 'while :; do echo $(date +%s.%N) "
                       f"$(curl -s -o /dev/null -m 1 -w %{{http_code}} http://127.0.0.1:{self.port}/health); "
                       f"sleep 0.2; done >> {LOG}'", timeout=60)

    def last(self) -> str:
        return ssh(self.host, f"tail -n1 {LOG}", timeout=60).stdout.strip()

    def stop(self) -> list[tuple[float, str]]:
        out = ssh(self.host, f"systemctl stop {UNIT}; cat {LOG}", timeout=60).stdout
        return [(float(t), code) for t, code in (line.split() for line in out.splitlines() if line.strip())]


@contextlib.contextmanager
def slow_link(host: LabHost, rate: str) -> Iterator[None]:
    """The controller's side of the host's link limited to `rate` (tc tbf): what the host downloads from
    the controller (a mirror on it) comes at that rate."""
    dev = f"ve-{host.name}"
    subprocess.run(["tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", "32kbit",
                    "latency", "400ms"], check=True)
    try:
        yield
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", dev, "root"], check=False)
