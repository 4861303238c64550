"""Operations pyinfra lacks, written like pyinfra's own (generators yielding commands)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import json
import os
import secrets
import shlex
import time
from collections.abc import Sequence
from io import BytesIO

from pyinfra import host, logger, state
from pyinfra.api import FactBase, FileUploadCommand, operation
from pyinfra.facts.files import FileContents
from pyinfra.operations.util.files import generate_color_diff

from vllm_fleet.controller.paths import CACHE_DIR
from vllm_fleet.controller.run import current
from vllm_fleet.core.hostfacts import ManifestFacts
from vllm_fleet.core.layout import SUMS
from vllm_fleet.roles import remote


class Secret:
    """A value that prints as <redacted>: op arguments can reach pyinfra's logs, secrets must not."""

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "<redacted>"

    __str__ = __repr__


Content = str | bytes | Secret  # what a file is made from: a controller path, bytes, or a Secret


# A cache of the hosts' own checksums, keyed by each file's size, mtime, ctime and inode: a file whose
# stat is unchanged is not read again (a 140 GB model, the 38 MB uv, on every rerun). The Manifest fact
# only reads it (facts never write, --dry changes nothing); synced_files records each file it puts in
# place, with the checksum of the content it just wrote. ctime cannot be set back, so a file changed
# since (even with its mtime restored) is hashed again, and a file nobody recorded (restored by a
# rollback, changed by hand) is simply hashed every time. Root-only, like the rest of /var/lib/vllm-fleet.

# Secret files (every env file: /etc/vllm/<instance>.env, haproxy's) are never hashed on the host: a
# digest of a key in the fact's output (-vvv, logs) could check a guessed key offline. On upload the
# controller writes beside each one a root-only marker with HMAC(salt, content) and the file's stat; the
# salt never leaves the controller. The host reports the marker while the file's stat (ctime cannot be
# set back) is the one recorded, else "unverified", which never matches, so the file is written again.
SECRET_SUFFIX = ".env"
UNVERIFIED = "unverified"


def is_secret_path(path: str) -> bool:
    return path.endswith(SECRET_SUFFIX)


def marker_path(path: str) -> str:
    head, name = os.path.split(path)
    return os.path.join(head, f".{name}.hmac")


_MANIFEST_PY = r"""
import grp, hashlib, json, os, pwd, stat, sys
try:
    sums = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sums = {}
for p in sys.argv[2:]:
    try:
        st = os.stat(p)
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        print("- - - -", p)
        continue
    key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    e = sums.get(p)
    if p.endswith(".env"):
        d, n = os.path.split(p)
        try:
            m = json.load(open(os.path.join(d, "." + n + ".hmac")))
        except (OSError, ValueError):
            m = None
        sha = m[4] if isinstance(m, list) and len(m) == 5 and m[:4] == key else "unverified"
    elif isinstance(e, list) and e[:4] == key:
        sha = e[4]
    else:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for b in iter(lambda: f.read(1 << 20), b""):
                h.update(b)
        sha = h.hexdigest()
    def name(get, i):
        try:
            return get(i)[0]
        except KeyError:
            return str(i)
    mode = format(st.st_mode & 0o7777, "o")
    print(sha, name(pwd.getpwuid, st.st_uid), name(grp.getgrgid, st.st_gid), mode, p)
"""

# Run by synced_files right after it renamed files into place: each (path, checksum of what was written)
# is recorded under the file's stat; entries of files that are gone, and any secret file's, are dropped.
_RECORD_PY = r"""
import json, os, sys
path, args = sys.argv[1], sys.argv[2:]
try:
    sums = json.load(open(path))
except (OSError, ValueError):
    sums = {}
sums = {p: e for p, e in sums.items() if isinstance(e, list) and not p.endswith(".env") and os.path.exists(p)}
for p, sha in zip(args[::2], args[1::2]):
    st = os.stat(p)
    sums[p] = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, sha]
os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
with open(path + ".tmp", "w") as f:
    json.dump(sums, f)
os.replace(path + ".tmp", path)
"""


def record_command(written: list[tuple[str, str]]) -> str:
    """Root records the checksums of files just put in place, so the next Manifest reads no content."""
    return shlex.join(["python3", "-c", _RECORD_PY, SUMS, *(x for pair in written for x in pair)])


