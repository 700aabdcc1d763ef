"""Tolerant parsers of run.json, params.yaml and metrics.json (003 seed, "Writing runs" §3, §4, §7)."""

from __future__ import annotations

import json
import math
from datetime import date, datetime
from typing import Any

import pytest
import yaml

from traceml_ai.runs import readers
from traceml_ai.runs.readers import (
    MAX_YAML_NODES,
    RunFileError,
    check_size,
    load_json,
    parse_metrics_json,
    parse_params_yaml,
    parse_run_json,
)

RUN_JSON = {
    "schema_version": 1,
    "id": "20260929-140000_baseline_a3f9",
    "name": "baseline",
    "group": "lr-sweep",
    "tags": ["cv", "sweep"],
    "notes": "first try",
    "status": "completed",
    "started_at": "2026-09-29T14:00:00Z",
    "ended_at": "2026-09-29T15:00:00Z",
    "heartbeat_at": "2026-09-29T15:00:00Z",
    "duration_s": 3600,
    "exit": {"code": 0, "signal": None},
    "host": {"hostname": "gpu-1"},
}


def _run_json(**changes: Any) -> bytes:
    return json.dumps({**RUN_JSON, **changes}).encode()


def _params(text: str) -> dict[str, Any]:
    values, warnings = parse_params_yaml(text.encode())
    assert warnings == []
    return values


# -- run.json ----------------------------------------------------------------------------------


def test_run_json_typed_fields() -> None:
    run, warnings = parse_run_json(_run_json())
    assert warnings == []
    assert (run.schema_version, run.name, run.group, run.status) == (1, "baseline", "lr-sweep", "completed")
    assert run.tags == ["cv", "sweep"]
    assert run.notes == "first try"
    assert run.started_at == "2026-09-29T14:00:00Z"
    assert run.ended_at == "2026-09-29T15:00:00Z"
    assert run.heartbeat_at == "2026-09-29T15:00:00Z"
    assert run.heartbeat_s == datetime.fromisoformat("2026-09-29T15:00:00+00:00").timestamp()
    assert run.duration_s == 3600.0
    assert run.exit == {"code": 0, "signal": None}
    assert run.raw["host"] == {"hostname": "gpu-1"}  # optional fields stay available to the inspector


def test_run_json_wrong_typed_fields_are_dropped_with_a_warning() -> None:
    run, warnings = parse_run_json(_run_json(name=42, group=["a"], duration_s="long", tags="cv", exit="ok"))
    assert (run.name, run.group, run.duration_s, run.exit) == (None, None, None, None)
    assert run.tags == []
    assert run.status == "completed"  # the good fields are still read
    text = "\n".join(warnings)
    for field in ("name", "group", "duration_s", "tags", "exit"):
        assert f"run.json: {field} should be" in text
    assert len(warnings) == 5


def test_run_json_unreadable_heartbeat_is_not_invented() -> None:
    run, warnings = parse_run_json(_run_json(status="running", heartbeat_at="yesterday"))
    assert run.heartbeat_at is None and run.heartbeat_s is None
    assert warnings == ["run.json: heartbeat_at 'yesterday' is not an ISO-8601 time; ignored"]


def test_run_json_newer_schema_version_is_read_with_a_warning() -> None:
    run, warnings = parse_run_json(_run_json(schema_version=2))
    assert run.schema_version == 2
    assert run.name == "baseline"
    assert len(warnings) == 1 and "schema_version 2 is newer" in warnings[0]


def test_run_json_byte_that_is_not_utf8_gives_a_warning_and_is_still_parsed() -> None:
    data = _run_json(notes="caf\u00e9").replace(b"caf\\u00e9", b"caf\xe9")
    assert b"\xe9" in data
    run, warnings = parse_run_json(data)
    assert run.name == "baseline"
    assert run.notes == "caf\ufffd"
    assert len(warnings) == 1
    assert "byte 0xe9" in warnings[0] and "is not UTF-8" in warnings[0]


@pytest.mark.parametrize(("data", "message"), [
    (b"{not json", "run.json: not valid JSON"),
    (b"[1, 2]", "run.json: expected a JSON object, got list"),
])
def test_run_json_unusable_file_is_one_error_line(data: bytes, message: str) -> None:
    with pytest.raises(RunFileError) as err:
        parse_run_json(data)
    assert str(err.value).startswith(message)
    assert "\n" not in str(err.value)


def test_load_json_accepts_python_nan_tokens() -> None:
    value, warnings = load_json(b'{"a": NaN, "b": Infinity, "c": -Infinity}')
    assert warnings == []
    assert math.isnan(value["a"]) and value["b"] == math.inf and value["c"] == -math.inf


# -- params.yaml -------------------------------------------------------------------------------


