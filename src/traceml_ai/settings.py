"""TraceML settings (DESIGN §6).

Precedence: command-line flag > ``TRACEML_<NAME>`` environment variable > ``traceml.yaml`` (searched
from the working directory upwards) > default. A bad value raises :class:`SettingsError` whose message
is one line naming the key, where the value came from (flag, env or ``file:line``) and what is
accepted. This module imports nothing else of ours, so every layer may receive a ``Settings``.

:class:`Settings` is a plain dataclass; pydantic validates the values given (flags, environment,
file) through a model made from its fields on first use. Values the model would return unchanged
(a text for a text setting, a bool, a list of texts for ``roots``) skip it, so a command given no
setting or only such values (``traceml runs ls``, ``traceml run --logs-dir DIR``) does not import
pydantic at all: importing pydantic and building the model cost 70-80 ms, a third of
``traceml runs ls``'s start (issue 14, item 1).

Why not pydantic-settings: it would add 60-140 ms to every command given any setting, and it merges
its sources before it validates, while the one-line error must name the source of the bad value; so
the environment layer is read here (names matched case-insensitively, values given to the model as
the strings they are, as pydantic-settings would), and PyYAML is imported only when a
``traceml.yaml`` exists.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel

CONFIG_FILE = "traceml.yaml"
ENV_PREFIX = "TRACEML_"


class SettingsError(ValueError):
    """A setting has a bad value; ``str(err)`` is one line with the key, source and accepted values."""


def _setting(default: Any, description: str, **limits: Any) -> Any:
    """A field with its description and the pydantic limits of its value (``gt``, ``ge``, ``le``,
    ``allow_inf_nan``)."""
    return dataclasses.field(default=default, metadata={"description": description, "limits": limits})


_NUMBER = {"gt": 0, "allow_inf_nan": False}


@dataclasses.dataclass
class Settings:
    """Every TraceML setting with its default. Units are in the names (seconds, MB). Build it with
    :func:`load_settings` (flags, environment, file); ``Settings(**values)`` validates the values
    that differ from the defaults (raises ``pydantic.ValidationError``)."""

    logs_dir: str = _setting("traceml/runs", "where `traceml run` and `traceml_ai.Run` create run folders")
    run_name: str | None = _setting(None, "name of the run `traceml run` creates")
    roots: list[str] = dataclasses.field(
        default_factory=lambda: ["traceml/runs"],
        metadata={"description": "runs folders to read; several separated by ':'", "limits": {}},
    )
    refresh_interval_seconds: float = _setting(5.0, "how often running runs are polled", **_NUMBER)
    stale_after_seconds: float = _setting(60.0, "heartbeat age after which a running run is stale", **_NUMBER)
    max_points_per_series: int = _setting(5000, "downsampling target per plotted series", ge=10, le=1_000_000)
    max_metrics_file_mb: float = _setting(64.0, "metrics.jsonl is read up to this many MB", **_NUMBER)
    cache_dir: str | None = _setting(
        None, "viewer cache folder (default: traceml/.cache for the root traceml/runs, else "
              "$XDG_CACHE_HOME/traceml/<root>-<hash of the roots>)"
    )
    ui_host: str = _setting("127.0.0.1", "address the viewer binds")
    ui_port: int = _setting(0, "viewer port; 0 picks a free one", ge=0, le=65535)
    interval: float = _setting(1.0, "telemetry sampling interval, seconds", **_NUMBER)
    exporter: str | None = _setting(None, "telemetry exporter of `traceml run`/`serve`: jsonl, otlp or module:factory")
    export_streams: str = _setting(
        "step_time", "exported streams, comma separated: step_time, step_memory, process, system, all"
    )
    exporter_hostname: bool = _setting(False, "keep the hostname field in exported records")

    def __post_init__(self) -> None:
        given = {name: value for name, value in ((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))
                 if type(value) is not type(_DEFAULTS[name]) or value != _DEFAULTS[name]}
        if _needs_model(given):  # the defaults are valid (a test checks), and so are plain values
            valid = _model().model_validate(given)
            for name in given:
                setattr(self, name, getattr(valid, name))


_DEFAULTS: dict[str, Any] = {
    f.name: f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    for f in dataclasses.fields(Settings)
}
SETTING_NAMES: tuple[str, ...] = tuple(_DEFAULTS)
"""Every setting's name, in the order of :class:`Settings`."""


def _needs_model(values: Mapping[str, Any]) -> bool:
    """False when every value is one the model would return unchanged: a known setting's text for a
    text setting (``str``, ``str | None``), a bool for ``exporter_hostname``, a list of texts for
    ``roots``. Numbers, environment text for a number or list, and unknown keys need the model."""
    for name, value in values.items():
        kind = _KINDS.get(name)
        if kind == "str" and type(value) is str:
            continue
        if kind == "bool" and type(value) is bool:
            continue
        if kind == "list[str]" and type(value) is list and all(type(v) is str for v in value):
            continue
        return True
    return False


_KINDS: dict[str, str] = {
    f.name: {"str | None": "str"}.get(str(f.type), str(f.type)) for f in dataclasses.fields(Settings)
}


def describe(name: str) -> str:
    """The description of setting ``name`` ('' for an unknown name)."""
    for f in dataclasses.fields(Settings):
        if f.name == name:
            return str(f.metadata["description"])
    return ""


def _split_roots(v: Any) -> Any:
    if isinstance(v, str):
        return [p for p in v.split(os.pathsep) if p]
    return v


@functools.cache
def _model() -> type[BaseModel]:
    """The pydantic model that validates setting values: the fields of :class:`Settings` with their
    limits; unknown keys are errors; ``roots`` also takes one string of folders separated by ':'.
    Built with pydantic plugins off (their entry-point scan costs 30 ms), the switch restored."""
    from typing import get_type_hints

    from pydantic import ConfigDict, Field, create_model, field_validator

    hints = get_type_hints(Settings)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        default = ({"default_factory": f.default_factory} if f.default_factory is not dataclasses.MISSING
                   else {"default": f.default})
        fields[f.name] = (hints[f.name], Field(**default, description=f.metadata["description"],
                                               **f.metadata["limits"]))
    plugins_were = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
    os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
    try:
        return create_model(
            "SettingsValues",
            __config__=ConfigDict(extra="forbid", validate_default=True),
            __validators__={"split_roots": field_validator("roots", mode="before")(_split_roots)},
            **fields,
        )
    finally:
        if plugins_were is None:
            del os.environ["PYDANTIC_DISABLE_PLUGINS"]
        else:
            os.environ["PYDANTIC_DISABLE_PLUGINS"] = plugins_were


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
    return {name: lowered[prefix + name] for name in SETTING_NAMES if prefix + name in lowered}


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
    if not _needs_model(init):
        return Settings(**init)
    from pydantic import ValidationError

    try:
        valid = _model().model_validate(init)
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
            known = ", ".join(SETTING_NAMES)
            raise SettingsError(f"unknown setting {key!r} ({source}); known settings: {known}") from None
        description = describe(key)
        what = f" ({description})" if description else ""
        raise SettingsError(f"bad value for {key}{what} from {source}: {first['msg']}") from None
    return Settings(**{name: getattr(valid, name) for name in SETTING_NAMES})
