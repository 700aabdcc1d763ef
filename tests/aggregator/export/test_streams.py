"""The ``export_streams`` setting (000 seed, "Stream selection")."""

from __future__ import annotations

import pytest

from traceml_ai.aggregator.export.records import RECORD_STREAMS
from traceml_ai.aggregator.export.streams import DEFAULT_EXPORT_STREAMS, EXPORT_STREAM_NAMES, parse_export_streams
from traceml_ai.settings import Settings

SUPPORTED = "supported names: step_time, step_memory, process, system, all"


def test_the_default_selects_the_step_time_records_only() -> None:
    assert Settings().export_streams == DEFAULT_EXPORT_STREAMS == "step_time"
    assert parse_export_streams(DEFAULT_EXPORT_STREAMS) == ("step_time",)


def test_only_five_names_are_accepted() -> None:
    assert list(EXPORT_STREAM_NAMES) == ["step_time", "step_memory", "process", "system", "all"]


@pytest.mark.parametrize(("value", "streams"), [
    ("step_time", ("step_time",)),
    ("step_memory", ("step_memory",)),
    ("process", ("process",)),
    ("system", ("system", "system_gpu")),
    ("all", RECORD_STREAMS),
])
def test_each_name_selects_its_records(value: str, streams: tuple[str, ...]) -> None:
    assert parse_export_streams(value) == streams


def test_names_are_comma_separated_and_the_selection_comes_in_record_table_order() -> None:
    assert parse_export_streams("system, step_time") == ("step_time", "system", "system_gpu")
    assert parse_export_streams("process,step_memory,process") == ("step_memory", "process")


def test_runtime_environment_and_stdout_stderr_are_reachable_only_through_all() -> None:
    reachable = {s for name, streams in EXPORT_STREAM_NAMES.items() if name != "all" for s in streams}
    assert {"runtime_environment", "stdout_stderr"}.isdisjoint(reachable)
    assert {"runtime_environment", "stdout_stderr"} <= set(parse_export_streams("all"))


@pytest.mark.parametrize("value", ["gpu", "step_time,stdout_stderr", "system_gpu", "STEP_TIME", "step_time,,system"])
def test_an_unknown_name_is_a_value_error_listing_the_supported_names(value: str) -> None:
    with pytest.raises(ValueError, match=SUPPORTED) as info:
        parse_export_streams(value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("value", ["", "  ", ",", " , "])
def test_a_value_that_names_no_stream_is_a_value_error_listing_the_supported_names(value: str) -> None:
    with pytest.raises(ValueError, match=f"names no stream; {SUPPORTED}"):
        parse_export_streams(value)