def test_params_nested_mappings_become_dotted_keys() -> None:
    values = _params("optim:\n  lr: 0.0003\n  name: adamw\nmodel:\n  enc:\n    depth: 4\n")
    assert values == {"optim.lr": 0.0003, "optim.name": "adamw", "model.enc.depth": 4}


def test_params_lists_become_compact_json_strings() -> None:
    values = _params("layers: [1, 2]\nnames:\n  - a\n  - b\nempty: []\nmixed: [1, x, null, 0.5]\n")
    assert values == {"layers": "[1,2]", "names": '["a","b"]', "empty": "[]", "mixed": '[1,"x",null,0.5]'}


def test_params_booleans_null_and_dates() -> None:
    values = _params("amp: true\nfreeze: false\nseed: null\nday: 2024-01-01\n")
    assert values == {"amp": True, "freeze": False, "seed": None, "day": "2024-01-01"}
    assert values["amp"] is True and values["freeze"] is False


@pytest.mark.parametrize("text", ["lr: 1e-05\n", "opt:\n  lr: 1e-05\n"])
def test_params_float_without_a_dot_is_a_float(text: str) -> None:
    (value,) = _params(text).values()
    assert value == 1e-05 and isinstance(value, float)


def test_params_flat_file_written_by_a_logger() -> None:
    text = 'data.batch_size: 64\nmodel.hidden: 128\noptim.lr: 0.0003\noptim.name: "adamw"\n'
    assert _params(text) == {"data.batch_size": 64, "model.hidden": 128, "optim.lr": 0.0003, "optim.name": "adamw"}


def test_params_empty_file_has_no_params() -> None:
    assert _params("") == {}
    assert _params("# nothing yet\n") == {}


def test_params_billion_laughs_is_refused_quickly() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    with pytest.raises(RunFileError) as err:
        parse_params_yaml("\n".join(lines).encode())
    assert f"aliases expand to more than {MAX_YAML_NODES:,} values" in str(err.value)
    assert str(err.value).startswith("params.yaml: ")


def test_params_recursive_alias_is_an_error() -> None:
    with pytest.raises(RunFileError) as err:
        parse_params_yaml(b"a: &loop\n  self: *loop\n")
    assert "recursive alias" in str(err.value)


@pytest.mark.parametrize(("text", "message"), [
    ("- 1\n- 2\n", "expected a mapping of params, got list"),
    ("just a sentence\n", "expected a mapping of params, got str"),
    ("a: [1, 2\n", "not valid YAML"),
])
def test_params_that_are_not_a_mapping_are_an_error(text: str, message: str) -> None:
    with pytest.raises(RunFileError) as err:
        parse_params_yaml(text.encode())
    assert message in str(err.value)


def test_params_byte_that_is_not_utf8_gives_a_warning() -> None:
    values, warnings = parse_params_yaml(b'name: "caf\xe9"\nlr: 0.1\n')
    assert values == {"name": "caf\ufffd", "lr": 0.1}
    assert len(warnings) == 1 and "byte 0xe9" in warnings[0]


def _reference_scalar(v: Any) -> Any:
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    if isinstance(v, list):
        return json.dumps(v, separators=(",", ":"), ensure_ascii=False, default=str)
    if v == {}:
        return "{}"  # an empty mapping is a value, shown as text
    if type(v) is int and not -(1 << 63) <= v < (1 << 63):
        return str(v)  # an integer beyond 64 bits is kept exactly, as text (issue 12 point 5)
    return v


