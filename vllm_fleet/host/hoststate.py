#!/usr/bin/env python3
"""What is deployed on this host and what was before: the memory that rollback needs.

Runs ON the host (stdlib only, Python >= 3.9), uploaded by the deploy to /usr/local/lib/vllm-fleet/.
Why on the host and not on the controller: rollback must work from whatever controller is at hand,
after the one that deployed is gone, so the host keeps its own last-known-good copy.

Layout (root only, 0700: the vllm user, which can write /var/lib/vllm, must not be able to plant a unit
that root would restore). Env files are NOT snapshotted: the secrets exist on the host only in
/etc/vllm/<instance>.env, and a rollback keeps the current keys (rolling back a release must not undo a
key rotation that clients already follow):

    /var/lib/vllm-fleet/active -> gen/<n>      the one state in force, swapped by one rename
    /var/lib/vllm-fleet/gen/<n>/state.json     {"current": {...}, "previous": {...}}
    /var/lib/vllm-fleet/gen/<n>/current/       config, environment and unit of every instance, last
                                               known good
    /var/lib/vllm-fleet/gen/<n>/previous/      the known-good state before that
    /var/lib/vllm-fleet/state.json             -> active/state.json, for readers (the VllmHost fact)
    /var/lib/vllm-fleet/lock                   held by every command that changes anything
    /var/lib/vllm-fleet/lease                  the run that may change this host now (lease.py)

A generation is written in full under a name unique to its run, then published by replacing the
`active` link (one atomic rename): a run killed at any point leaves the old state or the new, whole,
never a mix. The generation before stays until the next change, so a reader that resolved the link
just before a swap still reads a complete one. Hosts deployed before this layout (state.json and
snapshots/ at the top) are migrated by the first command that takes the lock.

Only instances this toolkit created are recorded, snapshotted, restored or removed: those whose unit
starts with the templates' header (MANAGED) or that the state records as created. A foreign
vllm-router.service with its /etc/vllm/router.yaml is not ours to restart or delete.

Commands:
    commit RELEASE          after a smoke-tested deploy: current -> previous, live files -> current
    restore current         put the last known good back (automatic rollback of a failed change)
    restore previous        roll back one step; current and previous swap, so a second rollback
                            returns to where the first started (like `cd -`)
    prune KEEP              drop old releases, never the live one nor those current/previous use;
                            then the staged models, hub snapshots, stored wheels and uv cache
                            entries nothing uses
    show                    print state.json
    leftovers               list what killed runs left (uploads, staged files); prune removes them
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

try:
    from vllm_fleet.host import lease
except ImportError:  # on the host, beside this script
    import lease  # type: ignore[import-not-found,no-redef]  # (mypy reads the branch above)

ROOT = os.environ.get("VLLM_FLEET_ROOT", "")  # tests run it against a temporary root
STATE_DIR = ROOT + "/var/lib/vllm-fleet"
GENS = STATE_DIR + "/gen"
ACTIVE = STATE_DIR + "/active"
STATE_LINK = STATE_DIR + "/state.json"
LEGACY_SNAPSHOTS = STATE_DIR + "/snapshots"  # the layout before generations, migrated once
LOCK = STATE_DIR + "/lock"
# an instance's non-secret environment (roles/service.py), 0600: snapshotted like config and unit
ENVIRONMENT = ".environment"
# a second deploy against the same host waits this long for the first one's command, then is refused
LOCK_WAIT_S = float(os.environ.get("VLLM_FLEET_LOCK_WAIT_S", "120"))
CONFIG_DIR = ROOT + "/etc/vllm"
UNIT_DIR = ROOT + "/etc/systemd/system"
RELEASES = ROOT + "/opt/vllm/releases"
CURRENT = ROOT + "/opt/vllm/current"
MODELS = ROOT + "/opt/vllm/models"  # <name>/<digest>/
# hub snapshots, in the vllm user's own huggingface_hub cache (vllm_fleet/core/hub.py HUB_CACHE)
HUB_CACHE = ROOT + "/var/lib/vllm/hf/hub"
HUB_TOKEN = ".hub.env"  # the fetch's token beside an instance's config (vllm_fleet/core/hub.py TOKEN_SUFFIX)
CACHE_OWNER = "vllm"  # vllm_fleet/core/plan.py VLLM_USER
WHEELS = ROOT + "/var/cache/vllm-fleet/wheels"  # the host's wheel store (roles/install.py)
UV = "/usr/local/bin/uv"
UV_CACHE = RELEASES + "/.uv-cache"
PENDING_S = 86400  # a wheel list sent for a release not built yet protects its wheels this long
MANAGED = "# Managed by vllm-fleet"  # templates/vllm.service.j2's first line
UPLOADS = ROOT + "/opt/vllm/.upload"  # a sudo login's uploads: <login>/, 0700 (roles/remote.py)
# What a run killed midway leaves: uploads, staged files, incoming wheels and uv. Under the host lease
# nothing else writes there, so the next run (its first operation) and every prune remove them; the
# last is where a sudo login's uploads went before they moved beside the models.
LEFTOVERS = (UPLOADS + "/*/*", MODELS + "/.staging/*", CONFIG_DIR + "/.staging/*", WHEELS + "/.incoming-*",
             WHEELS + "/.releases/.incoming-*", ROOT + "/usr/local/bin/.uv.incoming",
             ROOT + "/home/*/.cache/vllm-fleet/upload/*")
LEASE_TOKEN: str | None = None  # --lease: the token of the run this command belongs to


def _sha(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except FileNotFoundError:
        return None


def _unique() -> str:
    return f"{os.getpid()}-{secrets.token_hex(4)}"


# --- the lock --------------------------------------------------------------------------------------


class _Waited(Exception):
    pass


def _give_up(signum: int, frame: object) -> None:
    raise _Waited


@contextlib.contextmanager
def _locked(what: str) -> Iterator[None]:
    """One lock per host for every command that changes state or live files: two deploys against one
    host otherwise interleave their renames. The holder writes who it is into the lock file, so the one
    that waits too long can say whom it waited for."""
    os.makedirs(STATE_DIR, mode=0o700, exist_ok=True)
    os.chmod(STATE_DIR, 0o700)
    other = lease.held_by_other(LEASE_TOKEN)
    if other:  # a run that lost its lease (or a hand-run command) never writes under another's
        raise SystemExit(f"the host lease is held by {other}; this {what.split()[0]} belongs to no run "
                         "that holds it, nothing was changed")
    fd = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    held = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # a blocking flock, cut short by an alarm: polling could starve behind a holder that
            # releases and takes it again at once
            old = signal.signal(signal.SIGALRM, _give_up)
            signal.setitimer(signal.ITIMER_REAL, LOCK_WAIT_S)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except _Waited:
                holder = os.pread(fd, 300, 0).decode(errors="replace").strip() or "holder unknown"
                raise SystemExit(f"another vllm-fleet command holds {LOCK} ({holder}); waited "
                                 f"{LOCK_WAIT_S:g} s for it, nothing was changed: try again when it is "
                                 "done") from None
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
        held = True
        os.ftruncate(fd, 0)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        os.pwrite(fd, f"pid {os.getpid()}, hoststate {what}, since {stamp}\n".encode(), 0)
        yield
    finally:
        if held:  # whoever takes it next without saying who (flock(1)) is not named as us
            os.ftruncate(fd, 0)
        os.close(fd)  # releases the lock


# --- generations ----------------------------------------------------------------------------------


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _rm(path: str) -> None:
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
    else:
        shutil.rmtree(path)


def _active_number() -> int | None:
    try:
        target = os.readlink(ACTIVE)
    except OSError:
        return None
    name = os.path.basename(target)
    return int(name) if name.isdigit() else None


def _active_dir() -> str | None:
    n = _active_number()
    return None if n is None else f"{GENS}/{n}"


def _numbers() -> list[int]:
    return sorted(int(d) for d in os.listdir(GENS) if d.isdigit()) if os.path.isdir(GENS) else []


def _tidy() -> None:
    """What killed runs left (staging dirs, unpublished generations, temporary links) and generations
    older than the one before the active: under the lock, nothing else is writing."""
    active = _active_number()
    keep = {active, max((n for n in _numbers() if active is not None and n < active), default=None)}
    for name in os.listdir(GENS) if os.path.isdir(GENS) else []:
        if (name.isdigit() and int(name) not in keep) or name.startswith(".stage-"):
            _rm(os.path.join(GENS, name))
    for name in os.listdir(STATE_DIR):
        if name.startswith((".active-", ".state.json-")):
            os.unlink(os.path.join(STATE_DIR, name))


def _link(target: str, path: str) -> None:
    tmp = f"{STATE_DIR}/.{os.path.basename(path)}-{_unique()}"
    os.symlink(target, tmp)
    os.replace(tmp, path)


def _publish(state: dict, current: dict[str, str], previous: dict[str, str]) -> None:
    """A new generation from the given files, then the one swap that makes it the state in force."""
    os.makedirs(GENS, mode=0o700, exist_ok=True)
    staging = f"{GENS}/.stage-{_unique()}"
    try:
        os.mkdir(staging, 0o700)
        for sub, files in (("current", current), ("previous", previous)):
            os.mkdir(f"{staging}/{sub}", 0o700)
            for name, src in files.items():
                with open(src, "rb") as f:
                    _write(f"{staging}/{sub}/{name}", f.read())
            _fsync_dir(f"{staging}/{sub}")
        _write(f"{staging}/state.json", (json.dumps(state, indent=2, sort_keys=True) + "\n").encode())
        _fsync_dir(staging)
    except OSError as e:  # a full file system, say: the state in force stays the last one, whole
        shutil.rmtree(staging, ignore_errors=True)
        needed = sum(os.path.getsize(p) for files in (current, previous) for p in files.values()
                     if os.path.exists(p)) + 4096
        st = os.statvfs(STATE_DIR)
        raise SystemExit(f"cannot record this host's state in {STATE_DIR}: {e.strerror} (needed about "
                         f"{needed} bytes, {st.f_bavail * st.f_frsize} free); nothing was recorded and "
                         "the last recorded state is still in force: free space there and run the deploy "
                         "again, which records what is live") from None
    n = max(_numbers(), default=0) + 1
    os.rename(staging, f"{GENS}/{n}")
    _link(f"gen/{n}", ACTIVE)  # the swap
    _fsync_dir(STATE_DIR)
    _state_link()
    _tidy()


def _state_link() -> None:
    if not (os.path.islink(STATE_LINK) and os.readlink(STATE_LINK) == "active/state.json"):
        _link("active/state.json", STATE_LINK)


def _snapshot(directory: str | None) -> dict[str, str]:
    if not directory or not os.path.isdir(directory):
        return {}
    # an env file in an old snapshot (before env files were left out) is a secret: never carried on
    return {n: os.path.join(directory, n) for n in sorted(os.listdir(directory))
            if os.path.isfile(os.path.join(directory, n)) and not os.path.islink(os.path.join(directory, n))
            and not n.endswith(".env")}


def _matches(record: dict, directory: str) -> bool:
    return os.path.isdir(directory) and all(
        _sha(os.path.join(directory, n)) == sha for n, sha in record.get("files", {}).items()
        if not n.endswith(".env"))


def _migrate() -> None:
    """The layout before generations (state.json + snapshots/), read once. A commit of that version
    killed between its renames left a snapshot under another name (previous or .new) or none: each
    record takes the directory whose files match its hashes, and one that none matches is dropped, so
    a rollback never restores files that are not what its record describes."""
    if _active_number() is not None:
        if os.path.lexists(LEGACY_SNAPSHOTS):  # a migration killed after its swap
            _state_link()
            shutil.rmtree(LEGACY_SNAPSHOTS)
        return
    legacy: dict = {}
    if os.path.isfile(STATE_LINK) and not os.path.islink(STATE_LINK):
        with contextlib.suppress(json.JSONDecodeError), open(STATE_LINK) as f:
            legacy = json.load(f)
    if not legacy and not os.path.isdir(LEGACY_SNAPSHOTS):
        return  # a host nothing was committed on yet
    candidates = [f"{LEGACY_SNAPSHOTS}/{d}" for d in ("current", "previous", ".new", ".swap")]
    snaps: dict[str, dict[str, str]] = {}
    for key in ("current", "previous"):
        record = legacy.get(key)
        found = next((d for d in candidates if record and _matches(record, d)), None)
        if found is None:
            legacy.pop(key, None)
        else:
            snaps[key] = _snapshot(found)
    _publish(legacy, snaps.get("current", {}), snaps.get("previous", {}))
    shutil.rmtree(LEGACY_SNAPSHOTS, ignore_errors=True)


def load() -> dict:
    path = ACTIVE + "/state.json" if _active_number() is not None else STATE_LINK
    try:
        with open(path) as f:
            return json.load(f)
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return {}


# --- what is ours -----------------------------------------------------------------------------------


def _has_header(path: str) -> bool:
    try:
        with open(path, errors="replace") as f:
            return f.readline().startswith(MANAGED)
    except OSError:
        return False


def _ours(files: dict[str, str], created: set[str]) -> dict[str, str]:
    """The files of instances this toolkit created: a unit recorded as created or bearing the header,
    and every config except one whose unit is someone else's."""
    foreign = set()
    for name, path in files.items():
        if name.endswith(".service"):
            inst = name[len("vllm-"):-len(".service")]
            if inst not in created and not _has_header(path):
                foreign.add(inst)
    return {n: p for n, p in files.items()
            if (n[len("vllm-"):-len(".service")] if n.endswith(".service") else n.rsplit(".", 1)[0])
            not in foreign}


