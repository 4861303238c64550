"""The real captured nvidia-smi / NVRM outputs (tests/fixtures/nvidia, INDEX.md says where each came from)."""

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nvidia"


def capture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")
