"""The inventory schema: every bad host is refused on the controller with 'host: vllm.path: message'."""

from __future__ import annotations

import copy
import re
import traceback
from pathlib import PurePosixPath

import pytest
from bad_inventories import ACCEPTED_BUT_BAD, BAD_HOSTS, M

from vllm_fleet.core.spec import (
    HostSpec,
    SpecError,
    deep_merge,
    instance_labels,
    is_vllm_host,
    parse_host,
    parse_inventory,
)

HOST = "gpu-07"


def problems_of(data: dict | None, defaults: dict | None = None, host: str = HOST) -> list[str]:
    with pytest.raises(SpecError) as e:
        parse_inventory([(host, data, defaults)])
    assert e.value.problems, "a SpecError must carry at least one problem line"
    assert str(e.value) == "\n".join(e.value.problems)
    return e.value.problems


def _ids(entries: list) -> list[str]:
    return [entry[0] for entry in entries]


def test_there_are_enough_bad_inventories() -> None:
    assert len(BAD_HOSTS) >= 40
    assert len(set(_ids(BAD_HOSTS))) == len(BAD_HOSTS), "descriptions must be unique"


def _check_refusal(data: dict, path: str, words: tuple[str, ...]) -> None:
    lines = problems_of(data)
    assert all(line.startswith(f"{HOST}: vllm") for line in lines), lines
    matching = [
        line for line in lines
        if path in line.removeprefix(f"{HOST}: ")
        and all(w.lower() in line.lower() for w in words)
    ]
    assert matching, f"no line names {path!r} with {words}: {lines}"
    # 'host: field: message' with a non-empty message
    parts = [line.split(": ", 2) for line in matching]
    assert all(len(p) == 3 and p[2].strip() for p in parts), matching


@pytest.mark.parametrize(("desc", "data", "path", "words"), BAD_HOSTS, ids=_ids(BAD_HOSTS))
def test_bad_inventory_refused_naming_host_field_and_rule(desc: str, data: dict, path: str,
                                                          words: tuple[str, ...]) -> None:
    _check_refusal(data, path, words)


@pytest.mark.parametrize(
    ("desc", "data", "path", "words"),
    [pytest.param(*entry, marks=pytest.mark.xfail(strict=True, reason=reason))
     for entry, reason in ACCEPTED_BUT_BAD],
    ids=[entry[0] for entry, _ in ACCEPTED_BUT_BAD],
)
def test_bad_inventory_the_schema_still_accepts(desc: str, data: dict, path: str,
                                                words: tuple[str, ...]) -> None:
    _check_refusal(data, path, words)


_PATH_IN_FIELD_BUGS: dict[str, str] = {}


@pytest.mark.parametrize(
    ("desc", "data", "path", "words"),
    [pytest.param(*e, marks=pytest.mark.xfail(strict=True, reason=_PATH_IN_FIELD_BUGS[e[0]]))
     if e[0] in _PATH_IN_FIELD_BUGS else pytest.param(*e) for e in BAD_HOSTS],
    ids=_ids(BAD_HOSTS),
)
def test_field_path_is_in_the_field_part_of_the_line(desc: str, data: dict, path: str,
                                                     words: tuple[str, ...]) -> None:
    """'gpu-07: vllm.instances[1].name: message', never 'gpu-07: vllm.: instances[1].name: message'."""
    fields = [line.split(": ", 2)[1] for line in problems_of(data)]
    assert all(re.fullmatch(r"vllm(\.\S+)?", f) and not f.endswith(".") for f in fields), fields
    wanted = path if path.startswith("vllm") else f"vllm.{path}"
    assert any(f.startswith(wanted) for f in fields), (wanted, fields)


@pytest.mark.parametrize("secret", ["hf_SECRETabc123", "sk-live-SECRET987"])
@pytest.mark.parametrize("where", ["env", "flags", "extra_args"])
def test_refusals_never_echo_the_secret_value(where: str, secret: str) -> None:
    data = {
        "env": {"model": M, "env": {"HF_TOKEN": secret}},
        "flags": {"model": M, "flags": {"api_key": secret}},
        "extra_args": {"model": M, "flags": {"extra_args": {"--hf-token": secret}}},
    }[where]
    for call in (lambda: parse_inventory([(HOST, data, None)]), lambda: parse_host(HOST, data)):
        with pytest.raises(SpecError) as e:
            call()
        # what an operator sees, traceback and chained exceptions included (pydantic's own error has it)
        shown = "".join(traceback.format_exception(e.value))
        assert "never" in shown
        assert secret not in shown


