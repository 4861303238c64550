"""`vllm-fleet tune` on a real lab host (lab1: vLLM's CPU build serving the tiny model, so the figures are
this machine's CPU, not a GPU's): four points of max-num-seqs, each a transient trial server benchmarked
by `vllm bench serve`, while the instance is drained and stopped. Afterwards the instance serves again
from the files it had, the trial servers ran with the serving unit's own sandbox (systemd reports both
units' properties), and the report is opened in headless Chromium and looked at: the Pareto plot and the
recommended point must be on the picture.

`deploys/bench.py` (the bench of the running instance, no sweep) runs here too, without changing it.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from pathlib import Path

from tests import browser
from tests.hosts.conftest import INVENTORY, ROOT, deploy, on, unit_props
from vllm_fleet.core import render
from vllm_fleet.core.render import _CONFINING

TRIAL = "vllm-tune-trial-default.service"
VLLM_FLEET = str(Path(sys.executable).parent / "vllm-fleet")
FILES = "sha256sum /etc/vllm/default.yaml /etc/systemd/system/vllm-default.service"


def _keys() -> list[str]:
    """What confines vLLM's unit: every key of the shared hardening and the unit's own device, path and
    network lines; User too (a trial as root would make the rest moot)."""
    lines = render.environment().get_template("sandbox.j2").render().splitlines()
    keys = {line.split("=", 1)[0] for line in lines if "=" in line and not line.startswith("{#")}
    return sorted(keys | set(_CONFINING) | {"User"})


def _show(unit: str, keys: list[str]) -> dict[str, str]:
    text = on("lab1", f"systemctl show {unit} -p ActiveState " + " ".join(f"-p {k}" for k in keys))
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_bench_of_the_running_instance_changes_nothing(deployed):
    pid = unit_props("lab1")["MainPID"]
    run = deploy("deploys/bench.py", limit="lab1",
                 env={"VLLM_FLEET_BENCH_SWEEP_MULTIPLES": "0", "VLLM_FLEET_BENCH_NUM_PROMPTS": "4"})
    assert run.rc == 0, run.output[-4000:]
    row = next(line for line in run.output.splitlines() if "serving (as deployed)" in line)
    assert " 4/0 " in row, row
    assert "untouched" in run.output and unit_props("lab1")["MainPID"] == pid


def test_tune_four_points_restores_the_instance_and_the_report_shows_the_recommendation(deployed, tmp_path):
    import subprocess

    keys = _keys()
    seen: list[dict[str, str]] = []
    done = threading.Event()

    def watch() -> None:  # a trial lives for its start-up and one short bench: catch one while active
        while not done.is_set() and not seen:
            props = _show(TRIAL, keys)
            if props.get("ActiveState") == "active":
                seen.append(props)
            time.sleep(0.5)

    serving_before = {k: v for k, v in _show("vllm-default.service", keys).items() if k != "ActiveState"}
    pid, files = unit_props("lab1")["MainPID"], on("lab1", FILES)
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.monotonic()
    try:
        run = subprocess.run([VLLM_FLEET, "tune", INVENTORY, "--host", "lab1",
                              "--grid", "max_num_seqs=4,16,64",
                              "--num-prompts", "16", "--input-len", "32", "--output-len", "16",
                              "--target-ms", "60000", "--output", str(tmp_path)],
                             cwd=ROOT, env={**os.environ, "VLLM_FLEET_TEST_OVERRIDES": "{}"}, text=True,
                             capture_output=True, timeout=1500)
    finally:
        done.set()
        watcher.join(timeout=30)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-5000:]
    print(f"tune: 4 points in {time.monotonic() - t0:.0f} s (the command's wall time)")
    # one progress line per trial, in order
    progress = re.findall(r"^tune (\d)/4 ", run.stdout, re.M)
    assert progress == ["1", "2", "3", "4"], out[-3000:]
    back = r"vllm-default.service restarted back \(MainPID \d+ -> \d+\), its files unchanged; 4 points"
    assert re.search(back, run.stdout), out[-3000:]

    # the instance: restarted back from the very same files, serving, its unit's sandbox unchanged
    after = unit_props("lab1")
    assert after["ActiveState"] == "active" and after["MainPID"] != pid, after
    assert on("lab1", FILES) == files
    assert on("lab1", "curl -fsS -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/health") == "200"
    assert _show(TRIAL, ["User"])["ActiveState"] == "inactive"  # no trial left running
    # the trial servers ran in the serving unit's sandbox
    assert seen, "no trial unit was seen active: " + out[-3000:]
    trial = {k: v for k, v in seen[0].items() if k != "ActiveState"}
    differ = {k: (trial.get(k), serving_before.get(k)) for k in keys if trial.get(k) != serving_before.get(k)}
    assert trial == serving_before, differ
    assert serving_before["User"] == "vllm" and serving_before["ProtectSystem"] == "strict"

    facts = json.loads((tmp_path / "tune-report.json").read_text())
    assert len(facts["points"]) == 4 and facts["points"][0]["baseline"], facts["points"]
    assert all(p["usable"] for p in facts["points"]), facts["points"]
    assert facts["restored"]["files_before"] == facts["restored"]["files_after"]
    rec = facts["recommendation"]
    best = max(facts["points"], key=lambda p: p["result"]["output_throughput"])
    assert rec["output_throughput"] == best["result"]["output_throughput"], (rec, best)
    print(f"tune: recommended {rec['label']} at {rec['output_throughput']:.1f} output tok/s, "
          f"gain over the inventory's values {rec['gain']}")

    # the report, as a person sees it
    page = tmp_path / "tune-report.html"
    built = browser.dom(page)
    assert 'class="recommended"' in built and 'class="frontier"' in built, built[:3000]
    section = re.search(r'id="recommendation".*?</section>', built, re.S)
    assert section and rec["label"] in section.group(0), built[:4000]
    png = browser.screenshot(page, tmp_path / "tune-report.png", 1200, 1400)
    red = browser.colour_pixels(png, (0xD6, 0x27, 0x28))  # the recommended point and its box
    assert red > 200, f"the recommended point is not on the picture ({red} red pixels): {png}"
    artifacts = os.environ.get("VLLM_FLEET_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        (Path(artifacts) / "tune-report.png").write_bytes(png.read_bytes())
        (Path(artifacts) / "tune-report.json").write_text(json.dumps(facts, indent=2))
