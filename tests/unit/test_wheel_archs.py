"""scripts/wheel_archs.py: reading a wheel's device code into the variants table's cuda_arch_list.

The listings are real ``cuobjdump --list-elf`` / ``--list-ptx`` outputs of PyPI's vLLM wheels, kept under
tests/fixtures/cuobjdump/ (INDEX.md names each wheel and its sha256). No download and no cuobjdump here:
where the script runs the tool, a stand-in shell script prints those captures.
"""

from __future__ import annotations

import importlib.util
import sys
import tomllib
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from vllm_fleet.core.variants import load_table, parse_table

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "cuobjdump"
TABLE = REPO / "vllm_fleet" / "data" / "variants.toml"


def _load_script():
    spec = importlib.util.spec_from_file_location("wheel_archs", REPO / "scripts" / "wheel_archs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["wheel_archs"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


wa = _load_script()
T = wa.Target.parse


def listing(wheel: str, lib: str, kind: str) -> str:
    return (FIXTURES / wheel / f"{lib}.{kind}.txt").read_text()


def library(wheel: str, path: str) -> wa.Library:
    name = path.rsplit("/", 1)[-1]
    return wa.Library(
        path,
        wa.parse_listing(listing(wheel, name, "list-elf")),
        wa.parse_listing(listing(wheel, name, "list-ptx")),
    )


V33 = "vllm-0.33.0-x86_64"
V33_LIBS = [
    "vllm/_C_stable_libtorch.abi3.so",
    "vllm/_moe_C_stable_libtorch.abi3.so",
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so",
    "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
    "vllm/_flashmla_C.abi3.so",
    "vllm/_flashkda_C.abi3.so",
    "vllm/cumem_allocator.abi3.so",
]
W33 = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
READ_BY = "# cuda_arch_list read by scripts/wheel_archs.py from "
V33_LIST = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]


# --- targets and listings -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "arch", "generic"),
    [("sm_75", "7.5", True), ("sm_90a", "9.0", False), ("sm_100f", "10.0", False), ("sm_120", "12.0", True),
     ("sm_110", "11.0", True), ("sm_103a", "10.3", False)],
)  # fmt: skip
def test_target_parse(text: str, arch: str, generic: bool) -> None:
    target = T(text)
    assert (target.arch, target.generic, str(target)) == (arch, generic, text)


@pytest.mark.parametrize("text", ["sm_9", "compute_90", "sm_90x", "90"])
def test_target_parse_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="not an sm target"):
        T(text)


def test_core_library_listing() -> None:
    """vllm-0.33.0 x86_64 core: the issue's SASS list, sm_90a besides, and PTX for a few kernels only."""
    core = library(V33, V33_LIBS[0])
    sass = {"sm_75": 62, "sm_80": 71, "sm_86": 51, "sm_89": 57, "sm_90": 58, "sm_90a": 27, "sm_100": 73,
            "sm_120": 85}  # fmt: skip
    assert core.sass == Counter({T(t): n for t, n in sass.items()})
    assert core.ptx == Counter({T("sm_80"): 19, T("sm_89"): 1, T("sm_90"): 8})


def test_nothing_to_list() -> None:
    """cuobjdump's notes for a library without device code, and for one with SASS only, read as empty."""
    assert wa.parse_listing(listing(V33, "cumem_allocator.abi3.so", "list-elf")) == Counter()
    assert wa.parse_listing(listing(V33, "_vllm_fa3_C.abi3.so", "list-ptx")) == Counter()
    assert not library(V33, V33_LIBS[-1]).has_device_code


def test_unknown_output_is_an_error() -> None:
    """A changed output format must not read as "no device code"."""
    with pytest.raises(ValueError, match="unexpected cuobjdump output"):
        wa.parse_listing("ELF file    1: x.sm_80.cubin\ncuobjdump fatal   : Could not open input file 'x'\n")


# --- the rule -------------------------------------------------------------------------------------------
def test_union_matches_the_issue_report() -> None:
    """Over all libraries: SASS sm 75 80 86 89 90 100 120 (and the specific sm_90a), PTX 80 89 90, no 110."""
    libs = [library(V33, p) for p in V33_LIBS]
    sass = set().union(*(lib.sass for lib in libs))
    ptx = set().union(*(lib.ptx for lib in libs))
    assert [str(t) for t in sorted(sass) if t.generic] == [
        "sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"
    ]  # fmt: skip
    assert {t for t in sass if not t.generic} == {T("sm_90a")}
    assert [str(t) for t in sorted(ptx)] == ["sm_80", "sm_89", "sm_90"]


