"""Locks: the exact files one vLLM release installs on one kind of host.

Why a lock per target and not one requirement: a resolver answers for the Python and platform it runs
for, so the controller's own resolution (its Python 3.11) is wrong for a Debian 13 host (3.13), and two
hosts resolving for themselves on different days get different packages. A lock is resolved once on the
controller for a target (Python version, platform, variant), with every file's hash, and each host of
that target installs exactly it with ``--no-deps --require-hashes``, from the controller's store or from
an index.

Pure: parsing, identity, the target's wheel tags and the broken-pair check; resolving and downloading are
vllm_fleet/controller/locks.py.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from vllm_fleet.core.flags import version_tuple

# The newest glibc uv resolves for (`uv pip compile --python-platform x86_64-manylinux_2_40`); a newer
# host (Debian 13: glibc 2.41) runs every wheel built for 2.40 and older.
UV_NEWEST_GLIBC = (2, 40)
OLDEST_GLIBC = (2, 17)  # manylinux2014, the oldest tag the wheels vLLM needs are built for
MACHINES = ("x86_64", "aarch64")


class LockError(ValueError):
    """A lock that must not be installed, or a target that cannot have one; the message says why."""


@dataclass(frozen=True)
class Target:
    """What a lock is resolved for: every host with the same Python minor, machine and glibc floor, and
    the same build of vLLM, installs the same files."""

    python: tuple[int, int]
    machine: str
    glibc: tuple[int, int]
    variant: str

    @classmethod
    def of_host(cls, python: str, machine: str, glibc: str, variant: str) -> Target:
        """From the host's own `python3` (its version, `platform.machine()`, `platform.libc_ver()`)."""
        py = tuple(int(x) for x in re.findall(r"\d+", python)[:2])
        libc = tuple(int(x) for x in re.findall(r"\d+", glibc)[:2])
        if len(py) != 2 or len(libc) != 2:
            raise LockError(f"cannot tell the host's Python ({python!r}) or glibc ({glibc!r})")
        if machine not in MACHINES:
            raise LockError(f"no vLLM wheels for machine {machine!r} (known: {', '.join(MACHINES)})")
        if libc < OLDEST_GLIBC:
            raise LockError(f"glibc {libc[0]}.{libc[1]} is older than manylinux2014 (2.17)")
        return cls((py[0], py[1]), machine, min((libc[0], libc[1]), UV_NEWEST_GLIBC), variant)

    @property
    def platform(self) -> str:
        """uv's `--python-platform` value."""
        return f"{self.machine}-manylinux_{self.glibc[0]}_{self.glibc[1]}"

    @property
    def key(self) -> str:
        """Names the target in file names and plans: `cp313-x86_64-manylinux_2_40-cu130`."""
        return f"cp{self.python[0]}{self.python[1]}-{self.platform}-{self.variant}"

    def wheel_tags(self) -> list[str]:
        """The wheel tags this target installs, most specific first (the order pip and uv prefer), as
        `interpreter-abi-platform` strings."""
        cp = f"cp{self.python[0]}{self.python[1]}"
        plats = [f"manylinux_2_{m}_{self.machine}" for m in range(self.glibc[1], OLDEST_GLIBC[1] - 1, -1)]
        plats.append("manylinux2014_" + self.machine)
        if self.machine == "x86_64":
            plats += ["manylinux2010_x86_64", "manylinux1_x86_64"]
        plats.append("linux_" + self.machine)
        tags = [f"{cp}-{cp}-{p}" for p in plats]
        tags += [f"{cp}-abi3-{p}" for p in plats]
        tags += [f"cp3{m}-abi3-{p}" for m in range(self.python[1] - 1, 1, -1) for p in plats]
        tags += [f"{cp}-none-{p}" for p in plats]
        pys = [f"py3{self.python[1]}", "py3", *(f"py3{m}" for m in range(self.python[1] - 1, -1, -1))]
        tags += [f"{py}-none-{p}" for py in pys for p in plats]
        tags += [f"{cp}-none-any", *(f"{py}-none-any" for py in pys)]
        return tags


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    hashes: frozenset[str]  # sha256 hex of every file of that version the resolver accepted


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Lock:
    """A requirements file with exact pins and hashes (`uv pip compile --generate-hashes`)."""

    text: str
    pins: tuple[Pin, ...] = field(default=())

    @classmethod
    def parse(cls, text: str) -> Lock:
        pins, problems = [], []
        joined = re.sub(r"\\\n", " ", text)
        for line in joined.splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            if not line:
                continue
            m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)(\s.*)?$", line)
            if not m:
                problems.append(line[:80])
                continue
            hashes = frozenset(re.findall(r"--hash=sha256:([0-9a-f]{64})", m[3] or ""))
            if not hashes:
                problems.append(f"{m[1]}=={m[2]} has no sha256 hash")
                continue
            pins.append(Pin(normalize(m[1]), m[2], hashes))
        if problems:
            raise LockError("not a lock (exact pins with hashes): " + "; ".join(problems[:3]))
        names = [p.name for p in pins]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise LockError(f"a lock pins each package once: {', '.join(twice)} twice")
        return cls(text, tuple(sorted(pins, key=lambda p: p.name)))

    @property
    def digest(self) -> str:
        """The lock's identity, shown by plans and recorded in host state: the first 16 hex of the
        sha256 of its exact text (the host computes the same from its copy)."""
        return digest(self.text)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def pin(self, name: str) -> Pin | None:
        n = normalize(name)
        return next((p for p in self.pins if p.name == n), None)

    def without(self, names: Iterable[str]) -> Lock:
        """The lock less some packages: a variant's `remove_after_install` are never installed at all
        (with `--no-deps` a package not in the lock is not pulled in)."""
        drop = {normalize(n) for n in names}
        if not drop & {p.name for p in self.pins}:
            return self
        blocks = re.split(r"\n(?=[A-Za-z0-9])", self.text.strip("\n"))
        kept = [b for b in blocks
                if not (m := re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==", b)) or normalize(m[1]) not in drop]
        return Lock.parse("\n".join(kept) + "\n")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# --- known broken pairs -------------------------------------------------------------------------------
@dataclass(frozen=True)
class BrokenPair:
    """Two pins that resolve together but break each other once installed."""

    first: str
    first_below: str  # the first package is broken below this version...
    second: str
    second_from: str  # ...when the second is at this version or newer
    why: str
    fix: str


BROKEN_PAIRS = (
    # uv's resolution of vllm 0.33.0 picked both: cuda-python 12.x ships cuda/bindings files over those of
    # cuda-bindings 13.x, and cutlass (fp8, awq) then fails to import
    BrokenPair("cuda-python", "13", "cuda-bindings", "13",
               "cuda-python 12.x overwrites cuda-bindings 13.x's files: `import cutlass` fails "
               "(cuda.bindings.runtime has no attribute cudaLibrary_t), and with it fp8 and awq",
               'the release table must constrain this build to "cuda-python>=13" (its `constraints`)'),
)


def broken_pairs(lock: Lock, pairs: Sequence[BrokenPair] = BROKEN_PAIRS,
                 accelerator: str = "cuda") -> list[str]:
    """What in a resolved lock must not be installed: the known broken pairs, and, for a CUDA build, a
    torch CPU build (an index or folder that has one satisfies `torch==X` with `X+cpu`)."""
    problems = []
    torch = lock.pin("torch")
    if accelerator == "cuda" and torch is not None and torch.version.endswith("+cpu"):
        problems.append(f"torch {torch.version} is a CPU build, for a CUDA build of vLLM: a find-links "
                        "folder or index offers it; remove it from this lock's sources")
    for bp in pairs:
        a, b = lock.pin(bp.first), lock.pin(bp.second)
        if a is None or b is None:
            continue
        if version_tuple(a.version) < version_tuple(bp.first_below) and \
                version_tuple(b.version) >= version_tuple(bp.second_from):
            problems.append(f"{bp.first} {a.version} with {bp.second} {b.version}: {bp.why}; {bp.fix}")
    return problems


# --- where the files come from ------------------------------------------------------------------------
@dataclass(frozen=True)
class IndexSettings:
    """Where a lock is resolved from and installed from: PEP 503 indexes (the first replaces PyPI),
    uv's index strategy, and, on the controller only, find-links folders."""

    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    index_strategy: str | None = None
    find_links: tuple[str, ...] = ()

    def uv_args(self, find_links: bool = True) -> list[str]:
        args: list[str] = []
        if self.index_url:
            args += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        if self.index_strategy:
            args += ["--index-strategy", self.index_strategy]
        if find_links:
            for fl in self.find_links:
                args += ["--find-links", fl]
        return args

    @property
    def indexes(self) -> list[str]:
        return [self.index_url or "https://pypi.org/simple", *self.extra_index_urls]

    def describe(self) -> str:
        return " + ".join([*self.indexes, *self.find_links])

    @property
    def key(self) -> str:
        """Part of a cached lock's name: another index can resolve other files."""
        return digest("\n".join([*self.indexes, self.index_strategy or "", *self.find_links]))[:8]


def settings_for(variant_index_url: str | None, variant_extra: Sequence[str], variant_strategy: str | None,
                 fleet: Mapping[str, object] | None, find_links: Sequence[str] = (),
                 public_indexes: bool = True) -> IndexSettings:
    """The fleet's own index settings replace the variant table's public indexes (download.pytorch.org,
    wheels.vllm.ai); without them the table's are used, unless the controller is told to skip them."""
    if fleet:
        extra = fleet.get("extra_index_urls")
        return IndexSettings(str(fleet["index_url"]) if fleet.get("index_url") else None,
                             tuple(str(u) for u in extra) if isinstance(extra, list | tuple) else (),
                             str(fleet["index_strategy"]) if fleet.get("index_strategy") else None,
                             tuple(find_links))
    if not public_indexes:
        return IndexSettings(find_links=tuple(find_links))
    return IndexSettings(variant_index_url, tuple(variant_extra), variant_strategy, tuple(find_links))


def best_file(files: Mapping[str, str], pin: Pin, target: Target) -> str | None:
    """Of an index's files for a pin ({file name: sha256}), the wheel the target installs: its hash in
    the lock and the most specific tag the target takes."""
    order = {t: i for i, t in enumerate(target.wheel_tags())}
    best, rank = None, len(order)
    for name, sha in files.items():
        if sha not in pin.hashes or not name.endswith(".whl"):
            continue
        for tag in wheel_file_tags(name):
            if order.get(tag, rank) < rank:
                best, rank = name, order[tag]
    return best


def wheel_file_tags(name: str) -> list[str]:
    """`torch-2.14.0-cp313-cp313-manylinux_2_28_x86_64.whl` -> its expanded tags (compressed tag sets
    such as `py2.py3` or `manylinux_2_17_x86_64.manylinux2014_x86_64` give one tag per combination)."""
    parts = name[:-4].split("-")
    if len(parts) < 5:
        return []
    pys, abis, plats = parts[-3].split("."), parts[-2].split("."), parts[-1].split(".")
    tags = [f"{p}-{a}-{pl}" for p in pys for a in abis for pl in plats]
    if "py2.py3" in parts[-3]:
        tags += [f"py2.py3-{a}-{pl}" for a in abis for pl in plats]
    return tags


def install_command(python: str, release: str, lock_file: str, index: IndexSettings,
                    store: str | None) -> list[str]:
    """The `uv pip install` argv that puts exactly the lock into the release being built.

    `--no-deps --require-hashes`: nothing but the lock's pins, each file checked against its hashes, so
    an index that serves another file under the same name is refused. From the host's wheel store
    (`store`, the controller's files) with `--no-index`, or from the index settings (registry mode; the
    controller's find-links folders are not the host's). `python` must lie inside `release`, so a slip
    in the caller cannot install into the system Python.
    """
    if not python.startswith(release.rstrip("/") + "/"):
        raise ValueError(f"python {python} is not inside the release {release}: refusing to install "
                         "elsewhere")
    argv = ["uv", "pip", "install", "--quiet", "--python", python, "--no-deps", "--require-hashes"]
    if store is not None:
        argv += ["--no-index", "--find-links", store]
    else:
        argv += index.uv_args(find_links=False)
    return [*argv, "-r", lock_file]
