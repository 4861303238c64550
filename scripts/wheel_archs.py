#!/usr/bin/env python3
"""Read which GPU architectures a vLLM wheel really has kernels for, and write that into the variants table.

Why: ``cuda_arch_list`` in vllm_fleet/data/variants.toml decides which hosts get which build, and lists
copied by hand from vLLM's build scripts were wrong (they named sm_110 and 12.0+PTX; the wheels had
neither). This reads the device code itself, with ``cuobjdump --list-elf`` / ``--list-ptx`` on every
shared library of the wheel, so a row can say which wheel (and sha256) it was read from.

Runs on the controller (or any workstation), never on a host: it needs ``cuobjdump`` (CUDA toolkit, or
``pip install nvidia-cuda-cuobjdump``: some toolkit installs ship nvcc without it) and, for a requirement
rather than a file, pip and PyPI.

What the table's list means (the rule ``table_list`` applies):

* An arch "X.Y" is listed when the core library (``vllm/_C.abi3.so``; from 0.31 on
  ``vllm/_C_stable_libtorch.abi3.so``; 0.20.0 has both, and then both must) has generic SASS (``sm_XY``)
  for it. The core library holds the kernels every model needs (norms, activations, KV-cache ops):
  without them vLLM does not run, whatever the optional libraries (FlashAttention 2/3, FlashMLA, ...)
  carry. Those are printed per library so a person can see that e.g. FA3 is sm_90a only.
* Arch-specific targets ("a": sm_90a, sm_100a; "f": sm_100f, the family) never count: their SASS runs on
  that exact chip (or family) only, and their PTX cannot be JIT-compiled for newer GPUs.
* "+PTX" is added only when the core library carries generic PTX for X.Y beside *every* SASS image of
  X.Y (as ``TORCH_CUDA_ARCH_LIST="X.Y+PTX"`` builds it). vLLM's wheels carry PTX for a few kernel families
  only (Marlin, CUTLASS scaled_mm, hadacore): a GPU newer than every SASS major could JIT those but not the
  core ops, so such partial PTX must not make the table claim forward compatibility.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TABLE = REPO / "vllm_fleet" / "data" / "variants.toml"
CACHE = Path("/var/cache/vllm-fleet/arch-wheels")
# The core library's name changed when vLLM moved to torch's stable ABI; the first one present is used.
CORE_LIBRARIES = ("vllm/_C.abi3.so", "vllm/_C_stable_libtorch.abi3.so")
# where `pip install --target` puts cuobjdump when the CUDA toolkit's nvcc came without it (as on the
# machine these lists were read on: its /usr/local/cuda-13.0 has nvcc but no cuobjdump)
PIP_TARGET = "/opt/nvidia-cuobjdump"
COMMENT_PREFIX = "# cuda_arch_list "  # every generated or hand-written note about a row's list starts so

_LISTING = re.compile(r"^(ELF|PTX) file\s+\d+: .*\.(sm_\d+[a-z]?)\.(cubin|ptx)$")
_EMPTY = ("does not contain device code", "No PTX file found", "No ELF file found")


@dataclass(frozen=True, order=True)
class Target:
    """One cuobjdump target such as sm_90 (generic), sm_90a (that chip only) or sm_100f (that family)."""

    major: int
    minor: int
    suffix: str = ""

    @classmethod
    def parse(cls, text: str) -> Target:
        match = re.fullmatch(r"sm_(\d+)(\d)([af]?)", text)
        if not match:
            raise ValueError(f"not an sm target: {text!r}")
        return cls(int(match[1]), int(match[2]), match[3])

    @property
    def generic(self) -> bool:
        return not self.suffix

    @property
    def arch(self) -> str:
        """The TORCH_CUDA_ARCH_LIST spelling: sm_120 -> "12.0"."""
        return f"{self.major}.{self.minor}"

    def __str__(self) -> str:
        return f"sm_{self.major}{self.minor}{self.suffix}"


@dataclass
class Library:
    """The device code of one shared library: how many SASS (cubin) and PTX images it has per target."""

    path: str
    sass: Counter[Target] = field(default_factory=Counter)
    ptx: Counter[Target] = field(default_factory=Counter)

    @property
    def has_device_code(self) -> bool:
        return bool(self.sass or self.ptx)


def parse_listing(text: str) -> Counter[Target]:
    """Images per target in one ``cuobjdump --list-elf`` or ``--list-ptx`` output.

    Any line that is neither an image nor one of cuobjdump's known "nothing here" notes is an error, so a
    changed output format fails loudly instead of reading as "no device code".
    """
    found: Counter[Target] = Counter()
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        match = _LISTING.match(line)
        if match:
            found[Target.parse(match[2])] += 1
        elif not (line.startswith("cuobjdump info") and any(note in line for note in _EMPTY)):
            raise ValueError(f"unexpected cuobjdump output: {line!r}")
    return found


def _fmt(counts: Counter[Target]) -> str:
    return " ".join(f"{t}x{n}" for t, n in sorted(counts.items())) or "-"


def core_libraries(libraries: list[Library]) -> list[Library]:
    """The core libraries present (0.20.0 has both names: ops were moving to the stable ABI one by one)."""
    found = [lib for name in CORE_LIBRARIES for lib in libraries if lib.path == name]
    if not found:
        names = ", ".join(CORE_LIBRARIES)
        raise ValueError(f"none of {names} is in the wheel: which library is vLLM's core?")
    return found


def table_list(cores: list[Library]) -> list[str]:
    """The cuda_arch_list entries for a build with these core libraries (rule: module docstring).

    An arch must be in every core library, since a model needs ops from each; likewise for "+PTX".
    """
    common = set.intersection(*({t for t in lib.sass if t.generic} for lib in cores))
    entries = []
    for target in sorted(common):
        full_ptx = all(lib.ptx[target] >= lib.sass[target] for lib in cores)
        entries.append(target.arch + ("+PTX" if full_ptx else ""))
    return entries


def toml_list(entries: list[str]) -> str:
    return "[" + ", ".join(f'"{e}"' for e in entries) + "]"


def report(wheel_name: str, libraries: list[Library], needed: list[str] | None = None) -> str:
    """What a person reads: per library, then the union, then the row to paste."""
    cores = core_libraries(libraries)
    lines = [f"{wheel_name}", "", "per library (images per target; 'a'/'f' = arch-/family-specific):"]
    for lib in sorted(libraries, key=lambda lib: lib.path):
        if not lib.has_device_code:
            lines.append(f"  {lib.path}: no device code")
            continue
        mark = "  (core)" if lib in cores else ""
        lines.append(f"  {lib.path}{mark}")
        lines.append(f"      SASS {_fmt(lib.sass)}")
        lines.append(f"      PTX  {_fmt(lib.ptx)}")
    all_sass: Counter[Target] = sum((lib.sass for lib in libraries), Counter())
    all_ptx: Counter[Target] = sum((lib.ptx for lib in libraries), Counter())
    lines += [
        "",
        "all libraries:",
        f"  SASS {' '.join(str(t) for t in sorted(all_sass))}",
        f"  PTX  {' '.join(str(t) for t in sorted(all_ptx)) or '-'}",
    ]
    for core in cores:
        lines.append(f"core {core.path}:")
        for target in sorted(t for t in core.ptx if t.generic):
            lines.append(
                f"  {target}: {core.ptx[target]} PTX images, {core.sass[target]} SASS images"
                + (" (full: +PTX)" if core.ptx[target] >= core.sass[target] else " (partial: not +PTX)")
            )
    if needed is not None:
        lines.append(f"core DT_NEEDED: {' '.join(needed) or '-'}")
    lines += ["", f"cuda_arch_list = {toml_list(table_list(cores))}"]
    return "\n".join(lines)


# --- reading a wheel ------------------------------------------------------------------------------------
def find_cuobjdump(explicit: str | None = None) -> str:
    """cuobjdump from --cuobjdump, $CUOBJDUMP, PATH, a CUDA toolkit, or the nvidia-cuda-cuobjdump wheel."""
    candidates = [explicit, os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump")]
    candidates += sorted(glob.glob("/usr/local/cuda*/bin/cuobjdump"), reverse=True)
    for entry in [*sys.path, PIP_TARGET]:
        found = glob.glob(os.path.join(entry, "nvidia", "cu*", "bin", "cuobjdump"))
        candidates += sorted(found, reverse=True)
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit(
        f"cuobjdump not found: install the CUDA toolkit, or `pip install --target {PIP_TARGET} "
        "nvidia-cuda-cuobjdump` (any 13.x reads 12.x and 13.x wheels), or pass --cuobjdump PATH"
    )


def _cuobjdump(tool: str, flag: str, path: Path) -> Counter[Target]:
    proc = subprocess.run([tool, flag, str(path)], capture_output=True, text=True, check=False)
    out = proc.stdout + proc.stderr
    if proc.returncode not in (0, 255):  # 255: "does not contain device code", checked by parse_listing
        raise RuntimeError(f"{tool} {flag} {path} exited {proc.returncode}: {out.strip()[:500]}")
    return parse_listing(out)


def _needed(path: Path) -> list[str]:
    """DT_NEEDED of ``path`` (which CUDA runtime it links), or [] without readelf."""
    readelf = shutil.which("readelf")
    if not readelf:
        return []
    out = subprocess.run([readelf, "-d", str(path)], capture_output=True, text=True, check=False).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def read_wheel(wheel: Path, tool: str) -> tuple[list[Library], list[str]]:
    """The device code of every ELF shared library in ``wheel``, and the core library's DT_NEEDED."""
    libraries = []
    needed: list[str] = []
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory(prefix="wheel-archs-") as tmp:
        for name in zf.namelist():
            if not re.search(r"\.so(\.|$)", name.rsplit("/", 1)[-1]):
                continue
            path = Path(zf.extract(name, tmp))
            with path.open("rb") as fh:
                if fh.read(4) != b"\x7fELF":
                    continue
            libraries.append(
                Library(name, _cuobjdump(tool, "--list-elf", path), _cuobjdump(tool, "--list-ptx", path))
            )
            if name in CORE_LIBRARIES and not needed:
                needed = _needed(path)
            path.unlink()  # a wheel's libraries add up to ~1 GB; keep one at a time on disk
    return libraries, needed


