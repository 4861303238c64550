"""The vllm user plays the attacker (a malicious model or an engine bug runs as it): it plants symlinks
where root used to write (the old /var/lib/vllm/models, a model directory, a staging directory), then a
deploy stages a new model version, commits, prunes and rolls back, on a real lab host.

Nothing outside the deploy's own paths changes owner, mode or content; what root writes (models,
configs, units) lives in directories the vllm user can only read; a rollback serves the previous
weights, unchanged, from their own directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fleetlab.inventory import TINY_MODEL
from tests.hosts.conftest import deploy, on

HOST = "lab1"
# link -> what root would have written into or deleted from by following it
PLANTS = {
    "/var/lib/vllm/models": "/etc/ssh",
    "/var/lib/vllm/tiny-llama": "/root",
    "/var/lib/vllm/.staging": "/etc",
}
# everything outside the deploy's own paths that a followed link could reach
WATCH = ("find /etc /root \\( -path /etc/vllm -o -path /etc/systemd/system -o -path "
         "/etc/haproxy \\) -prune -o -printf '%p %u:%g %m %y\\n' | sort; "
         "find /etc /root \\( -path /etc/vllm -o -path /etc/systemd/system -o -path "
         "/etc/haproxy \\) -prune -o -type f -print0 | sort -z | xargs -0 sha256sum")


def as_vllm(cmd: str) -> str:
    return on(HOST, f"runuser -u vllm -- sh -c {json.dumps(cmd)} 2>&1; echo rc=$?")


def model_dir() -> str:
    cfg = on(HOST, "cat /etc/vllm/default.yaml")
    return next(line.split(":", 1)[1].strip().strip("'\"") for line in cfg.splitlines()
                if line.startswith("model:"))


@pytest.fixture
def changed_model(tmp_path: Path) -> Path:
    """The tiny model with one file changed: a new content version of the same model."""
    copy = tmp_path / "tiny-llama"
    shutil.copytree(TINY_MODEL, copy)
    gen = copy / "generation_config.json"
    data = json.loads(gen.read_text()) if gen.exists() else {}
    gen.write_text(json.dumps({**data, "vllm_fleet_test": "second version"}))
    return copy


def test_links_planted_by_the_vllm_user_are_never_followed_and_rollback_restores_the_weights(
        deployed, changed_model):
    first = model_dir()
    assert first.startswith("/opt/vllm/models/tiny-llama/"), first
    first_sums = on(HOST, f"cd {first} && sha256sum * | sort")
    # what root writes is not the vllm user's to change
    for path in ("/opt/vllm/models", "/opt/vllm/models/tiny-llama", first, "/etc/vllm"):
        out = as_vllm(f"touch {path}/planted")
        assert "rc=0" not in out, f"the vllm user could write into {path}"
    assert on(HOST, f"stat -c '%U:%G %a' {first}/config.json").split() == ["root:vllm", "640"]

    before = on(HOST, WATCH)
    for link, target in PLANTS.items():
        out = as_vllm(f"rm -rf {link} && ln -s {target} {link}")
        assert out.strip().endswith("rc=0"), out
    try:
        run = deploy(overrides={HOST: {"model": {"path": str(changed_model)}}}, limit=HOST)
        assert run.rc == 0, run.output[-4000:]
        second = model_dir()
        assert second != first and second.startswith("/opt/vllm/models/tiny-llama/")
        # staged beside the models (same file system, the final mv a rename), not through /etc
        assert on(HOST, "stat -c '%U %a' /opt/vllm/models/.staging").split() == ["root", "700"]
        assert on(HOST, f"test -d {first} && echo kept").strip() == "kept"  # the previous version stays

        rb = deploy("deploys/rollback.py", limit=HOST)
        assert rb.rc == 0, rb.output[-4000:]
        assert all(r["ok"] for r in rb.smoke), rb.smoke
        assert model_dir() == first
        assert on(HOST, f"cd {first} && sha256sum * | sort") == first_sums  # the old weights, unchanged

        after = on(HOST, WATCH)
        assert after == before, "a path outside the deploy's own changed"
        for link, target in PLANTS.items():  # root left the links alone, and never went through them
            assert on(HOST, f"readlink {link}").strip() == target
    finally:
        on(HOST, "rm -f " + " ".join(PLANTS))
