"""Operations pyinfra lacks, written like pyinfra's own (generators yielding commands)."""

from __future__ import annotations

import hashlib
from io import BytesIO

from pyinfra import host
from pyinfra.api import FileUploadCommand, operation
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