def test_empty_vllm_data_refused() -> None:
    assert problems_of({}) == [f"{HOST}: vllm: empty (a vLLM host needs at least a model; a host that is "
                               "not a vLLM host has no vllm key at all)"]


def test_hosts_without_vllm_data_are_left_out_not_refused() -> None:
    specs = parse_inventory([("gpu-01", {"model": M}, None), ("db-01", None, {"version": "0.32.0"}),
                             ("lb-01", None, None)])
    assert list(specs) == ["gpu-01"]
    assert not is_vllm_host(None) and is_vllm_host({"model": M})


def test_several_hosts_reported_at_once() -> None:
    good = {"model": M}
    with pytest.raises(SpecError) as e:
        parse_inventory([
            ("gpu-01", {"model": M, "flags": {"max_num_seq": 1}}, None),
            ("gpu-02", good, None),
            ("gpu-03", {"model": M, "accelerator": "tpu"}, None),
            ("gpu-04", {}, None),
            ("db-01", None, None),
        ])
    lines = e.value.problems
    assert len(lines) == 3
    assert lines[0].startswith("gpu-01: vllm.instances[default].flags.max_num_seq: ")
    assert lines[1].startswith("gpu-03: vllm.accelerator: ")
    assert lines[2].startswith("gpu-04: vllm: empty")
    assert not any(line.startswith("gpu-02") for line in lines)


def test_several_problems_of_one_host_reported_at_once() -> None:
    lines = problems_of({"model": M, "version": "latest", "accelerator": "tpu", "keep_releases": 0})
    fields = sorted(line.split(": ", 2)[1] for line in lines)
    assert fields == ["vllm.accelerator", "vllm.keep_releases", "vllm.version"]


def test_good_inventory_returns_one_spec_per_host() -> None:
    specs = parse_inventory([("a", {"model": M}, None), ("b", {"model": M, "accelerator": "cpu"}, None)])
    assert list(specs) == ["a", "b"]
    assert all(isinstance(s, HostSpec) for s in specs.values())
    assert specs["b"].accelerator == "cpu"


# --- defaults and merging -------------------------------------------------------------------------------
def test_deep_merge_host_wins_and_nested_dicts_merge() -> None:
    base = {"version": "0.33.0", "flags": {"max_num_seqs": 128, "gpu_memory_utilization": 0.85},
            "env": {"A": "1"}, "instances": [{"name": "x"}]}
    over = {"version": "0.32.0", "flags": {"max_num_seqs": 64}, "instances": [{"name": "y"}]}
    before = copy.deepcopy(base), copy.deepcopy(over)
    assert deep_merge(base, over) == {
        "version": "0.32.0",
        "flags": {"max_num_seqs": 64, "gpu_memory_utilization": 0.85},
        "env": {"A": "1"},
        "instances": [{"name": "y"}],  # lists are replaced, not merged
    }
    assert (base, over) == before, "deep_merge must not modify its inputs"


def test_deep_merge_scalar_replaces_mapping_and_back() -> None:
    assert deep_merge({"a": {"b": 1}}, {"a": 2}) == {"a": 2}
    assert deep_merge({"a": 2}, {"a": {"b": 1}}) == {"a": {"b": 1}}
    assert deep_merge({}, {"a": {"b": {"c": 1}}}) == {"a": {"b": {"c": 1}}}
    nested = deep_merge({"a": {"b": {"c": 1, "d": 2}}}, {"a": {"b": {"c": 3}}})
    assert nested == {"a": {"b": {"c": 3, "d": 2}}}


def test_defaults_under_host_data() -> None:
    defaults = {"version": "0.33.0", "install_source": "registry",
                "flags": {"max_num_seqs": 128, "gpu_memory_utilization": 0.85}}
    frozen = copy.deepcopy(defaults)
    spec = parse_host(HOST, {"model": M, "flags": {"max_num_seqs": 64}, "install_source": "cache"}, defaults)
    assert spec.version == "0.33.0"
    assert spec.install_source == "cache"
    flags = spec.instances[0].flags
    assert flags.max_num_seqs == 64
    assert flags.gpu_memory_utilization == 0.85
    assert defaults == frozen, "parse_host must not modify the group defaults"