def download(requirement: str, cache: Path, machine: str) -> Path:
    """The Linux wheel of ``requirement`` for ``machine``, from PyPI into ``cache`` (reused when there).

    Every manylinux_2_17 .. 2_40 tag is offered because pip does not widen an explicit --platform to the
    older glibc tags (vLLM 0.20.0 is manylinux_2_35, 0.31 and later manylinux_2_28).
    """
    cache.mkdir(parents=True, exist_ok=True)
    platforms = [f"--platform=manylinux_2_{glibc}_{machine}" for glibc in range(17, 41)]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           *platforms, "--dest", str(cache), requirement]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
    match = re.search(r"(?:Saved|File was already downloaded) (\S+\.whl)", proc.stdout)
    if not match:
        raise SystemExit(f"could not tell which wheel pip downloaded:\n{proc.stdout}")
    return Path(match[1])


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_version(wheel_name: str) -> str:
    """vllm-0.33.0+cu129-cp38-abi3-...whl -> "0.33.0+cu129" (a local version keeps its "+" in the name)."""
    parts = wheel_name.split("-")
    if len(parts) < 5 or not wheel_name.endswith(".whl"):
        raise ValueError(f"not a wheel file name: {wheel_name}")
    return parts[1]


# --- writing the table ----------------------------------------------------------------------------------
def rewrite_row(text: str, release: str, variant: str, entries: list[str], comment: str) -> str:
    """``text`` with that row's cuda_arch_list replaced and ``comment`` right above it; nothing else moves.

    Comment lines directly above the list that start with "# cuda_arch_list " (an earlier reading, or a
    note that the list was not read from a wheel) are replaced, so rerunning does not pile them up.
    """
    lines = text.splitlines(keepends=True)
    header = f'[release."{release}".variant.{variant}]'
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == header)
    except StopIteration:
        raise ValueError(f"{header} is not in the table") from None
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    rows = [i for i in range(start + 1, end) if re.match(r"cuda_arch_list\s*=", lines[i])]
    if len(rows) != 1:
        raise ValueError(f"{header} has {len(rows)} cuda_arch_list lines, expected one single-line list")
    row = rows[0]
    try:
        tomllib.loads(lines[row])
    except tomllib.TOMLDecodeError:
        raise ValueError(f"{header}: cuda_arch_list is not a single-line list") from None
    first = row
    while first - 1 > start and lines[first - 1].startswith(COMMENT_PREFIX):
        first -= 1
    newline = "\r\n" if lines[row].endswith("\r\n") else "\n"
    new = [comment.rstrip() + newline, f"cuda_arch_list = {toml_list(entries)}{newline}"]
    out = "".join(lines[:first] + new + lines[row + 1 :])
    written = tomllib.loads(out)["release"][release]["variant"][variant]["cuda_arch_list"]
    if written != entries:  # the file must still parse and say exactly what was read
        raise ValueError(f"rewrite of {header} did not round-trip: {written}")
    return out


