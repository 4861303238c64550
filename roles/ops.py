"""Operations pyinfra lacks, written like pyinfra's own (generators yielding commands)."""

from __future__ import annotations

import hashlib
import shlex
from io import BytesIO

from pyinfra import host
from pyinfra.api import FactBase, FileUploadCommand, operation


class Secret:
    """A value that prints as <redacted>: op arguments can reach pyinfra's logs, secrets must not."""

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "<redacted>"

    __str__ = __repr__


class Manifest(FactBase):
    """
    Returns sha256, owner, group and mode of many files in one remote command:

    .. code:: python

        {"/var/lib/vllm/models/tiny/config.json": ("9f2c…", "vllm", "vllm", "640"), "/missing": None}
    """

    def command(self, paths: tuple[str, ...]) -> str:
        quoted = " ".join(shlex.quote(p) for p in paths)
        return (f"for p in {quoted}; do if [ -f \"$p\" ]; then "
                "echo \"$(sha256sum \"$p\" | cut -d' ' -f1) $(stat -c '%U %G %a' \"$p\") $p\"; "
                "else echo \"- - - - $p\"; fi; done")

    def process(self, output):
        out = {}
        for line in output:
            sha, user, group, mode, path = line.split(" ", 4)
            out[path] = None if sha == "-" else (sha, user, group, mode)
        return out


_MANIFESTS: dict[tuple[str, tuple[str, ...]], dict] = {}


def _mode(mode: str) -> str:
    return mode.lstrip("0") or "0"


def stale(files: list[tuple[str | bytes | Secret, str]], user: str, group: str, mode: str,
          paths: tuple[str, ...] | None = None) -> list:
    """The (content, dest) pairs whose host copy differs in content, owner or mode: one remote command
    (pyinfra caches a fact per arguments, so callers sharing `paths` share that one command)."""
    key = (host.name, paths or tuple(dest for _, dest in files))
    if key not in _MANIFESTS:  # pyinfra's own fact cache differs inside and outside operations
        _MANIFESTS[key] = host.get_fact(Manifest, paths=key[1])
    have = _MANIFESTS[key]
    out = []
    for src, dest in files:
        data = _bytes(src)
        if have.get(dest) != (hashlib.sha256(data).hexdigest(), user, group, _mode(mode)):
            out.append((src, dest))
    return out


def _bytes(src: str | bytes | Secret) -> bytes:
    if isinstance(src, Secret):
        return src.reveal().encode()
    if isinstance(src, bytes):
        return src
    with open(src, "rb") as f:
        return f.read()


@operation()
def synced_files(files: list[tuple[str | bytes | Secret, str]], user: str = "root", group: str = "root",
                 mode: str = "644", staging_dir: str = "/etc/vllm/.staging",
                 paths: tuple[str, ...] | None = None):
    """
    Make each dest hold its content (a controller path, bytes, or a Secret) with owner and mode:
    one remote command compares them all, instead of two or three per file with ``files.put``.

    Uploads go into a root-only 0700 staging directory, get owner and mode there, then are renamed
    into place: no reader ever sees a half-written file or a secret with the wrong mode, and unlike
    ``files.put`` nothing of the content is printed (``--diff``).

    **Example:**

    .. code:: python

        synced_files(name="model files", files=[("/models/tiny/config.json", "/var/lib/vllm/models/…")])
    """
    todo = stale(files, user, group, mode, paths=paths)
    if not todo:
        host.noop(f"{len(files)} files up to date")
        return
    dirs = sorted({dest.rsplit("/", 1)[0] for _, dest in todo})
    yield f"install -d -m 0700 -o root -g root {staging_dir} && mkdir -p {' '.join(map(shlex.quote, dirs))}"
    for i, (src, dest) in enumerate(todo):
        staged = f"{staging_dir}/{i}.{dest.rsplit('/', 1)[-1]}"
        payload = src if isinstance(src, str) else BytesIO(_bytes(src))
        yield FileUploadCommand(payload, staged, remote_temp_filename=f"{staged}.part")
        yield (f"chown {user}:{group} {shlex.quote(staged)} && chmod {mode} {shlex.quote(staged)} && "
               f"mv -f {shlex.quote(staged)} {shlex.quote(dest)}")