def test_defaults_validated_as_well() -> None:
    lines = problems_of({"model": M}, {"flags": {"swap_space": 4}})
    assert lines == [f"{HOST}: vllm.instances[default].flags.swap_space: removed in vLLM 0.18 (no "
                     "replacement flag); delete it from the inventory. For CPU offload see "
                     "kv-offloading-size or cpu-offload-gb in extra_args"]


def test_default_flags_apply_to_every_instance() -> None:
    spec = parse_host(HOST, {"instances": [{"name": "a", "model": M}, {"name": "b", "model": M,
                                                                        "flags": {"port": 8001}}]},
                      {"flags": {"max_num_seqs": 128}})
    assert [i.flags.max_num_seqs for i in spec.instances] == [128, 128]


# --- the one-instance shorthand -------------------------------------------------------------------------
def test_shorthand_is_one_default_instance() -> None:
    spec = parse_host(HOST, {"version": "0.33.0", "model": M, "gpus": 2, "flags": {"port": 8100},
                             "env": {"VLLM_LOGGING_LEVEL": "INFO"}})
    assert spec.version == "0.33.0"
    assert len(spec.instances) == 1
    inst = spec.instances[0]
    assert inst.name == "default"
    assert inst.model.name == "qwen" and inst.model.path == "/srv/models/qwen"
    assert inst.gpus == 2
    assert inst.flags.port == 8100
    assert inst.env == {"VLLM_LOGGING_LEVEL": "INFO"}
    assert inst.api_key_env == "VLLM_API_KEY"
    assert inst.hf_token_env is None
    assert inst.port_protected_elsewhere is False
    assert inst.cpu_kvcache_gib == 1


def test_shorthand_equals_the_instances_form() -> None:
    short = parse_host(HOST, {"model": M, "flags": {"max_num_seqs": 32}, "name": "chat"})
    full = parse_host(HOST, {"instances": [{"name": "chat", "model": M, "flags": {"max_num_seqs": 32}}]})
    assert short == full


def test_host_defaults() -> None:
    spec = parse_host(HOST, {"model": M})
    assert (spec.version, spec.accelerator, spec.variant, spec.install_source, spec.keep_releases,
            spec.ready_timeout_s) == ("0.32.0", "cuda", None, "cache", 3, 600)


@pytest.mark.parametrize("data", [
    {"model": {"name": "qwen", "hf_repo": "Qwen/Qwen3-8B", "revision": "abc123"}, "hf_token_env": "HF_TOKEN"},
    {"model": {"name": "qwen", "host_path": "/data/models/qwen"}},
    {"model": M, "version": "0.32.0.post1", "accelerator": "cpu", "cpu_kvcache_gib": 16},
    {"model": M, "env": {"VLLM_LOGGING_LEVEL": "DEBUG", "HTTPS_PROXY": "http://proxy:3128"}},
    {"model": M, "api_key_env": "FLEET_PROD_VLLM_KEY", "flags": {"host": "0.0.0.0"}},
    {"model": M, "flags": {"max_num_batched_tokens": 2048, "max_model_len": 8192}},
    {"instances": [{"name": "chat", "model": M, "gpus": [0, 1]},
                   {"name": "embed-2", "model": M, "gpus": [2], "flags": {"port": 8001}}]},
], ids=["hf-repo", "host-path", "cpu-post-release", "plain-env", "custom-key-env", "chunked-default", "two"])
def test_good_hosts_accepted(data: dict) -> None:
    assert isinstance(parse_host(HOST, data), HostSpec)


def test_model_beside_instances_is_a_default_they_inherit() -> None:
    spec = parse_host(HOST, {"model": M,
                             "instances": [{"name": "a"}, {"name": "b", "flags": {"port": 8001}}]})
    assert [i.model.name for i in spec.instances] == ["qwen", "qwen"]


def test_typo_outside_flags_suggests_the_closest_name() -> None:
    lines = problems_of({"model": M, "api_key_evn": "X"})
    assert "api_key_env" in lines[0]


