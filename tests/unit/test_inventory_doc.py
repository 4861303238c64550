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


def _shown(value) -> str:
    """A default as the doc's tables write it."""
    if isinstance(value, bool) or value == {}:
        return f"`{value}`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, float):
        return f"`{value:.2f}`"
    if isinstance(value, list):
        return "`[" + ", ".join(f'"{v}"' for v in value) + "]`"
    return f"`{value}`"


TABLES = [("## Host keys", HostSpec), ("## Instance keys", InstanceSpec), ("## Watchdog keys", WatchdogSpec),
          ("## Serve flags", ServeFlags)]


@pytest.mark.parametrize(("heading", "model"), TABLES)
def test_every_concrete_default_in_the_doc_is_the_schemas(heading, model):
    """The schema is where a default lives; the doc's tables must say the same for every key whose
    default is a value (derived ones, None, read as "none", "derived" or "vLLM's", are the planner's)."""
    import re

    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    part = DOC.split(heading, 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1): m.group(2).strip() for m in re.finditer(r"^\| `([a-z_]+)` \| ([^|]*) \|", part, re.M)}
    checked = 0
    for name, field in model.model_fields.items():
        value = field.default_factory() if field.default_factory is not None else field.default
        if value is PydanticUndefined or value is None or isinstance(value, BaseModel):
            continue
        assert rows.get(name) == _shown(value), (name, rows.get(name), _shown(value))
        checked += 1
    assert checked >= 4
