"""Operations pyinfra lacks, written like pyinfra's own (generators yielding commands)."""

from __future__ import annotations

import hashlib
import shlex
from io import BytesIO

from pyinfra import host
from pyinfra.api import FactBase, FileUploadCommand, operation
from pyinfra.facts.files import File, Sha256File


class Secret:
    """A value that prints as <redacted>: op arguments can reach pyinfra's logs, secrets must not."""

    def __init__(self, value: str):
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "<redacted>"

    __str__ = __repr__


@operation()
def secret_file(dest: str, content: Secret, staging_dir: str = "/etc/vllm/.staging"):
    """
    Write a root-only 0600 file whose content never appears in pyinfra's output.

    ``files.put`` prints the file's lines under ``--diff`` and uploads through a world-readable temp
    file; this uploads into a 0700 staging directory, fixes owner and mode, then renames into place.

    **Example:**

    .. code:: python

        secret_file(name="API key", dest="/etc/vllm/default.env", content=Secret(text))
    """
    data = content.reveal().encode()
    want = hashlib.sha256(data).hexdigest()
    have = host.get_fact(Sha256File, path=dest)
    info = host.get_fact(File, path=dest) if have == want else None
    if have == want and info and info.get("mode") == 600 and info.get("user") == "root":
        host.noop(f"{dest} is up to date")
        return
    name = dest.rsplit("/", 1)[-1]
    staged = f"{staging_dir}/{name}"
    yield f"install -d -m 0700 -o root -g root {staging_dir}"
    yield FileUploadCommand(BytesIO(data), staged, remote_temp_filename=f"{staged}.part")
    yield f"chown root:root {staged} && chmod 0600 {staged} && mv -f {staged} {dest}"


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


@operation()
def synced_files(files: list[tuple[str, str]], user: str = "root", group: str = "root", mode: str = "644"):
    """
    Upload many controller files (src, dest) where content, owner or mode differ: one remote command
    to compare them all, instead of two or three per file with ``files.put``.

    **Example:**

    .. code:: python

        synced_files(name="model files", files=[("/models/tiny/config.json", "/var/lib/vllm/models/…")])
    """
    have = host.get_fact(Manifest, paths=tuple(dest for _, dest in files))
    dirs = sorted({dest.rsplit("/", 1)[0] for _, dest in files})
    changed = False
    for src, dest in files:
        with open(src, "rb") as f:
            want = hashlib.sha256(f.read()).hexdigest()
        if have.get(dest) == (want, user, group, mode.lstrip("0") or "0"):
            continue
        if not changed:
            yield f"mkdir -p {' '.join(shlex.quote(d) for d in dirs)}"
            changed = True
        yield FileUploadCommand(src, dest, remote_temp_filename=host.get_temp_filename(dest))
        yield f"chown {user}:{group} {shlex.quote(dest)} && chmod {mode} {shlex.quote(dest)}"
    if not changed:
        host.noop(f"{len(files)} files up to date")
