"""Issue 3 on a real host whose GPU is SIMULATED: lab2 gets /usr/local/bin/nvidia-smi, a script that
replays a real captured output (tests/fixtures/nvidia/, see INDEX.md for where each came from).

Captures used: query_csv/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt (1x H100 80GB HBM3, driver
590.48.01) and errors/nvml-mismatch-with-lib-version-550.144.txt ("Driver/library version mismatch").
The GPU health test also replays `nvidia-smi -q`: the same H100's idle -q capture with its "Remapped
Rows" section replaced, line for line, by that of a real H100 with a pending row remap
(smi_q/h100-x8-550.90.07-ecc-rowremapper-remap-pending-FRAGMENT.txt: same 2560-bank H100, another
machine). No public capture has both the query and the -q of a GPU with errors, so the test combines
these two; no value is edited. No GPU exists on this machine; nothing here installs a CUDA build.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fleetlab as lab
from fleetlab.inventory import lab_cluster_vllm
from tests.hosts.conftest import INVENTORY, PYINFRA, ROOT, deploy, host_files_digest, on, unit_props

FIXTURES = ROOT / "tests" / "fixtures" / "nvidia"
H100 = "query_csv/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt"
MISMATCH = "errors/nvml-mismatch-with-lib-version-550.144.txt"
H100_Q = "smi_q/ue-nvidia-h100-80gb-hbm3-590.48.01-idle.txt"
REMAP_PENDING = "smi_q/h100-x8-550.90.07-ecc-rowremapper-remap-pending-FRAGMENT.txt"
CUDA = {"lab2": {"accelerator": "cuda", "install_source": "registry"}}
# The device-minor test: 4x A100 whose nvidia-smi indexes 0-3 are /dev/nvidia3-6 (a real -q fragment; the
# query CSV is derived from that host's table and -q, see INDEX.md), with the minors permuted as in
# tests/unit/test_gpu_minors.py (nvidia-smi's PCI bus order vs the driver's probe order).
A100X4 = "query_csv/a100-sxm4-80gb-x4-555.42.02-DERIVED-from-table-and-q.txt"
A100X4_Q = "smi_q/a100-sxm4-80gb-x4-555.42.02-minors-3-to-6-FRAGMENT.txt"
# The -q a capture is replayed with by default: the same machine's, so each GPU has its Minor Number (the
# plan refuses a GPU whose device minor it cannot read).
Q_OF = {H100: H100_Q, A100X4: A100X4_Q}


def _put(host: str, path: str, content: str, mode: str) -> None:
    out = lab.ssh(lab.LabHost(int(host.removeprefix("lab"))), f"cat > {path} && chmod {mode} {path}",
                  stdin=content)
    assert out.returncode == 0, out.stderr


@pytest.fixture()
def simulated_gpu(deployed):
    """A host's nvidia-smi (lab2's unless told) replays a capture; removed afterwards so later tests see
    CPU hosts again."""
    used: set[str] = set()

    def use(capture: str | None = None, error: str | None = None, rc: int = 0,
            q_text: str | None = None, host: str = "lab2") -> None:
        used.add(host)
        _put(host, "/root/fake-nvidia-smi.sh", (FIXTURES / "fake-nvidia-smi.sh").read_text(), "755")
        if capture:
            _put(host, "/root/capture.txt", (FIXTURES / capture).read_text(), "644")
            if q_text is None and capture in Q_OF:
                q_text = (FIXTURES / Q_OF[capture]).read_text()
            env = "FAKE_SMI_CAPTURE=/root/capture.txt"
            if q_text is not None:
                _put(host, "/root/capture-q.txt", q_text, "644")
                env += " FAKE_SMI_Q_CAPTURE=/root/capture-q.txt"
        else:
            _put(host, "/root/error.txt", (FIXTURES / error).read_text(), "644")
            env = f"FAKE_SMI_ERROR=/root/error.txt FAKE_SMI_RC={rc}"
        wrapper = f"#!/bin/sh\nexec env {env} /root/fake-nvidia-smi.sh \"$@\"\n"
        _put(host, "/usr/local/bin/nvidia-smi", wrapper, "755")

    yield use
    for host in sorted(used):
        on(host, "rm -f /usr/local/bin/nvidia-smi /root/fake-nvidia-smi.sh /root/capture.txt /root/error.txt "
                 "/root/capture-q.txt")


def _plan(overrides: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, "VLLM_FLEET_TEST_OVERRIDES": json.dumps(overrides)}
    return subprocess.run([str(Path(sys.executable).parent / "vllm-fleet"), "plan", INVENTORY], cwd=ROOT,
                          env=env, text=True, capture_output=True, timeout=300)


def test_plan_and_dry_run_show_the_cuda_13_build_for_a_simulated_h100(simulated_gpu):
    simulated_gpu(capture=H100)
    out = _plan(CUDA).stdout
    row = next(line for line in out.splitlines() if line.startswith("lab2 "))
    assert "cuda" in row and "1x NVIDIA H100 80GB HBM3 (9.0, 80 GiB)" in row and "590.48.01" in row
    assert "cu130" in row and "0.32.0-cu130" in row
    assert "default: tiny-llama (TP 1, bfloat16)" in row  # compute capability 9.0 -> bf16
    # registry mode: the host installs the lock resolved for its Python from the index, nothing else
    lock = next(line for line in out.splitlines() if line.startswith("lab2: lock: "))
    assert re.fullmatch(r"lab2: lock: [0-9a-f]{16} for cp311-x86_64-manylinux_2_36-cu130", lock), lock
    install = next(line for line in out.splitlines() if line.startswith("lab2: install: "))
    assert install.endswith("--no-deps --require-hashes -r /opt/vllm/releases/.tmp-0.32.0-cu130/.lock"), \
        install
    assert "--find-links" not in install
    assert next(line for line in out.splitlines() if line.startswith("lab1 ")).split()[1] == "cpu"

    before = host_files_digest("lab2")
    env = {**os.environ, "VLLM_FLEET_TEST_OVERRIDES": json.dumps(CUDA)}
    dry = subprocess.run([PYINFRA, "--dry", "--limit", "lab2", INVENTORY, "deploys/vllm.py"], cwd=ROOT,
                         env=env, text=True, capture_output=True, timeout=300)
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    text = dry.stdout + dry.stderr
    digest = lock.split()[2]
    assert (f"build release 0.32.0-cu130 from lock {digest} (cp311-x86_64-manylinux_2_36-cu130): uv pip "
            "install --quiet --python /opt/vllm/releases/.tmp-0.32.0-cu130/bin/python --no-deps "
            "--require-hashes -r /opt/vllm/releases/.tmp-0.32.0-cu130/.lock") in text
    assert host_files_digest("lab2") == before  # a dry run changes nothing


def test_driver_library_mismatch_is_refused_and_nothing_changes(simulated_gpu):
    simulated_gpu(error=MISMATCH, rc=18)
    before = {h: (host_files_digest(h), unit_props(h)["MainPID"]) for h in ("lab1", "lab2")}
    run = deploy(overrides={"lab2": {"accelerator": "cuda"}})
    assert run.rc != 0
    assert "lab2" in run.output and "mismatch" in run.output.lower()
    assert "reboot" in run.output.lower() and "reload" in run.output.lower()
    assert "Beginning operation run" not in run.output
    for h in ("lab1", "lab2"):
        assert (host_files_digest(h), unit_props(h)["MainPID"]) == before[h]


def _section(text: str, title: str) -> str:
    """A GPU's -q section (four-space indented title) with every deeper line under it."""
    lines = text.splitlines(keepends=True)
    start = next(i for i, ln in enumerate(lines) if ln.rstrip() == f"    {title}")
    end = next((i for i in range(start + 1, len(lines))
                if len(lines[i]) - len(lines[i].lstrip(" ")) <= 4 and lines[i].strip()), len(lines))
    return "".join(lines[start:end])