def test_partial_ptx_is_not_plus_ptx() -> None:
    """19 of 71 sm_80 images have PTX (Marlin, CUTLASS scaled_mm, hadacore): no forward compatibility."""
    libs = [library(V33, p) for p in V33_LIBS]
    assert wa.table_list(wa.core_libraries(libs)) == V33_LIST


def test_full_ptx_is_plus_ptx() -> None:
    """FA2 has PTX beside each of its 76 sm_80 images: as a core library it would be "8.0+PTX"."""
    assert wa.table_list([library(V33, "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so")]) == ["8.0+PTX"]


def test_arch_specific_targets_do_not_count() -> None:
    """FA3 is sm_90a only: SASS for an H100/H200 and nothing else, so no generic entry at all."""
    fa3 = library(V33, "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so")
    assert set(fa3.sass) == {T("sm_90a")}
    assert wa.table_list([fa3]) == []
    specific = wa.Library("x", Counter({T("sm_100a"): 3, T("sm_100f"): 1}), Counter({T("sm_100a"): 3}))
    assert wa.table_list([specific]) == []


def test_both_core_libraries_must_have_an_arch() -> None:
    """0.20.0 ships _C and _C_stable_libtorch; an arch missing from one of them is not listed."""
    cores = [library("vllm-0.20.0-x86_64", "vllm/_C.abi3.so"),
             library("vllm-0.20.0-x86_64", "vllm/_C_stable_libtorch.abi3.so")]  # fmt: skip
    assert [c.path for c in wa.core_libraries(cores[::-1])] == [c.path for c in cores]
    assert wa.table_list(cores) == V33_LIST
    without_sm86 = wa.Library(
        cores[1].path, Counter({t: n for t, n in cores[1].sass.items() if str(t) != "sm_86"})
    )
    assert "8.6" not in wa.table_list([cores[0], without_sm86])


def test_aarch64_wheel_differs() -> None:
    """The aarch64 wheel of the same release: Orin (8.7) and Thor (11.0), no Turing (7.5)."""
    core = library("vllm-0.33.0-aarch64", "vllm/_C_stable_libtorch.abi3.so")
    assert wa.table_list([core]) == ["8.0", "8.6", "8.7", "8.9", "9.0", "10.0", "11.0", "12.0"]


def test_no_core_library() -> None:
    with pytest.raises(ValueError, match="which library is vLLM's core"):
        wa.core_libraries([library(V33, "vllm/_flashmla_C.abi3.so")])


def test_report_shows_each_library_and_the_row() -> None:
    text = wa.report("vllm-0.33.0-x.whl", [library(V33, p) for p in V33_LIBS], ["libcudart.so.13"])
    assert "  vllm/_C_stable_libtorch.abi3.so  (core)" in text
    assert "  vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so\n      SASS sm_90ax192\n      PTX  -" in text
    assert "  vllm/cumem_allocator.abi3.so: no device code" in text
    assert "  sm_80: 19 PTX images, 71 SASS images (partial: not +PTX)" in text
    assert "core DT_NEEDED: libcudart.so.13" in text
    assert text.endswith('cuda_arch_list = ["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]')


def test_packaged_table_says_what_the_wheel_has() -> None:
    """The table's 0.33.0 cu130 row is what the captured wheel gives, and names that wheel."""
    assert [str(a) for a in load_table()["0.33.0"]["cu130"].cuda_arch_list] == V33_LIST
    assert f"{READ_BY}{W33} sha256:4b6bdec4ab269990\n" in TABLE.read_text()


# --- reading a wheel (with a stand-in cuobjdump) --------------------------------------------------------
def test_read_wheel(tmp_path: Path) -> None:
    """Every *.so* that is an ELF file is listed; other files, and a .so that is no ELF, are skipped."""
    tool = tmp_path / "cuobjdump"
    tool.write_text(
        "#!/bin/sh\n"
        'kind=$(echo "$1" | sed s/^--//)\n'
        f'cat "{FIXTURES}/{V33}/$(basename "$2").$kind.txt"\n'
        'case "$2" in *cumem_allocator*) exit 255;; esac\n'
    )
    tool.chmod(0o755)
    wheel = tmp_path / W33
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm/_C_stable_libtorch.abi3.so", b"\x7fELF fake")
        zf.writestr("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", b"\x7fELF fake")
        zf.writestr("vllm/cumem_allocator.abi3.so", b"\x7fELF fake")
        zf.writestr("vllm/linker_script.so", b"INPUT(x)")  # not ELF: skipped
        zf.writestr("vllm/__init__.py", b"")
    libs, _ = wa.read_wheel(wheel, str(tool))
    assert [lib.path for lib in libs] == [
        "vllm/_C_stable_libtorch.abi3.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
        "vllm/cumem_allocator.abi3.so",
    ]  # fmt: skip
    assert libs[0].ptx == Counter({T("sm_80"): 19, T("sm_89"): 1, T("sm_90"): 8})
    assert not libs[2].has_device_code
    assert wa.table_list(wa.core_libraries(libs)) == V33_LIST


