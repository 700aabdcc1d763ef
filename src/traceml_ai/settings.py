"""TraceML settings (DESIGN §6).

Precedence: command-line flag > ``TRACEML_<NAME>`` environment variable > ``traceml.yaml`` (searched
from the working directory upwards) > default. A bad value raises :class:`SettingsError` whose message
is one line naming the key, where the value came from (flag, env or ``file:line``) and what is
accepted. This module imports nothing else of ours, so every layer may receive a ``Settings``.

The environment layer is read here (names matched case-insensitively, values given to the model
as the strings they are, as pydantic-settings would) on a plain pydantic model: pydantic is
already loaded by the command line, pydantic-settings would add 60-140 ms to every command's start
(issue 14, item 1).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

CONFIG_FILE = "traceml.yaml"
ENV_PREFIX = "TRACEML_"


class SettingsError(ValueError):
    """A setting has a bad value; ``str(err)`` is one line with the key, source and accepted values."""


# pydantic looks for plugins through every installed package's entry points (30 ms here) when a
# model is built; Typer builds its own adapters with plugins off, and so is this model.
_plugins_were = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"


class Settings(BaseModel):
    """Every TraceML setting with its default. Units are in the names (seconds, MB). Build it with
    :func:`load_settings` (flags, environment, file); ``Settings(**values)`` validates only the values."""

    model_config = ConfigDict(extra="forbid", validate_default=True)

    logs_dir: str = Field("traceml/runs", description="where `traceml run` and `traceml_ai.Run` create run folders")
    run_name: str | None = Field(None, description="name of the run `traceml run` creates")
    roots: list[str] = Field(
        default_factory=lambda: ["traceml/runs"], description="runs folders to read; several separated by ':'"
    )
    refresh_interval_seconds: float = Field(
        5.0, gt=0, allow_inf_nan=False, description="how often running runs are polled"
    )
    stale_after_seconds: float = Field(
        60.0, gt=0, allow_inf_nan=False, description="heartbeat age after which a running run is stale"
    )
    max_points_per_series: int = Field(5000, ge=10, le=1_000_000, description="downsampling target per plotted series")
    max_metrics_file_mb: float = Field(
        64.0, gt=0, allow_inf_nan=False, description="metrics.jsonl is read up to this many MB"
    )
    cache_dir: str | None = Field(
        None, description="viewer cache folder (default: traceml/.cache for the root traceml/runs, else "
                          "$XDG_CACHE_HOME/traceml/<root>-<hash of the roots>)"
    )
    ui_host: str = Field("127.0.0.1", description="address the viewer binds")
    ui_port: int = Field(0, ge=0, le=65535, description="viewer port; 0 picks a free one")
    interval: float = Field(
        1.0, gt=0, allow_inf_nan=False, description="telemetry sampling interval, seconds"
    )
    exporter: str | None = Field(
        None, description="telemetry exporter of `traceml run`/`serve`: jsonl, otlp or module:factory"
    )
    export_streams: str = Field(
        "step_time", description="exported streams, comma separated: step_time, step_memory, process, system, all"
    )
    exporter_hostname: bool = Field(False, description="keep the hostname field in exported records")

    @field_validator("roots", mode="before")
    @classmethod
    def _split_roots(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [p for p in v.split(os.pathsep) if p]
        return v


if _plugins_were is None:
    del os.environ["PYDANTIC_DISABLE_PLUGINS"]
else:
    os.environ["PYDANTIC_DISABLE_PLUGINS"] = _plugins_were


def find_config_file(start: str | os.PathLike[str] | None = None) -> Path | None:
    """The nearest ``traceml.yaml`` in ``start`` (default: the working directory) or a parent."""
    here = Path(start or os.getcwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / CONFIG_FILE
        if candidate.is_file():
            return candidate
    return None


def _read_config_file(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """The file's mapping and the line of each key. Raises SettingsError for a broken file."""
    import yaml  # only when there is a file: PyYAML costs 20 ms to import

    try:
        text = path.read_text(encoding="utf-8")
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise SettingsError(f"{path}: cannot read settings ({str(err).splitlines()[0]})") from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict) or not isinstance(node, yaml.MappingNode):
        raise SettingsError(f"{path}: expected a mapping of settings like 'stale_after_seconds: 60'")
    lines = {str(k.value): k.start_mark.line + 1 for k, _ in node.value}
    return {str(k): v for k, v in data.items()}, lines


def environment_values(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``{setting: text}`` for each ``TRACEML_<NAME>`` variable naming a setting (the name matched
    case-insensitively; other ``TRACEML_`` variables, e.g. ``TRACEML_RUN_DIR``, are not settings)."""
    lowered = {k.lower(): v for k, v in (os.environ if environ is None else environ).items()}
    prefix = ENV_PREFIX.lower()
    return {name: lowered[prefix + name] for name in Settings.model_fields if prefix + name in lowered}


def load_settings(
    flags: Mapping[str, Any] | None = None, *, config_file: str | os.PathLike[str] | None = None
) -> Settings:
    """Build the settings from flags (None values are "not given"), environment, file and defaults.

    Raises:
        SettingsError: a bad key or value; the message names its source.
    """
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    path = Path(config_file) if config_file else find_config_file()
    file_values: dict[str, Any] = {}
    file_lines: dict[str, int] = {}
    if path is not None:
        file_values, file_lines = _read_config_file(path)
    env_values = environment_values()
    env_names = set(env_values)
    # Lowest precedence first: the file, then environment, then flags.
    init = {k: v for k, v in file_values.items() if k not in env_names}
    init.update(env_values)
    init.update(given)
    try:
        return Settings(**init)
    except ValidationError as err:
        first = err.errors()[0]
        key = str(first["loc"][0]) if first["loc"] else "?"
        if key in given:
            source = f"flag --{key.replace('_', '-')}"
        elif key in env_names:
            source = f"environment {ENV_PREFIX}{key.upper()}"
        elif key in file_values and path is not None:
            source = f"{path}:{file_lines.get(key, 1)}"
        else:
            source = "default"
        if first["type"] == "extra_forbidden":
            known = ", ".join(Settings.model_fields)
            raise SettingsError(f"unknown setting {key!r} ({source}); known settings: {known}") from None
        field = Settings.model_fields.get(key)
        what = f" ({field.description})" if field is not None and field.description else ""
        raise SettingsError(f"bad value for {key}{what} from {source}: {first['msg']}") from None