def _reference_flatten(obj: dict[Any, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in obj.items():
        if isinstance(v, dict) and v:
            out.update(_reference_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = _reference_scalar(v)
    return out


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal, with NaN equal to NaN and bool never equal to int."""
    if list(a) != list(b):
        return False
    for x, y in zip(a.values(), b.values(), strict=True):
        if type(x) is not type(y):
            return False
        if isinstance(x, float) and math.isnan(x) and math.isnan(y):
            continue
        if x != y:
            return False
    return True


TRICKY_VALUES = [
    "0", "1", "42", "-3", "-0", "010", "007", "08", "123456789012345678901234567890",
    "0.1", "-0.5", "1.0", "1.0e-05", "1.0e+05", "3.", ".5", "1e-05", "1.5E-3", "00.5",
    "adamw", "resnet-50", "a_b", "None", "nan", "inf", "y", "n", "e5",
    "yes", "no", "on", "off", "Yes", "NO", "True", "FALSE", "true", "false", "null", "NULL", "Null", "~",
    ".inf", "-.inf", ".nan", "2024-01-01", "2024-01-01 10:00:00", "12:30", "0x1f", "1_000",
    '""', '"a b"', '"a: b"', '"key: value, more"', '"über"', '"精度 ✓"', '"true"', '"1"', '"null"',
    '"# not a comment"', '"tab\\there"', '"q\\"uote"', "'single'", "adam # comment", "[1, 2]", "{}",
    '"\x7f"', '"\x85"', '"a\u2028b"', '"\xa0"',
    r'"a\/b"', r'"a\nb"', r'"\\"', r'"\b\f\r\t"', r'"x\\n"', r'"\u00e9"', r'"\x41"', r'"\e"',
]

TRICKY_KEYS = [
    "lr", "optim.lr", "train/bs", "_private", "a-b", '"with space"', '"a: b"', '"über.lr"', '"1"',
    "yes", "on", "true", "Null", "y", '"on"', '"\x85"', '"a\u2028b"',
]


def _both_ways(text: str) -> tuple[dict[str, Any] | str, dict[str, Any] | str]:
    """(parse_params_yaml result, flattened PyYAML result); an error as the string "error"."""
    try:
        fast: dict[str, Any] | str = parse_params_yaml(text.encode())[0]
    except RunFileError:
        fast = "error"
    try:
        doc = yaml.load(text, Loader=readers._params_loader())
        slow: dict[str, Any] | str = _reference_flatten(doc) if isinstance(doc, dict) else "error"
    except yaml.YAMLError:
        slow = "error"
    return fast, slow


@pytest.mark.parametrize("value", TRICKY_VALUES)
def test_params_fast_path_and_pyyaml_agree_on_each_value(value: str) -> None:
    for text in (f"k: {value}\n", f"k: {value}\r\n", f"a.b: 1\nk: {value}\nz: x\n"):
        fast, slow = _both_ways(text)
        if isinstance(fast, str) or isinstance(slow, str):
            assert fast == slow, (text, fast, slow)
        else:
            assert _same(fast, slow), (text, fast, slow)


@pytest.mark.parametrize("key", TRICKY_KEYS)
def test_params_fast_path_and_pyyaml_agree_on_each_key(key: str) -> None:
    for text in (f"{key}: 1\n", f"{key}: adamw\nother: 0.5\n", f"{key}: 1\n{key}: 2\n"):
        fast, slow = _both_ways(text)
        if isinstance(fast, str) or isinstance(slow, str):
            assert fast == slow, (text, fast, slow)
        else:
            assert _same(fast, slow), (text, fast, slow)


def test_params_fast_path_and_pyyaml_agree_on_a_whole_file() -> None:
    safe = [v for v in TRICKY_VALUES if _both_ways(f"k: {v}\n")[0] != "error"]
    text = "".join(f"k{i}: {v}\n" for i, v in enumerate(safe))
    fast, slow = _both_ways(text)
    assert isinstance(fast, dict) and isinstance(slow, dict)
    assert _same(fast, slow)
    assert len(fast) == len(safe)


def test_params_fast_path_is_taken_for_plain_logger_output() -> None:
    # The agreement tests above are only meaningful if both paths run: these lines take the fast one.
    text = 'optim.lr: 0.0003\nseed: -3\nname: "a: b ü"\nopt: adamw\namp: true\n"with space": null\n'
    assert readers._fast_params(text) is not None
    assert readers._fast_params("lr: 1e-05\n") is None
    assert readers._fast_params("amp: yes\n") is None


NESTED_FILES = [
    "data:\n  dataset: \"cifar10\"\n  augment: [\"flip\", \"crop\"]\nmodel:\n  depth: 18\n  drop: 0.2\nseed: 1\n",
    "a:\n  b:\n    c: 1\n    d: [1, 2.5, true, null, \"x, y]\"]\n  e: adamw\nf: []\n",
    "a:\nb: 1\n",  # 'a:' with nothing under it is null
    "a:\n    b: 1\n",  # four spaces
    "a:\n  b: 1\n c: 2\n",  # odd indent
    "a:\n  b: 1\na:\n  c: 2\n",  # duplicate key
    "a:\n  yes: 1\n",
    "a:\n  b: [1, 2\n",
    "a:\n  b: [00.5]\n",
    "a:\n  b: [1e5]\n",
    "a:\n  b: [adam]\n",
    "a:\n  b:\n",
    "a:\n\tb: 1\n",
    "a:\n  b: 1\n  # comment\n",
    "\"quoted key\":\n  \"k: v\": [\"\\u00e9\"]\r\n",
    "a:\n  b:\n    c:\n      d:\n        e:\n          f:\n            g:\n              h:\n                i: 1\n",
]


@pytest.mark.parametrize("text", NESTED_FILES)
def test_params_fast_path_and_pyyaml_agree_on_nested_files(text: str) -> None:
    fast, slow = _both_ways(text)
    if isinstance(fast, str) or isinstance(slow, str):
        assert fast == slow, (text, fast, slow)
    else:
        assert _same(fast, slow), (text, fast, slow)


@pytest.mark.parametrize("value", TRICKY_VALUES)
def test_params_fast_path_and_pyyaml_agree_on_each_value_nested_and_in_a_list(value: str) -> None:
    for line in (f"a:\n  b:\n    k: {value}\n", f"a:\n  k: [{value}]\n", f"a:\n  k: [1, {value}]\n"):
        fast, slow = _both_ways(line)
        if isinstance(fast, str) or isinstance(slow, str):
            assert fast == slow, (line, fast, slow)
        else:
            assert _same(fast, slow), (line, fast, slow)


def test_params_fast_path_reads_nested_hand_written_files() -> None:
    # A legacy params.yaml as people write them by hand takes the fast path (no PyYAML import in
    # traceml runs ls), and the agreement test above covers what it returns.
    assert readers._fast_params(NESTED_FILES[0]) == {
        "data.dataset": "cifar10", "data.augment": '["flip","crop"]', "model.depth": 18, "model.drop": 0.2,
        "seed": 1,
    }
    assert readers._fast_params(NESTED_FILES[2]) is None


# -- metrics.json ------------------------------------------------------------------------------

METRICS_JSON = {
    "schema_version": 1,
    "updated_at": "2026-09-29T14:10:00Z",
    "step": 19,
    "epoch": 19,
    "last": {"train/loss": 0.21, "val/auc": 0.88, "lr": 1e-06, "val/loss": None},
    "best": {"val/auc": {"value": 0.894, "step": 14, "epoch": 14, "mode": "max"}},
    "summary": {"test/auc": 0.881, "verdict": "good", "confusion": [[1, 0], [0, 1]]},
}


def test_metrics_json_last_best_summary() -> None:
    m, warnings = parse_metrics_json(json.dumps(METRICS_JSON).encode())
    assert warnings == []
    assert (m.step, m.epoch, m.updated_at) == (19, 19, "2026-09-29T14:10:00Z")
    assert m.last == {"train/loss": 0.21, "val/auc": 0.88, "lr": 1e-06, "val/loss": None}
    best = m.best["val/auc"]
    assert (best.value, best.step, best.epoch, best.mode) == (0.894, 14, 14, "max")
    assert m.summary == {"test/auc": 0.881, "verdict": "good", "confusion": "[[1,0],[0,1]]"}


def test_metrics_json_non_numeric_values_are_ignored_with_one_warning() -> None:
    doc = {
        **METRICS_JSON,
        "last": {"train/loss": 0.2, "note": "n/a", "hist": [1, 2], "flag": True},
        "best": {"val/auc": {"value": "high", "mode": "max"}, "val/loss": 0.3},
    }
    m, warnings = parse_metrics_json(json.dumps(doc).encode())
    assert m.last == {"train/loss": 0.2}
    assert m.best == {}
    assert len(warnings) == 1
    assert warnings[0].startswith("metrics.json: 5 non-numeric metric value(s) ignored (last.note, last.hist, ")


def test_metrics_json_nan_tokens_are_accepted() -> None:
    data = b'{"step": 3, "last": {"train/loss": NaN, "x": Infinity}, "best": {"a": {"value": -Infinity}}}'
    m, warnings = parse_metrics_json(data)
    assert warnings == []
    assert math.isnan(m.last["train/loss"])  # type: ignore[arg-type]
    assert m.last["x"] == math.inf
    assert m.best["a"].value == -math.inf and m.best["a"].mode is None


def test_metrics_json_not_an_object_is_an_error() -> None:
    with pytest.raises(RunFileError, match=r"^metrics\.json: expected a JSON object, got list$"):
        parse_metrics_json(b"[]")


def test_small_files_above_16_mb_are_not_parsed() -> None:
    check_size("run.json", 16 * 1024 * 1024)  # exactly at the limit: fine
    with pytest.raises(RunFileError) as err:
        check_size("config.json", 16 * 1024 * 1024 + 1)
    assert str(err.value) == "config.json: 16.8 MB is above the 16 MB limit; not parsed"


def test_short_texts_that_repeat_across_runs_are_kept_once() -> None:
    # A viewer keeps 10,000 runs: a status, group, tag or param text they share is one object.
    first, _ = parse_params_yaml(b'optim.name: "adam"\nmodel.name: resnet18\n')
    second, _ = parse_params_yaml(b'optim.name: "adam"\nmodel.name: resnet18\n')
    assert first["optim.name"] is second["optim.name"] and first["model.name"] is second["model.name"]
    a, _ = parse_run_json(_run_json(group="sweep", tags=["cv"]))
    b, _ = parse_run_json(_run_json(group="sweep", tags=["cv"]))
    assert a.group is b.group and a.tags[0] is b.tags[0] and a.status is b.status
    long_text = "x" * 100
    c, _ = parse_params_yaml(f'note: "{long_text}"\n'.encode())
    d, _ = parse_params_yaml(f'note: "{long_text}"\n'.encode())
    assert c["note"] == d["note"]  # long texts are not worth a shared copy
