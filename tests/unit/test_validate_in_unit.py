"""The validator as the service runs it (#34 item 4): the paths a config names are checked with the
rights of whoever runs the check (validate_serve.unreachable), and what the sandboxed validator found is
taken back by root as data only (validate_in_unit.take_outputs). The permission cases run a plain
python3 as the system's `nobody` (CI runs as root), as the service's user would be on a host; the unit
itself is exercised on the lab (tests/hosts/test_validate_as_service.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import vllm_fleet.host
from vllm_fleet.host import validate_in_unit
from vllm_fleet.host.effective import config_paths
from vllm_fleet.host.validate_serve import unreachable

HOST_DIR = Path(vllm_fleet.host.__file__).parent
_POPEN = subprocess.Popen  # the real one, whatever a test patches


@pytest.mark.parametrize(("key", "value", "paths"), [
    ("chat-template", "/etc/vllm/chat.jinja", ["/etc/vllm/chat.jinja"]),
    ("chat-template", "{% for m in messages %}{{ m.content }}{% endfor %}", []),  # an inline template
    ("lora-modules", ["sql=/opt/lora/sql", "chat=/opt/lora/chat"], ["/opt/lora/sql", "/opt/lora/chat"]),
    ("lora-modules", '{"name": "sql", "path": "/opt/lora/sql", "base_model_name": "m"}', ["/opt/lora/sql"]),
    ("speculative-config", '{"model": "/opt/vllm/models/draft", "num_speculative_tokens": 3}',
     ["/opt/vllm/models/draft"]),
    ("speculative-config", {"model": "org/draft", "method": "eagle"}, []),  # a hub id
    ("tokenizer", "Qwen/Qwen3-0.6B", []),
    ("generation-config", "auto", []),
    ("download-dir", "/var/lib/vllm/downloads", ["/var/lib/vllm/downloads"]),
    # not options that name a file the service must find
    ("compilation-config", '{"cache_dir": "/var/lib/vllm/compile"}', []),
    ("default-chat-template-kwargs", '{"switch": "/no_think"}', []),
    ("root-path", "/v1-prefix", []),
    ("model", "/opt/vllm/models/m", []),
    ("max-logprobs", 7, []),
])
def test_the_paths_a_setting_names(key: str, value: object, paths: list[str]) -> None:
    assert config_paths(key, value) == paths


def test_what_is_not_a_path_is_left_alone(tmp_path) -> None:
    config = {"root-path": "/v1-prefix-not-a-file", "model": "/opt/vllm/models/not-here",
              "served-model-name": "tiny", "chat-template": str(tmp_path),
              "compilation-config": '{"cache_dir": "/nowhere/yet"}'}
    assert unreachable(config) == []


def test_a_missing_path_is_named_with_the_sandbox_hint() -> None:
    out = unreachable({"chat-template": "/root/not-here/t.jinja", "tokenizer": "/opt/nowhere/tok"})
    assert out == ["chat-template: /root/not-here/t.jinja: not found where the service runs (the service's "
                   "sandbox hides /home, /root and /run/user, and its /tmp is its own)",
                   "tokenizer: /opt/nowhere/tok: not found where the service runs"]


@pytest.mark.skipif(os.geteuid() != 0, reason="changing user needs root")
def test_a_file_only_root_reads_is_refused_to_the_services_user() -> None:
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:  # pytest's own tmp_path is root's only
        os.chmod(d, 0o755)
        _as_nobody(Path(d))


def _as_nobody(tmp_path: Path) -> None:
    secret = tmp_path / "chat.jinja"
    secret.write_text("{{ messages }}")
    secret.chmod(0o600)
    shared = tmp_path / "ok.jinja"
    shared.write_text("{{ messages }}")
    shared.chmod(0o644)
    closed = tmp_path / "loras"
    closed.mkdir(mode=0o700)
    writable = tmp_path / "downloads"
    writable.mkdir(mode=0o755)
    config = {"chat-template": str(secret), "tool-parser-plugin": str(shared),
              "lora-modules": [f"sql={closed}"], "download-dir": str(writable / "new")}
    code = (f"import json, sys; sys.path.insert(0, {str(HOST_DIR)!r}); import asuser, validate_serve; "
            f"print(json.dumps(asuser.run_as('nobody', lambda: validate_serve.unreachable({config!r}))))")
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    timeout=60, check=True).stdout)
    assert out == {"result": [
        f"chat-template: {secret}: the service's user cannot read it (Permission denied)",
        f"lora-modules: {closed}: the service's user cannot read it (Permission denied)",
        f"download-dir: {writable / 'new'}: the service's user cannot write there ({writable} is read-only "
        "to it)"]}
    assert unreachable(config) == []  # root reads all of them: why the check must not run as root


def test_the_unit_gets_the_units_properties_then_its_own() -> None:
    unit = validate_in_unit.unit_name("default", "0123456789abcdef")
    assert unit == "vllm_fleet-validate-default-01234567"  # never an instance's vllm-<name>.service
    argv = validate_in_unit.unit_argv(unit, "vllm", ["ProtectHome=yes", "PrivateTmp=yes"],
                                      "/var/lib/vllm-fleet/staged/default.environment",
                                      ["/opt/vllm/releases/r/bin/python", "validate_serve.py", "c.yaml"])
    assert argv[:6] == ["systemd-run", "--quiet", "--pipe", "--wait", "--collect", f"--unit={unit}"]
    props = [argv[i + 1] for i, a in enumerate(argv) if a == "-p"]
    assert props == ["ProtectHome=yes", "PrivateTmp=yes", "User=vllm", "Group=vllm",
                     "EnvironmentFile=/var/lib/vllm-fleet/staged/default.environment",
                     "Type=oneshot", f"TimeoutStartSec={validate_in_unit.TIMEOUT_S}"]
    assert argv[-3:] == ["/opt/vllm/releases/r/bin/python", "validate_serve.py", "c.yaml"]


def _run_main(tmp_path: Path, monkeypatch, script: str) -> tuple[int, Path, list[list[str]]]:
    """validate_in_unit.main with systemd-run replaced by a shell that prints `script`'s output ($T is
    the run's token, $C the config copy); the work directory under tmp_path."""
    staged = tmp_path / "staged.yaml"
    staged.write_text("model: /opt/m\n")
    monkeypatch.setattr(validate_in_unit, "WORK", str(tmp_path / "run" / "validate"))
    if os.geteuid() != 0:
        pytest.skip("the work directory is root's")
    seen: list[list[str]] = []

    def fake(argv, **kw):
        seen.append(argv)
        cmd = argv[argv.index("validate_serve.py") - 1:]
        env = {"T": cmd[cmd.index("--findings") + 1], "C": cmd[2], "PATH": os.environ["PATH"]}
        return _POPEN(["sh", "-c", script], env=env, **kw)

    monkeypatch.setattr(validate_in_unit.subprocess, "Popen", fake)
    rc = validate_in_unit.main([str(staged), "--python", "/opt/r/bin/python",
                                "--validator", "validate_serve.py", "--environment", "/s/default.environment",
                                "--instance", "default", "--user", "vllm", "-p", "ProtectHome=yes",
                                "--", "--api-key-expected", "--device", "cpu"])
    return rc, staged, seen


