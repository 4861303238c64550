"""A lab host whose nvidia-smi replays a real capture: the lab's stand-in for a GPU host.

No GPU or NVIDIA driver exists on the lab's machines. The captures (tests/fixtures/nvidia/, INDEX.md says
where each came from) are what real nvidia-smi printed; tests/fixtures/nvidia/fake-nvidia-smi.sh answers
the queries the deploy makes from them. Everything that reads nvidia-smi sees that GPU; NVML, and so
vLLM, sees none.
"""

from __future__ import annotations

from pathlib import Path

import fleetlab as lab

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "nvidia"
H100 = FIXTURES / "query_csv" / "ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt"  # 1x H100, driver 590.48.01
H100_Q = FIXTURES / "smi_q" / "ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt"


def _put(host: lab.LabHost, path: str, content: str, mode: str) -> None:
    out = lab.ssh(host, f"cat > {path} && chmod {mode} {path}", stdin=content)
    if out.returncode != 0:
        raise lab.LabError(f"{host.name}: writing {path} failed: {out.stderr.strip()}")


def replay(host: lab.LabHost, capture: Path = H100, q_capture: Path | None = H100_Q) -> None:
    """Put /usr/local/bin/nvidia-smi on the host, answering from `capture` (and `-q` from q_capture)."""
    _put(host, "/root/fake-nvidia-smi.sh", (FIXTURES / "fake-nvidia-smi.sh").read_text(), "755")
    _put(host, "/root/capture.txt", capture.read_text(), "644")
    env = "FAKE_SMI_CAPTURE=/root/capture.txt"
    if q_capture is not None:
        _put(host, "/root/capture-q.txt", q_capture.read_text(), "644")
        env += " FAKE_SMI_Q_CAPTURE=/root/capture-q.txt"
    wrapper = f"#!/bin/sh\nexec env {env} /root/fake-nvidia-smi.sh \"$@\"\n"
    _put(host, "/usr/local/bin/nvidia-smi", wrapper, "755")