def _created(state: dict) -> set[str]:
    return {n for k in ("current", "previous") for n in (state.get(k) or {}).get("created", ())}


def _live_files(state: dict) -> dict[str, str]:
    """Every instance's config, non-secret environment and unit, keyed by snapshot file name: ours only."""
    files = {}
    if os.path.isdir(CONFIG_DIR):
        for name in sorted(os.listdir(CONFIG_DIR)):
            if name.endswith((".yaml", ENVIRONMENT)) and not name.startswith("."):
                files[name] = os.path.join(CONFIG_DIR, name)
    if os.path.isdir(UNIT_DIR):
        for name in sorted(os.listdir(UNIT_DIR)):
            # instance units only: an instance's watchdog (vllm-watchdog@<name>.*) follows the live
            # config by itself and is managed by the deploy
            if name.startswith("vllm-") and name.endswith(".service") and "@" not in name:
                files[name] = os.path.join(UNIT_DIR, name)
    return _ours(files, _created(state))


def _live_release() -> str | None:
    try:
        return os.path.basename(os.readlink(CURRENT))
    except OSError:
        return None


def _lock_of(release: str | None) -> str | None:
    """The digest of the lock the release was built from (vllm_fleet/core/lock.py digest)."""
    try:
        with open(os.path.join(RELEASES, release or "", ".lock"), "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:16]
    except OSError:
        return None


def _record(release: str | None, files: dict[str, str]) -> dict:
    return {
        "release": release,
        "lock": _lock_of(release),
        "files": {name: _sha(path) for name, path in files.items()},
        "instances": sorted(n[:-5] for n in files if n.endswith(".yaml")),
        # the units a deploy may remove when their instance leaves the inventory (roles/vllm.py)
        "created": sorted(n[len("vllm-"):-len(".service")] for n in files if n.endswith(".service")),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# --- commands ---------------------------------------------------------------------------------------


def commit(release: str) -> dict:
    with _locked(f"commit {release}"):
        _migrate()
        _tidy()
        state = load()
        live = _live_files(state)
        record = _record(release, live)
        cur = state.get("current")
        snaps = _active_dir()
        if cur and cur.get("release") == release and cur.get("files") == record["files"] \
                and cur.get("lock") == record["lock"]:
            if cur.get("created") != record["created"]:  # committed before units were recorded
                cur = {**cur, "created": record["created"]}
                _publish({**state, "current": cur}, _snapshot(f"{snaps}/current"),
                         _snapshot(f"{snaps}/previous"))
            return {"committed": False, "reason": "unchanged", "current": cur}
        new = {**state, "current": record}
        previous: dict[str, str] = {}
        if cur and snaps:
            new["previous"], previous = cur, _snapshot(f"{snaps}/current")
        else:
            new.pop("previous", None)
        _publish(new, live, previous)
        return {"committed": True, "current": record, "previous": new.get("previous")}


def _link_release(release: str) -> None:
    if not os.path.isdir(os.path.join(RELEASES, release)):
        raise SystemExit(f"release {release} is no longer on this host")
    tmp = f"{CURRENT}.new-{_unique()}"
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
    with _locked(f"restore {which}"):
        _migrate()
        _tidy()
        return _restore(which)


def _restore(which: str) -> dict:
    state = load()
    target = state.get(which)
    if not target:
        what = "no deploy has been recorded" if which == "current" else "there is no previous deploy"
        raise SystemExit(f"nothing to roll back to: {what} on this host")
    snaps = _active_dir()
    # a legacy record has no "created": its snapshot's units are ours by their header
    wanted = {n: p for n, p in _ours(_snapshot(f"{snaps}/{which}"), set(target.get("created", ()))).items()
              if not n.endswith(".env")}  # never restored: secrets live only in the current env file
    live = _live_files(state)
    # instances that exist now but not in the target state are stopped and removed
    for name, path in live.items():
        if name not in wanted:
            if name.endswith(".service"):
                _remove_watchdog(name[len("vllm-"):-len(".service")])
                _systemctl("disable", "--now", name)
            os.unlink(path)
            for secret in (".env", HUB_TOKEN):
                if name.endswith(".yaml") and os.path.exists(path[:-5] + secret):
                    os.unlink(path[:-5] + secret)
    for name, src in wanted.items():
        dest = os.path.join(UNIT_DIR if name.endswith(".service") else CONFIG_DIR, name)
        tmp = f"{dest}.restore-{_unique()}"
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o600 if name.endswith(ENVIRONMENT) else 0o644)
        os.replace(tmp, dest)
    if target.get("release"):
        _link_release(target["release"])
    _systemctl("daemon-reload")
    units = sorted(n for n in wanted if n.endswith(".service"))
    for unit in units:
        _systemctl("enable", unit)
        _systemctl("reset-failed", unit)  # a deliberate restart: not throttled as a crash loop
        _systemctl("restart", unit)
    if which == "previous":
        # killed before this swap, the state still says what it said: a second rollback redoes this one
        _publish({**state, "current": state["previous"], "previous": state["current"]},
                 _snapshot(f"{snaps}/previous"), _snapshot(f"{snaps}/current"))
    return {"restored": which, "release": target.get("release"), "units": units}


def _models_in(directory: str | None) -> set[str]:
    """Model paths (host paths, normalized) named by the serve configs in a directory (`model: /path`)."""
    out = set()
    if directory and os.path.isdir(directory):
        for name in os.listdir(directory):
            if name.endswith(".yaml"):
                with open(os.path.join(directory, name)) as f:
                    for line in f:
                        if line.startswith("model:"):
                            out.add(os.path.normpath(line.split(":", 1)[1].strip().strip("'\"")))
    return out


def _in_use(model_dir: str, used: set[str]) -> bool:
    """A directory under the models root is in use when a config names it or anything inside it
    (`model: /opt/vllm/models/llama/<digest>/sub` uses `llama/<digest>`)."""
    return any(u == model_dir or u.startswith(model_dir + "/") for u in used)


def _host_path(path: str) -> str:
    return os.path.normpath(path[len(ROOT):] if ROOT else path)


def _prune_models(used: set[str]) -> list[str]:
    """Digest directories (<name>/<digest>) no config uses, then the <name> directories left empty.
    Nothing found here is followed: a link is removed itself, never what it points at."""
    removed: list[str] = []
    if not os.path.isdir(MODELS) or os.path.islink(MODELS):
        return removed
    for name in sorted(os.listdir(MODELS)):
        if name.startswith("."):  # the uploads' staging directory (roles/model.py), not a model
            continue
        path = os.path.join(MODELS, name)
        if os.path.islink(path) or not os.path.isdir(path):
            if not _in_use(_host_path(path), used):
                os.unlink(path)
                removed.append(name)
            continue
        if _host_path(path) in used:  # a config naming the model, not one digest, keeps them all
            continue
        for digest in sorted(os.listdir(path)):
            dpath = os.path.join(path, digest)
            if _in_use(_host_path(dpath), used):
                continue
            _rm(dpath)
            removed.append(f"{name}/{digest}")
        if not os.listdir(path):
            os.rmdir(path)
    return removed


def prune(keep: int) -> dict:
    """Old releases beyond `keep`, and staged models no config uses; never what current or previous use.

    Holds the build lock: a release being built is neither counted nor has its wheels removed.
    """
    with _locked(f"prune {keep}"):
        _migrate()
        _tidy()
        gone = remove_leftovers()
        out = _prune(keep)
        out["removed"] = gone + out.get("removed", [])
        return out


def remove_leftovers() -> list[str]:
    """What killed runs left (LEFTOVERS); called under the host lock, by a run that holds the lease."""
    gone = []
    for path in leftovers():
        with contextlib.suppress(FileNotFoundError):
            _rm(path)
            gone.append(path)
    return gone


def leftovers(patterns: tuple[str, ...] = LEFTOVERS) -> list[str]:
    """The paths the patterns match, dot files included (a `*` alone skips them)."""
    found: list[str] = []
    for pattern in patterns:
        head, tail = os.path.split(pattern)
        found += glob.glob(pattern) + (glob.glob(os.path.join(head, ".*")) if tail == "*" else [])
    return sorted(set(found))


def _prune(keep: int) -> dict:
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
    snaps = _active_dir()
    used = _models_in(CONFIG_DIR) | _models_in(f"{snaps}/current" if snaps else None) | _models_in(
        f"{snaps}/previous" if snaps else None)
    hub = _as_owner(lambda: _prune_hub(used))
    out = {"removed": removed, "kept": [r for r in releases if r not in removed],
           "models_removed": _prune_models(used) + hub.get("removed", []), "wheels_removed": wheels}
    if hub.get("error"):
        out["hub_prune_failed"] = hub["error"]
    return out


def _as_owner(work) -> dict:
    """`work()` (-> list of what it removed) with the cache owner's rights only (asuser.py). As is under a
    test root (VLLM_FLEET_ROOT); not at all where that user does not exist (then it has no cache)."""
    import pwd

    if ROOT:
        return {"removed": work()}
    try:
        pwd.getpwnam(CACHE_OWNER)
    except KeyError:
        return {"removed": []}
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if TYPE_CHECKING:
        from vllm_fleet.host import asuser
    else:
        import asuser  # uploaded beside this script

    out = asuser.run_as(CACHE_OWNER, work)
    return {"removed": out["result"]} if "result" in out else {"error": out["error"]}


def _prune_hub(used: set[str]) -> list[str]:
    """Hub snapshots no config uses (current, previous and the live files' keep theirs), then the blobs
    only they held; a repository a config names by its id (vLLM's own download) is kept whole, and a
    download in progress (*.incomplete) is never touched."""
    removed: list[str] = []
    if not os.path.isdir(HUB_CACHE) or os.path.islink(HUB_CACHE):
        return removed
    for repo in sorted(os.listdir(HUB_CACHE)):
        top, snaps = os.path.join(HUB_CACHE, repo), os.path.join(HUB_CACHE, repo, "snapshots")
        if not repo.startswith("models--") or os.path.islink(top) or not os.path.isdir(snaps):
            continue
        if repo[len("models--"):].replace("--", "/", 1) in used:
            continue
        gone = [sha for sha in sorted(os.listdir(snaps))
                if not _in_use(_host_path(os.path.join(snaps, sha)), used)]
        for sha in gone:
            _rm(os.path.join(snaps, sha))
            removed.append(f"{repo[len('models--'):].replace('--', '/', 1)}@{sha[:12]}")
        blobs = os.path.join(top, "blobs")
        if not gone or not os.path.isdir(blobs):
            continue
        held = {os.path.basename(os.readlink(os.path.join(d, f)))
                for d, _, files in os.walk(snaps) for f in files if os.path.islink(os.path.join(d, f))}
        for blob in os.listdir(blobs):
            if blob not in held and not blob.endswith(".incomplete") and not blob.endswith(".lock"):
                os.unlink(os.path.join(blobs, blob))
    return removed


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
    global LEASE_TOKEN
    if argv[:1] == ["--lease"] and len(argv) > 1:
        LEASE_TOKEN, argv = argv[1], argv[2:]
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
    elif cmd == "leftovers":  # read only, for an operator: the VllmHost fact calls leftovers() itself
        print("\n".join(leftovers()))
        return 0
    else:
        print(f"unknown command {cmd}", file=sys.stderr)
        return 2
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