def test_a_pass_takes_the_findings_and_passes_the_rest_on(tmp_path, monkeypatch, capfd) -> None:
    rc, staged, seen = _run_main(tmp_path, monkeypatch, 'cat "$C"; echo ticking; '
                                 'echo "$T .at-default {\\"at_default\\": [\\"seed\\"]}"; echo accepted')
    assert rc == 0
    out = capfd.readouterr().out
    assert "model: /opt/m" in out and "ticking" in out and "accepted" in out and "at_default" not in out
    assert json.loads(Path(f"{staged}.at-default").read_text()) == {"at_default": ["seed"]}
    (argv,) = seen
    command = argv[argv.index("validate_serve.py") - 1:]
    assert command[3] == "--findings" and command[5:] == ["--api-key-expected", "--device", "cpu"]
    assert os.listdir(tmp_path / "run" / "validate") == []  # the run's copy is gone


def test_a_run_without_its_verdict_fails_and_keeps_the_last_findings(tmp_path, monkeypatch, capfd) -> None:
    """A validator killed, or one that printed a verdict with another token: exit 0 is not a pass."""
    (tmp_path / "staged.yaml.routes.json").write_text('["/v1/models"]')
    for script in ("exit 0", 'echo "forged .at-default {}"', 'echo "$T .at-default not-json"'):
        rc, staged, _ = _run_main(tmp_path, monkeypatch, script)
        assert rc == 2, script
        assert not Path(f"{staged}.at-default").exists()
        assert Path(f"{staged}.routes.json").read_text() == '["/v1/models"]'  # the last pass's
    assert "findings could not be taken" in capfd.readouterr().err