# --- strict types (docs/inventory.md#types) ---------------------------------------------------------------
def test_a_type_refusal_names_the_value_its_type_and_what_to_write() -> None:
    assert problems_of({"model": M, "flags": {"port": "8000"}}) == [
        f"{HOST}: vllm.instances[default].flags.port: '8000' (str) is not an integer; write 8000"]


def test_tuples_are_accepted_for_every_list_field_and_stored_as_lists() -> None:
    spec = parse_host(HOST, {"instances": ({"name": "a", "model": M, "gpus": (0, 1)},),
                             "cluster": {"name": "big", "nodes": ("gpu-07", "gpu-08")}})
    assert spec.instances[0].gpus == [0, 1]
    assert spec.cluster is not None and spec.cluster.nodes == ["gpu-07", "gpu-08"]
    assert isinstance(spec.instances, list)


def test_an_int_is_accepted_for_a_float() -> None:
    flags = parse_host(HOST, {"model": M, "flags": {"gpu_memory_utilization": 1}}).instances[0].flags
    assert flags.gpu_memory_utilization == 1.0 and isinstance(flags.gpu_memory_utilization, float)


def test_nested_plain_dicts_are_accepted() -> None:
    spec = parse_host(HOST, {"model": {"name": "q", "hf_repo": "a/b"}, "flags": {"max_num_seqs": 8},
                             "env": {"A": "1"}, "cluster": {"name": "big", "nodes": ["gpu-07", "gpu-08"]}})
    assert spec.instances[0].model.hf_repo == "a/b" and spec.instances[0].flags.max_num_seqs == 8


def test_a_path_object_is_not_a_string_but_the_message_says_what_to_write() -> None:
    lines = problems_of({"model": {"name": "q", "path": PurePosixPath("/srv/q")}})
    assert lines == [f"{HOST}: vllm.instances[default].model.path: PurePosixPath('/srv/q') (PurePosixPath) "
                     "is not a string; write '/srv/q'"]


def test_a_type_refusal_never_echoes_a_secret_looking_value() -> None:
    lines = problems_of({"model": M, "env": {"DB_PASSWORD": 987654321}})
    assert lines == [f"{HOST}: vllm.instances[default].env.DB_PASSWORD: the value (int) is not a string"]


def test_union_members_that_refused_the_type_are_left_out() -> None:
    # gpus is a count or a list: a list with one bad index is about that index, not "not an integer"
    assert problems_of({"model": M, "gpus": [0, 99]}) == [
        f"{HOST}: vllm.instances[default].gpus[1]: Input should be less than or equal to 63"]
    assert problems_of({"model": M, "gpus": "two"}) == [
        f"{HOST}: vllm.instances[default].gpus: 'two' (str) is not an integer or a list"]


def test_vllm_data_that_is_not_a_dict_is_refused() -> None:
    assert problems_of(["model"]) == [f"{HOST}: vllm: ['model'] (list) is not a dict"]  # type: ignore[arg-type]


# --- field paths and unknown keys -------------------------------------------------------------------------
def test_instances_are_named_in_paths_unless_the_name_cannot_say_which() -> None:
    assert instance_labels(["chat", "default", "Big_One", 7, None, "a", "a"]) == [
        "chat", "default", "2", "3", "4", "5", "6"]


def test_every_unknown_key_is_reported_at_once_with_the_allowed_keys() -> None:
    lines = problems_of({"model": M, "vlm": 1, "frobnicate": 2})
    assert [line.split(": ", 2)[1] for line in lines] == ["vllm.vlm", "vllm.frobnicate"]
    assert all("host keys: version" in line and "instance keys: name, model" in line for line in lines)


@pytest.mark.parametrize("data", [
    {"model": M, "gpu": 1},
    {"model": M, "zzz": 1},
    {"instances": [{"name": "chat", "model": M, "zzz": 1}]},
    {"model": {"name": "q", "path": "/srv/q", "zzz": 1}},
    {"model": M, "cluster": {"name": "big", "nodes": ["a", "b"], "zzz": 1}},
], ids=["host-close", "host-none-close", "instance", "model", "cluster"])
def test_every_not_a_known_key_line_lists_close_matches_or_allowed_keys(data: dict) -> None:
    lines = [line for line in problems_of(data) if "not a known key" in line]
    assert lines and all("did you mean" in line or "allowed" in line or "host keys" in line for line in lines)
