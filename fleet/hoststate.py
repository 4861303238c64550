#!/usr/bin/env python3
"""What is deployed on this host and what was before: the memory that rollback needs.

Runs ON the host (stdlib only, Python >= 3.9), uploaded by the deploy to /usr/local/lib/vllm-fleet/.
Why on the host and not on the controller: rollback must work from whatever controller is at hand,
after the one that deployed is gone, so the host keeps its own last-known-good copy.

Layout (root only, 0700: the vllm user, which can write /var/lib/vllm, must not be able to plant a unit
that root would restore). Env files are NOT snapshotted: the secrets exist on the host only in
/etc/vllm/<instance>.env, and a rollback keeps the current keys (rolling back a release must not undo a
key rotation that clients already follow):

    /var/lib/vllm-fleet/state.json             {"current": {...}, "previous": {...}}
    /var/lib/vllm-fleet/snapshots/current/     config and unit of every instance, last known good
    /var/lib/vllm-fleet/snapshots/previous/    the known-good state before that

Commands:
    commit RELEASE          after a smoke-tested deploy: current -> previous, live files -> current
    restore current         put the last known good back (automatic rollback of a failed change)
    restore previous        roll back one step; current and previous swap, so a second rollback
                            returns to where the first started (like `cd -`)
    prune KEEP              drop old releases, never the live one nor those current/previous use;
                            then the staged models, stored wheels and uv cache entries nothing uses
    show                    print state.json
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.environ.get("VLLM_FLEET_ROOT", "")  # tests run it against a temporary root
STATE_DIR = ROOT + "/var/lib/vllm-fleet"
SNAPSHOTS = STATE_DIR + "/snapshots"
CONFIG_DIR = ROOT + "/etc/vllm"
UNIT_DIR = ROOT + "/etc/systemd/system"
RELEASES = ROOT + "/opt/vllm/releases"
CURRENT = ROOT + "/opt/vllm/current"
MODELS = ROOT + "/var/lib/vllm/models"
WHEELS = ROOT + "/var/cache/vllm-fleet/wheels"  # the host's wheel store (roles/install.py)
UV = "/usr/local/bin/uv"
UV_CACHE = RELEASES + "/.uv-cache"
PENDING_S = 86400  # a wheel list sent for a release not built yet protects its wheels this long


def _sha(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        return None


def _live_files() -> dict[str, str]:
    """Every instance's config, env and unit, keyed by snapshot file name."""
    files = {}
    if os.path.isdir(CONFIG_DIR):
        for name in sorted(os.listdir(CONFIG_DIR)):
            if name.endswith(".yaml") and not name.startswith("."):
                files[name] = os.path.join(CONFIG_DIR, name)
    if os.path.isdir(UNIT_DIR):
        for name in sorted(os.listdir(UNIT_DIR)):
            # instance units only: an instance's watchdog (vllm-watchdog@<name>.*) follows the live
            # config by itself and is managed by the deploy
            if name.startswith("vllm-") and name.endswith(".service") and "@" not in name:
                files[name] = os.path.join(UNIT_DIR, name)
    return files


def _live_release() -> str | None:
    try:
        return os.path.basename(os.readlink(CURRENT))
    except OSError:
        return None


def load() -> dict:
    try:
        with open(STATE_DIR + "/state.json") as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _save(state: dict) -> None:
    tmp = STATE_DIR + "/state.json.tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, STATE_DIR + "/state.json")


def _record(release: str | None, files: dict[str, str]) -> dict:
    return {
        "release": release,
        "files": {name: _sha(path) for name, path in files.items()},
        "instances": sorted(n[:-5] for n in files if n.endswith(".yaml")),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def commit(release: str) -> dict:
    os.makedirs(SNAPSHOTS, mode=0o700, exist_ok=True)
    os.chmod(STATE_DIR, 0o700)
    state = load()
    live = _live_files()
    record = _record(release, live)
    cur = state.get("current")
    if cur and cur.get("release") == release and cur.get("files") == record["files"]:
        return {"committed": False, "reason": "unchanged", "current": cur}
    staging = SNAPSHOTS + "/.new"
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging, mode=0o700)
    for name, path in live.items():
        shutil.copy2(path, os.path.join(staging, name))
    if cur:
        shutil.rmtree(SNAPSHOTS + "/previous", ignore_errors=True)
        if os.path.isdir(SNAPSHOTS + "/current"):
            os.rename(SNAPSHOTS + "/current", SNAPSHOTS + "/previous")
        state["previous"] = cur
    os.rename(staging, SNAPSHOTS + "/current")
    state["current"] = record
    _save(state)
    return {"committed": True, "current": record, "previous": state.get("previous")}