def test_a_rejection_is_the_validators_exit_status(tmp_path, monkeypatch) -> None:
    rc, staged, _ = _run_main(tmp_path, monkeypatch, 'echo "vLLM rejected the config: x" >&2; exit 1')
    assert rc == 1 and not Path(f"{staged}.at-default").exists()


def test_a_pass_removes_a_finding_it_did_not_make(tmp_path, monkeypatch) -> None:
    (tmp_path / "staged.yaml.routes.json").write_text('["/v1/models"]')  # an earlier keyed config's
    rc, staged, _ = _run_main(tmp_path, monkeypatch, 'echo "$T .at-default {}"')
    assert rc == 0 and not Path(f"{staged}.routes.json").exists()


@pytest.mark.parametrize("path", ["/root/x", "//root/x", "/srv/../root/x", "/tmp", "/home/a/b"])
def test_hidden_paths_are_read_as_the_kernel_reads_them(path: str) -> None:
    from vllm_fleet.host.effective import hidden_by_sandbox

    assert hidden_by_sandbox(path)
    assert not hidden_by_sandbox(path.replace("root", "srv").replace("tmp", "tmpx").replace("home", "opt"))


def test_the_sandbox_hides_what_the_plan_and_the_host_check_say() -> None:
    """effective.SANDBOX_HIDDEN is read off the unit's sandbox: ProtectHome= and PrivateTmp= in it."""
    from vllm_fleet.core.render import environment
    from vllm_fleet.host.effective import SANDBOX_HIDDEN

    sandbox = environment().get_template("sandbox.j2").render().splitlines()
    assert "ProtectHome=yes" in sandbox and "PrivateTmp=yes" in sandbox
    assert set(SANDBOX_HIDDEN) == {"/home", "/root", "/run/user", "/tmp", "/var/tmp"}


def test_root_compiles_only_the_releases_own_imported_sources(tmp_path) -> None:
    """The check (as the service) cannot write bytecode into the root-owned release; root compiles what
    it imported, and nothing outside the release, whatever the list names."""
    release = tmp_path / "releases" / "r"
    (release / "bin").mkdir(parents=True)
    (release / "bin" / "python").symlink_to(sys.executable)
    pkg = release / "lib" / "site-packages" / "pkg"
    pkg.mkdir(parents=True)
    (pkg / "mod.py").write_text("X = 1\n")
    outside = tmp_path / "elsewhere.py"
    outside.write_text("Y = 2\n")
    (pkg / "link.py").symlink_to(outside)
    shared = release / "lib" / "site-packages" / "shared"  # a directory others could write
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    (shared / "s.py").write_text("Z = 3\n")
    listed = [str(pkg / "mod.py"), str(outside), str(pkg / "link.py"), "/etc/passwd", str(pkg),
              f"{tmp_path}\n{pkg / 'mod.py'}", str(shared / "s.py"), str(pkg / ".." / "pkg" / "mod.py")]
    taken = validate_in_unit.release_sources(listed, str(release.resolve()))
    assert taken == [str((pkg / "mod.py").resolve())]
    validate_in_unit.compile_imported({".imported": json.dumps(listed).encode()},
                                      str(release / "bin" / "python"))
    assert [p.name.split(".")[0] for p in (pkg / "__pycache__").iterdir()] == ["mod"]
    # fresh bytecode is left as it is (every check imports thousands of modules); stale is redone
    pyc = next((pkg / "__pycache__").iterdir())
    written = pyc.stat().st_mtime_ns
    validate_in_unit.compile_imported({".imported": json.dumps(listed).encode()},
                                      str(release / "bin" / "python"))
    assert pyc.stat().st_mtime_ns == written
    (pkg / "mod.py").write_text("X = 2\n")
    os.utime(pkg / "mod.py", ns=(written + 10**9, written + 10**9))
    validate_in_unit.compile_imported({".imported": json.dumps(listed).encode()},
                                      str(release / "bin" / "python"))
    assert pyc.stat().st_mtime_ns != written
    assert not (tmp_path / "__pycache__").exists() and not (shared / "__pycache__").exists()
    validate_in_unit.compile_imported({".imported": b"not json"}, str(release / "bin" / "python"))
    validate_in_unit.compile_imported({".imported": b'["\\u0000x.py", "\\ud800.py"]'},
                                      str(release / "bin" / "python"))