class Manifest(FactBase[ManifestFacts]):
    """
    Returns sha256, owner, group and mode of many files in one remote command; for a secret file
    (is_secret_path) its marker's HMAC instead, or "unverified", never a digest of the file. Reads the
    checksums synced_files recorded, writes nothing:

    .. code:: python

        {"/opt/vllm/models/tiny/1f0c…/config.json": ("9f2c…", "root", "vllm", "640"), "/missing": None}
    """

    def command(self, paths: tuple[str, ...]) -> str:
        return shlex.join(["python3", "-c", _MANIFEST_PY, SUMS, *paths])

    def process(self, output: list[str]) -> ManifestFacts:
        out: ManifestFacts = {}
        for line in output:
            sha, user, group, mode, path = line.split(" ", 4)
            out[path] = None if sha == "-" else (sha, user, group, mode)
        return out


def prefetch(groups: list[tuple[str, ...]]) -> None:
    """One Manifest over every path a deploy will compare, instead of one per group of files: each
    group's later stale() finds its answer here (same keys), so a converged host costs fewer commands."""
    manifests = current().manifests
    groups = [g for g in groups if g and (host.name, g) not in manifests]
    if not groups:
        return
    union = tuple(dict.fromkeys(p for g in groups for p in g))
    found = host.get_fact(Manifest, paths=union)
    for g in groups:
        manifests[(host.name, g)] = {p: found.get(p) for p in g}


SALT = CACHE_DIR / "secret-salt"