def _link_release(release: str) -> None:
    if not os.path.isdir(os.path.join(RELEASES, release)):
        raise SystemExit(f"release {release} is no longer on this host")
    tmp = CURRENT + ".new"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.symlink("releases/" + release, tmp)
    os.replace(tmp, CURRENT)


def _systemctl(*args: str) -> None:
    if not ROOT:
        subprocess.run(["systemctl", *args], check=False)


def _remove_watchdog(instance: str) -> None:
    """An instance the restored state lacks: its watchdog goes first, so it never restarts it."""
    timer, probe = f"vllm-watchdog@{instance}.timer", f"vllm-watchdog@{instance}.service"
    if os.path.exists(os.path.join(UNIT_DIR, timer)):
        _systemctl("disable", "--now", timer)
        _systemctl("stop", probe)
    for unit in (timer, probe):
        if os.path.exists(os.path.join(UNIT_DIR, unit)):
            os.unlink(os.path.join(UNIT_DIR, unit))


def restore(which: str) -> dict:
    state = load()
    target = state.get(which)
    if not target:
        what = "no deploy has been recorded" if which == "current" else "there is no previous deploy"
        raise SystemExit(f"nothing to roll back to: {what} on this host")
    snap = f"{SNAPSHOTS}/{which}"
    live = _live_files()
    # instances that exist now but not in the target state are stopped and removed
    for name, path in live.items():
        if name not in target["files"]:
            if name.endswith(".service"):
                _remove_watchdog(name[len("vllm-"):-len(".service")])
                _systemctl("disable", "--now", name)
            os.unlink(path)
            if name.endswith(".yaml") and os.path.exists(path[:-5] + ".env"):
                os.unlink(path[:-5] + ".env")
    for name in target["files"]:
        if name.endswith(".env"):
            continue  # never restored: secrets live only in the current env file
        dest = os.path.join(UNIT_DIR if name.endswith(".service") else CONFIG_DIR, name)
        tmp = dest + ".restore"
        shutil.copy2(os.path.join(snap, name), tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    if target.get("release"):
        _link_release(target["release"])
    _systemctl("daemon-reload")
    units = sorted(n for n in target["files"] if n.endswith(".service"))
    for unit in units:
        _systemctl("enable", unit)
        _systemctl("reset-failed", unit)  # a deliberate restart: not throttled as a crash loop
        _systemctl("restart", unit)
    if which == "previous":
        cur, prev = SNAPSHOTS + "/current", SNAPSHOTS + "/previous"
        os.rename(cur, SNAPSHOTS + "/.swap")
        os.rename(prev, cur)
        os.rename(SNAPSHOTS + "/.swap", prev)
        state["current"], state["previous"] = state["previous"], state["current"]
        _save(state)
    return {"restored": which, "release": target.get("release"), "units": units}


def _models_in(directory: str) -> set[str]:
    """Model paths (host paths, normalized) named by the serve configs in a directory (`model: /path`)."""
    out = set()
    if os.path.isdir(directory):
        for name in os.listdir(directory):
            if name.endswith(".yaml"):
                with open(os.path.join(directory, name)) as f:
                    for line in f:
                        if line.startswith("model:"):
                            out.add(os.path.normpath(line.split(":", 1)[1].strip().strip("'\"")))
    return out


def _in_use(model_dir: str, used: set[str]) -> bool:
    """A directory under the models root is in use when a config names it or anything inside it
    (`host_path: /var/lib/vllm/models/llama/v2` uses `llama`)."""
    return any(u == model_dir or u.startswith(model_dir + "/") for u in used)


def prune(keep: int) -> dict:
    """Old releases beyond `keep`, and staged models no config uses; never what current or previous use.

    Holds the build lock: a release being built is neither counted nor has its wheels removed.
    """
    state = load()
    protected = {_live_release()} | {(state.get(k) or {}).get("release") for k in ("current", "previous")}
    if not os.path.isdir(RELEASES):
        return {"removed": []}
    with open(RELEASES + "/.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        releases = sorted((d for d in os.listdir(RELEASES) if not d.startswith(".")),
                          key=lambda d: os.stat(os.path.join(RELEASES, d)).st_mtime, reverse=True)
        removed = []
        for i, rel in enumerate(releases):
            if i >= keep and rel not in protected:
                shutil.rmtree(os.path.join(RELEASES, rel))
                removed.append(rel)
        # a build that failed leaves its temp directory; under the lock no build is running
        for name in os.listdir(RELEASES):
            path = os.path.join(RELEASES, name)
            if name.startswith(".tmp-") and os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
                removed.append(name)
        wheels = _prune_wheels(removed)
    used = (_models_in(CONFIG_DIR) | _models_in(SNAPSHOTS + "/current") | _models_in(SNAPSHOTS + "/previous"))
    models = []
    if os.path.isdir(MODELS) and not os.path.islink(MODELS):
        for name in sorted(os.listdir(MODELS)):
            path = os.path.join(MODELS, name)
            if _in_use(os.path.normpath(path[len(ROOT):] if ROOT else path), used):
                continue
            if os.path.islink(path):  # never followed: only the link itself goes
                os.unlink(path)
            else:
                shutil.rmtree(path)
            models.append(name)
    return {"removed": removed, "kept": [r for r in releases if r not in removed], "models_removed": models,
            "wheels_removed": wheels}


def _lines(path: str) -> set[str]:
    with open(path) as f:
        return {line.strip() for line in f if line.strip()}


def _prune_wheels(pruned: list[str]) -> list[str]:
    """Stored wheels that no installed release lists (each keeps its list in `.wheels`), and uv's cache
    entries for their packages: the store and the cache would otherwise grow by every release's changed
    packages, forever. A list sent for a release not built yet (under `.releases/`) protects its wheels
    for a day, so a prune between the upload and the build does not undo the upload."""
    if not os.path.isdir(WHEELS):
        return []
    used: set[str] = set()
    installed = {d for d in os.listdir(RELEASES) if not d.startswith(".")}
    for rel in installed:
        if os.path.exists(os.path.join(RELEASES, rel, ".wheels")):
            used |= _lines(os.path.join(RELEASES, rel, ".wheels"))
    meta = WHEELS + "/.releases"
    for name in sorted(os.listdir(meta)) if os.path.isdir(meta) else []:
        path, rel = os.path.join(meta, name), name.rsplit(".", 1)[0]
        if rel in installed:
            continue
        if rel not in pruned and time.time() - os.stat(path).st_mtime < PENDING_S:
            if name.endswith(".wheels"):
                used |= _lines(path)
        else:
            os.remove(path)
    removed = []
    for name in sorted(os.listdir(WHEELS)):
        path = os.path.join(WHEELS, name)
        if name.endswith(".whl") and name not in used:
            os.remove(path)
            removed.append(name)
        elif name.startswith(".incoming-") and time.time() - os.stat(path).st_mtime >= PENDING_S:
            os.remove(path)
    gone = sorted({n.split("-")[0].lower().replace("_", "-") for n in removed})
    if gone and os.path.isdir(UV_CACHE) and os.access(UV, os.X_OK):
        # uv cleans a package's every version: installed releases keep their files (hardlinks), a later
        # release that still uses one of these versions unpacks it again (only packages that changed)
        subprocess.run([UV, "cache", "clean", "--cache-dir", UV_CACHE, *gone], capture_output=True,
                       check=False)
    return removed


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    cmd, args = argv[0], argv[1:]
    if cmd == "commit":
        out = commit(args[0])
    elif cmd == "restore":
        out = restore(args[0])
    elif cmd == "prune":
        out = prune(int(args[0]))
    elif cmd == "show":
        out = load()
    else:
        print(f"unknown command {cmd}", file=sys.stderr)
        return 2
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