def _h100_with_pending_remap() -> str:
    idle, pending = (FIXTURES / H100_Q).read_text(), (FIXTURES / REMAP_PENDING).read_text()
    return idle.replace(_section(idle, "Remapped Rows"), _section(pending, "Remapped Rows"))


def test_a_gpu_with_a_pending_row_remap_is_refused_for_a_new_instance_and_nothing_changes(simulated_gpu):
    """A new instance ("fresh", no unit on lab2) on the GPU is refused, naming host, instance and GPU; the
    instance already deployed there ("default") is only warned. Both plans change nothing."""
    simulated_gpu(capture=H100, q_text=_h100_with_pending_remap())
    before = {h: (host_files_digest(h), unit_props(h)["MainPID"]) for h in ("lab1", "lab2")}

    run = _plan({"lab2": {**CUDA["lab2"], "name": "fresh"}})
    text = run.stdout + run.stderr
    assert run.returncode != 0, text[-3000:]
    assert ("lab2: vllm.instances[fresh].gpus: GPU 0 NVIDIA H100 80GB HBM3 (compute capability 9.0) "
            "(PCI 00000000:00:09.0): a row remap is pending") in text
    assert "`nvidia-smi -r -i 0`" in text

    run = _plan(CUDA)
    text = run.stdout + run.stderr
    assert run.returncode == 0, text[-3000:]
    assert ("lab2: vllm.instances[default].gpus: already deployed here, so not refused: GPU 0 NVIDIA H100 "
            "80GB HBM3") in text
    for h in ("lab1", "lab2"):
        assert (host_files_digest(h), unit_props(h)["MainPID"]) == before[h]


