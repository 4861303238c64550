"""docs/inventory.md stays true: every key the schema accepts is documented there."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_fleet.core.flags import ServeFlags
from vllm_fleet.core.spec import (
    ClusterSpec,
    HostSpec,
    InstanceSpec,
    ModelSpec,
    SpecError,
    WatchdogSpec,
    parse_host,
)

DOC = (Path(__file__).resolve().parents[2] / "docs" / "inventory.md").read_text()


@pytest.mark.parametrize("model", [HostSpec, InstanceSpec, ModelSpec, ClusterSpec, ServeFlags, WatchdogSpec])
def test_every_key_is_documented(model):
    missing = [k for k in model.model_fields if f"`{k}`" not in DOC]
    assert missing == []


def test_seed_defaults_in_the_doc_match_the_schema():
    f = ServeFlags()
    assert (f.gpu_memory_utilization, f.max_num_seqs, f.host, f.port) == (0.90, 256, "127.0.0.1", 8000)
    for row in ("| `gpu_memory_utilization` | `0.90` |", "| `max_num_seqs` | `256` |",
                '| `host` | `"127.0.0.1"` |', "| `port` | `8000` |"):
        assert row in DOC


def test_the_types_example_is_the_real_message():
    example = ("gpu-01: vllm.instances[chat].port_protected_elsewhere: 'yes' (str) is not a boolean; "
               "write True")
    assert f"\n{example}\n" in DOC
    with pytest.raises(SpecError) as e:
        parse_host("gpu-01", {"instances": [{"name": "chat", "model": {"name": "m", "path": "/m"},
                                             "gpus": (0, 1), "port_protected_elsewhere": "yes"}]})
    assert e.value.problems == [example]


def test_watchdog_defaults_in_the_doc_match_the_schema():
    w = WatchdogSpec()
    for key in ("enabled", "interval_s", "timeout_s", "failures"):
        assert f"| `{key}` | `{getattr(w, key)}` |" in DOC


def test_the_key_tables_are_generated_from_the_schema_and_current():
    """Each default is defined once, at its field, with its docstring; the page's tables are that."""
    from vllm_fleet.core.keydoc import update

    assert update(DOC) == DOC, "run: python -m vllm_fleet.core.keydoc docs/inventory.md"


def test_a_docstring_cannot_show_another_default_than_the_fields_value():
    from pydantic import BaseModel, Field

    from vllm_fleet.core.keydoc import row

    class Lying(BaseModel):
        port: int = Field(8000)
        """the port\n\ndefault: `9000`"""
        gpus: int | None = None
        """how many\n\ndefault: all of them\nfrom: the facts"""
        undocumented: int = 1

    with pytest.raises(ValueError, match="contradicts its value 8000"):
        row(Lying, "port")
    assert row(Lying, "gpus") == ("`gpus`", "all of them", "the facts", "how many")
    with pytest.raises(ValueError, match="no docstring"):
        row(Lying, "undocumented")