def write_table(
    table: Path, release: str, variant: str, entries: list[str], wheel: Path, digest: str
) -> None:
    """Rewrite one row of ``table``, refusing a wheel that is not the build the row installs."""
    text = table.read_text(encoding="utf-8")
    row = tomllib.loads(text).get("release", {}).get(release, {}).get("variant", {}).get(variant)
    if row is None:
        raise SystemExit(f'{table}: no [release."{release}".variant.{variant}]')
    pinned = re.search(r"==\s*(\S+)", row.get("spec", ""))
    if not pinned or pinned[1] != wheel_version(wheel.name):
        raise SystemExit(
            f"{wheel.name} is version {wheel_version(wheel.name)}, but {release}/{variant} installs "
            f"{row.get('spec')!r}: refusing to record another build's device code"
        )
    comment = f"{COMMENT_PREFIX}read by scripts/wheel_archs.py from {wheel.name} sha256:{digest[:16]}"
    table.write_text(rewrite_row(text, release, variant, entries, comment), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel", help="a wheel file, or a requirement such as vllm==0.33.0 to download")
    parser.add_argument("--write", nargs=2, metavar=("RELEASE", "VARIANT"),
                        help="rewrite that row's cuda_arch_list in the table")  # fmt: skip
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--cache", type=Path, default=CACHE, help=f"download directory (default {CACHE})")
    parser.add_argument("--machine", default="x86_64", help="a requirement's wheel is for (default x86_64)")
    parser.add_argument("--cuobjdump", help="path of cuobjdump (default: searched)")
    args = parser.parse_args(argv)

    tool = find_cuobjdump(args.cuobjdump)
    wheel = Path(args.wheel)
    if not wheel.is_file():
        wheel = download(args.wheel, args.cache, args.machine)
    libraries, needed = read_wheel(wheel, tool)
    digest = sha256(wheel)
    print(report(f"{wheel.name} sha256:{digest}", libraries, needed))
    if args.write:
        entries = table_list(core_libraries(libraries))
        write_table(args.table, args.write[0], args.write[1], entries, wheel, digest)
        print(f"wrote {args.table}: {args.write[0]}/{args.write[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