def test_wheel_version() -> None:
    assert wa.wheel_version("vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl") == "0.33.0"
    assert wa.wheel_version("vllm-0.33.0+cu129-cp38-abi3-manylinux_2_28_x86_64.whl") == "0.33.0+cu129"
    with pytest.raises(ValueError, match="not a wheel"):
        wa.wheel_version("vllm-0.33.0.tar.gz")


# --- writing the table ----------------------------------------------------------------------------------
COMMENT = f"{READ_BY}vllm-0.33.0+cu129-x.whl sha256:0123456789abcdef"


def test_rewrite_changes_only_that_row() -> None:
    """The cu129 row's hand-copied note and list are replaced; every other byte stays."""
    before = TABLE.read_text()
    after = wa.rewrite_row(before, "0.33.0", "cu129", ["8.0", "9.0+PTX"], COMMENT)
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    i = old.index('[release."0.33.0".variant.cu129]\n')
    j = next(k for k in range(i, len(old)) if old[k].startswith("cuda_arch_list"))
    assert old[j - 1].startswith("# cuda_arch_list not read from a wheel")
    assert new[: j - 1] == old[: j - 1] and new[j + 1 :] == old[j + 1 :]
    assert new[j - 1 : j + 1] == [COMMENT + "\n", 'cuda_arch_list = ["8.0", "9.0+PTX"]\n']
    table = parse_table(after)
    assert [str(a) for a in table["0.33.0"]["cu129"].cuda_arch_list] == ["8.0", "9.0+PTX"]
    assert table["0.32.0"]["cu129"] == parse_table(before)["0.32.0"]["cu129"]
    assert wa.rewrite_row(after, "0.33.0", "cu129", ["8.0", "9.0+PTX"], COMMENT) == after  # no pile-up


def test_rewrite_inserts_a_comment_where_there_was_none() -> None:
    text = 'schema = 1\n\n[release."1.0.0".variant.cu130]\n# other note\ncuda_arch_list = ["8.0"]\nx = 1\n'
    head = 'schema = 1\n\n[release."1.0.0".variant.cu130]\n# other note\n'
    assert wa.rewrite_row(text, "1.0.0", "cu130", ["9.0"], COMMENT) == (
        f'{head}{COMMENT}\ncuda_arch_list = ["9.0"]\nx = 1\n'
    )


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('[release."1.0.0".variant.cu129]\ncuda_arch_list = ["8.0"]\n', "is not in the table"),
        ('[release."1.0.0".variant.cu130]\npackage = "vllm"\n[release."1.0.0".variant.cu129]\n'
         'cuda_arch_list = ["8.0"]\n', "has 0 cuda_arch_list lines"),
        ('[release."1.0.0".variant.cu130]\ncuda_arch_list = [\n  "8.0",\n]\n', "not a single-line list"),
    ],
)  # fmt: skip
def test_rewrite_refuses(text: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        wa.rewrite_row(text, "1.0.0", "cu130", ["9.0"], COMMENT)


def test_write_table_checks_the_wheel_is_the_rows_build(tmp_path: Path) -> None:
    """A default (CUDA 13) wheel cannot be recorded on the +cu129 row, nor 0.33.0's on 0.34.0's."""
    table = tmp_path / "variants.toml"
    table.write_text(TABLE.read_text())
    wheel = Path(W33)  # only its name is read
    for release, variant in (("0.33.0", "cu129"), ("0.34.0", "cu130")):
        with pytest.raises(SystemExit, match="refusing to record another build's device code"):
            wa.write_table(table, release, variant, V33_LIST, wheel, "ab" * 32)
    assert table.read_text() == TABLE.read_text()
    wa.write_table(table, "0.33.0", "cu130", ["8.0"], wheel, "ab" * 32)
    row = tomllib.loads(table.read_text())["release"]["0.33.0"]["variant"]["cu130"]
    assert row["cuda_arch_list"] == ["8.0"]
    assert f"{READ_BY}{W33} sha256:abababababababab\ncuda_arch_list" in table.read_text()
    cu129 = Path(W33.replace("0.33.0", "0.33.0+cu129"))
    wa.write_table(table, "0.33.0", "cu129", ["8.0"], cu129, "cd" * 32)
    assert f"{READ_BY}{cu129.name} sha256:cdcdcdcdcdcdcdcd\n" in table.read_text()
