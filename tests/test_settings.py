"""Settings (DESIGN §6): the environment layer read without pydantic-settings behaves as it did with it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from traceml_ai.settings import SettingsError, load_settings


def test_environment_values_are_parsed_like_flags_and_names_match_in_any_case(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)  # no traceml.yaml above
    monkeypatch.setenv("TRACEML_STALE_AFTER_SECONDS", "12.5")
    monkeypatch.setenv("traceml_roots", f"a{os.pathsep}b{os.pathsep}")
    monkeypatch.setenv("TRACEML_EXPORTER_HOSTNAME", "yes")
    monkeypatch.setenv("TRACEML_RUN_DIR", "/not/a/setting")  # other TRACEML_ variables are not settings
    st = load_settings()
    assert st.stale_after_seconds == 12.5 and st.roots == ["a", "b"] and st.exporter_hostname is True
    assert load_settings({"stale_after_seconds": 3.0}).stale_after_seconds == 3.0  # a flag beats the environment


def test_a_bad_environment_value_and_an_unknown_file_key_name_their_source(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRACEML_UI_PORT", "70000")
    with pytest.raises(SettingsError, match=r"ui_port .*environment TRACEML_UI_PORT"):
        load_settings()
    monkeypatch.delenv("TRACEML_UI_PORT")
    (tmp_path / "traceml.yaml").write_text("interval: 2\nstale_after: 5\n")
    with pytest.raises(SettingsError, match=r"unknown setting 'stale_after' \(.*traceml.yaml:2\)"):
        load_settings()


def test_building_the_settings_leaves_the_pydantic_plugin_switch_as_it_was() -> None:
    import traceml_ai.settings  # noqa: F401  (imported above; the switch is restored at import)

    assert os.environ.get("PYDANTIC_DISABLE_PLUGINS") in (None, "")


def test_the_defaults_are_what_the_model_validates_them_to() -> None:
    import dataclasses

    from traceml_ai.settings import Settings, _model

    assert _model()().model_dump() == dataclasses.asdict(Settings())


def test_text_values_skip_pydantic_and_numbers_are_still_checked(tmp_path: Path) -> None:
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from traceml_ai.settings import load_settings\n"
        "st = load_settings({'logs_dir': 'out/runs', 'run_name': 'a b', 'exporter_hostname': True})\n"
        "assert (st.logs_dir, st.run_name, st.exporter_hostname) == ('out/runs', 'a b', True)\n"
        "print('pydantic' in sys.modules)\n"
        "try:\n"
        "    load_settings({'interval': -1.0})\n"
        "except ValueError as e:\n"
        "    print(e)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("TRACEML_")}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert first == "False"
    assert second.startswith("bad value for interval") and "flag --interval" in second