def test_plan_uses_device_minors_not_indexes_and_refuses_a_gpu_without_one(simulated_gpu):
    """The minors come through the real fact command on lab2 (fake nvidia-smi, no /proc/driver/nvidia
    there); a GPU whose -q shows no Minor Number is refused by host name. Both plans change nothing."""
    from tests.unit.test_gpu_minors import permuted

    four = {"lab2": {**CUDA["lab2"], "gpus": [1, 3]}}
    before = {h: (host_files_digest(h), unit_props(h)["MainPID"]) for h in ("lab1", "lab2")}
    simulated_gpu(capture=A100X4, q_text=permuted())
    fact = subprocess.run([PYINFRA, "--limit", "lab2", INVENTORY, "fact",
                           "vllm_fleet.roles.nvidia_facts.NvidiaGpus"],
                          cwd=ROOT, text=True, capture_output=True, timeout=300)
    assert fact.returncode == 0, fact.stdout[-3000:] + fact.stderr[-3000:]
    # each GPU's index, then its minor (pyinfra prints the fact on stderr, Gpu records as JSON objects
    # or as their repr)
    pairs = {(int(i), int(m)) for i, m in re.findall(r'index["\'=:\s]+(\d+)\b.*?minor["\'=:\s]+(\d+)',
                                                     fact.stdout + fact.stderr, re.S)}
    assert {(0, 5), (1, 3), (2, 6), (3, 4)} <= pairs, (fact.stdout + fact.stderr)[-3000:]
    run = _plan(four)
    # the plan takes the minors. On this 555 driver the build is cu129, which is not on PyPI, the only
    # index the lab's controller reaches: the plan refuses its lock, and nothing else
    row = next(line for line in run.stdout.splitlines() if line.startswith("lab2 "))
    assert "4x NVIDIA A100-SXM4-80GB" in row and " cu129 " in row, run.stdout[-3000:]
    refusals = [line for line in run.stdout.splitlines() if line.startswith("lab2: refused: ")]
    assert len(refusals) == 1 and "0.32.0-cu129: resolving vllm==0.32.0+cu129 for " in refusals[0], refusals
    assert "minor" not in refusals[0]

    simulated_gpu(capture=A100X4, q_text="".join(ln for ln in permuted().splitlines(keepends=True)
                                                 if "Minor Number" not in ln))
    run = _plan(four)
    text = run.stdout + run.stderr
    assert run.returncode != 0, text[-3000:]
    assert ("lab2: vllm.instances[default].gpus: the device minor number (the N of /dev/nvidiaN) of "
            "GPU 1 ") in text
    for h in ("lab1", "lab2"):
        assert (host_files_digest(h), unit_props(h)["MainPID"]) == before[h]


def test_a_node_group_whose_nodes_facts_differ_is_refused_at_plan_time(simulated_gpu):
    """Both GPUs SIMULATED: lab1 replays the 1x H100 capture (driver 590.48.01), lab2 the 4x A100 one
    (driver 555.42.02). The inventory agrees (one cluster, no gpus list: each node takes all of its own);
    the facts do not: lab2's driver allows only the CUDA 12.9 build, and its 4 GPUs make another tensor
    parallel size. The plan refuses the node that differs from the nodes planned before it (pyinfra
    plans the hosts at once, so either may be first), naming both nodes and what to change, before any
    host is touched."""
    simulated_gpu(capture=H100, host="lab1")
    simulated_gpu(capture=A100X4)
    group = {name: {**lab_cluster_vllm(i, ["lab1", "lab2"]), "accelerator": "cuda",
                    "install_source": "registry"} for i, name in enumerate(("lab1", "lab2"))}
    for data in group.values():
        data["cluster"] = {**data["cluster"], "split": "pipeline"}
    out = _plan({"__replace__": group})
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    release = {"lab1": "0.32.0-cu130", "lab2": "0.32.0-cu129"}
    gpus = {"lab1": 1, "lab2": 4}
    said = [(here, there) for here, there in (("lab1", "lab2"), ("lab2", "lab1"))
            if f"{here}: cluster 'pair': release is '{release[here]}' here and '{release[there]}' on "
               f"{there}; every node of a group starts the same engine" in text]
    assert len(said) == 1, text[-3000:]
    here, there = said[0]
    assert (f"{here}: cluster 'pair': gpus is {gpus[here]} here and {gpus[there]} on {there}; every node of "
            "a group starts the same engine (each node computes its share") in text
    assert "Traceback" not in text