@functools.cache
def _salt() -> bytes:
    """The controller's HMAC key for secret files: made once, 0600, never sent anywhere. A controller
    without it (a new one) writes every secret file once more, then matches again."""
    with contextlib.suppress(FileExistsError):
        SALT.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(SALT, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return bytes.fromhex(SALT.read_text().strip())


def secret_digest(src: Content) -> str:
    """What a secret file's marker holds: useless for checking a guessed key without the salt."""
    return "hmac-sha256:" + hmac.new(_salt(), _bytes(src), hashlib.sha256).hexdigest()


_MARKER_PY = r"""
import json, os, sys
p, digest = sys.argv[1:3]
st = os.stat(p)
d, n = os.path.split(p)
m = os.path.join(d, "." + n + ".hmac")
fd = os.open(m + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
with os.fdopen(fd, "w") as f:
    json.dump([st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, digest], f)
os.replace(m + ".tmp", m)
"""


def marker_command(dest: str, src: Content) -> str:
    """Root writes the marker of a secret file just put in place (the HMAC in argv reveals nothing)."""
    return shlex.join(["python3", "-c", _MARKER_PY, dest, secret_digest(src)])


def _mode(mode: str) -> str:
    return mode.lstrip("0") or "0"


def stale(files: Sequence[tuple[Content, str]], user: str, group: str, mode: str,
          paths: tuple[str, ...] | None = None) -> list[tuple[Content, str]]:
    """The (content, dest) pairs whose host copy differs in content, owner or mode: one remote command
    (pyinfra caches a fact per arguments, so callers sharing `paths` share that one command)."""
    key = (host.name, paths or tuple(dest for _, dest in files))
    manifests = current().manifests
    if key not in manifests:  # pyinfra's own fact cache differs inside and outside operations
        manifests[key] = host.get_fact(Manifest, paths=key[1])
    have = manifests[key]
    out = []
    for src, dest in files:
        digest = secret_digest(src) if is_secret_path(dest) else sha256(src)
        if have.get(dest) != (digest, user, group, _mode(mode)):
            out.append((src, dest))
    return out


# The controller's side of the same idea: its files (uv, 38 MB; a model's weights) are hashed once, not
# on every run (28 ms of a 1.0 s no-op deploy for uv alone), keyed like the hosts' cache above.
LOCAL_SUMS = CACHE_DIR / "sums.json"
_FRESH: dict[str, list] = {}


@functools.cache
def _local_sums() -> dict[str, list]:
    """Read once per run; sha256() adds to the same dict and writes it back."""
    with contextlib.suppress(OSError, ValueError):
        found = json.loads(LOCAL_SUMS.read_text())
        return {k: v for k, v in found.items() if isinstance(v, list) and len(v) == 5}
    return {}


def sha256(src: Content) -> str:
    """A controller file is hashed once per change, not once per host or per run."""
    if not isinstance(src, str):
        return hashlib.sha256(_bytes(src)).hexdigest()
    sums = _local_sums()
    st = os.stat(src)
    key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    entry = sums.get(src) or _FRESH.get(src)
    if entry and entry[:4] == key:
        return entry[4]
    h = hashlib.sha256()
    with open(src, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    sha = h.hexdigest()
    if st.st_ctime >= time.time() - 2:  # a write in this clock tick could keep the same stat
        _FRESH[src] = [*key, sha]  # so: this run only
    else:
        sums[src] = [*key, sha]
        with contextlib.suppress(OSError):  # unwritable: hashed every time, still correct
            tmp = LOCAL_SUMS.with_name(f".{LOCAL_SUMS.name}.{os.getpid()}")
            tmp.write_text(json.dumps(sums))
            os.replace(tmp, LOCAL_SUMS)
    return sha


def _bytes(src: Content) -> bytes:
    if isinstance(src, Secret):
        return src.reveal().encode()
    if isinstance(src, bytes):
        return src
    with open(src, "rb") as f:
        return f.read()


DIFF_MAX = 1 << 20  # a larger file (weights, uv) is named, not shown


def _text(src: Content) -> list[str] | None:
    """The content's lines, or None for binary or large content."""
    if isinstance(src, str) and os.path.getsize(src) > DIFF_MAX:
        return None
    data = _bytes(src)
    if len(data) > DIFF_MAX or b"\0" in data:
        return None
    try:
        return data.decode().splitlines(keepends=True)
    except UnicodeDecodeError:
        return None


def show_diff(src: Content, dest: str, mode: str) -> None:
    """What --diff prints for a file synced_files will write, like files.put does: the unified diff of
    the host's copy against the new content. A secret or any 0600 file (the environment files, staged
    copies) only says that it changes: its values are the operator's, not the log's."""
    if is_secret_path(dest) or isinstance(src, Secret):
        host.log(f"Will write {dest}: changed (secret, not shown)", logger.info)
        return
    if _mode(mode).endswith("00"):
        host.log(f"Will write {dest}: changed (mode {mode}, not shown)", logger.info)
        return
    desired = _text(src)
    if desired is None:
        host.log(f"Will write {dest}: binary or large file, not shown", logger.info)
        return
    current = host.get_fact(FileContents, path=dest)
    host.log(f"Will {'modify' if current is not None else 'create'} {dest}", logger.info)
    for line in generate_color_diff([ln + "\n" for ln in current or []], desired):
        logger.info("  %s", line)
    logger.info("")


@operation()
def synced_files(files: Sequence[tuple[Content, str]], user: str = "root", group: str = "root",
                 mode: str = "644", staging_dir: str = "/etc/vllm/.staging",
                 paths: tuple[str, ...] | None = None):
    """
    Make each dest hold its content (a controller path, bytes, or a Secret) with owner and mode:
    one remote command compares them all, instead of two or three per file with ``files.put``.

    Files get owner and mode in a root-only 0700 staging directory, then are renamed into place: no
    reader ever sees a half-written file or a secret with the wrong mode, and unlike ``files.put``
    nothing of a secret's content is printed. A root login uploads straight into the staging
    directory; any other login (SFTP writes as the login, never through sudo) uploads into its own
    0700 directory (roles/remote.py), from which root moves the file into staging. ``--diff``
    shows
    each text file's change (show_diff), never a secret's.

    **Example:**

    .. code:: python

        synced_files(name="model files",
                     files=[("/models/tiny/config.json", "/opt/vllm/models/tiny/1f0c…/config.json")])
    """
    todo = stale(files, user, group, mode, paths=paths)
    if not todo:
        host.noop(f"{len(files)} files up to date")
        return
    if state.config.DIFF:
        for src, dest in todo:
            show_diff(src, dest, mode)
    drop = remote.upload_dir()
    dirs = sorted({dest.rsplit("/", 1)[0] for _, dest in todo})
    yield f"install -d -m 0700 -o root -g root {staging_dir} && mkdir -p {' '.join(map(shlex.quote, dirs))}"
    if drop:
        yield remote.make_upload_dir(drop)
    for i, (src, dest) in enumerate(todo):
        name = f"{i}.{dest.rsplit('/', 1)[-1]}"
        staged = shlex.quote(f"{staging_dir}/{name}")
        payload = src if isinstance(src, str) else BytesIO(_bytes(src))
        if drop:
            sent = f"{drop}/{name}"
            yield FileUploadCommand(payload, sent, _sudo=False)
            into_staging = f"mv -f {shlex.quote(sent)} {staged} && "
        else:
            yield FileUploadCommand(payload, f"{staging_dir}/{name}",
                                    remote_temp_filename=f"{staging_dir}/{name}.part")
            into_staging = ""
        yield (f"{into_staging}chown {user}:{group} {staged} && chmod {mode} {staged} && "
               f"mv -f {staged} {shlex.quote(dest)}")
        if is_secret_path(dest):
            yield marker_command(dest, src)
    written = [(dest, sha256(src)) for src, dest in todo if not is_secret_path(dest)]
    if written:
        yield record_command(written)
