"""The one-line error rule of the commands (DESIGN §7): what a user can fix is one line, a bug in our
code is an 'internal error' line (a traceback with --debug), never a plausible user error."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from traceml_ai.cli.common import DEBUG, one_line_errors
from traceml_ai.runs.store import RunStore


@one_line_errors
def _lookup_bug() -> None:
    phases: dict[str, float] = {"forward": 1.0}
    print(phases["backward"])  # a lookup bug: a bare KeyError from our own code


@one_line_errors
def _unknown_run(root: str) -> None:
    RunStore([root]).find("no-such-run")


@pytest.fixture(autouse=True)
def _no_debug() -> None:
    DEBUG["on"] = False


def test_a_bare_key_error_is_an_internal_error_not_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as exit_info:
        _lookup_bug()
    assert exit_info.value.exit_code == 1
    text = capsys.readouterr().err
    assert "internal error: KeyError: 'backward'" in text
    assert "--debug" in text


def test_a_bare_key_error_raises_with_debug() -> None:
    DEBUG["on"] = True
    with pytest.raises(KeyError, match="backward"):
        _lookup_bug()


def test_an_unknown_run_is_one_line_without_internal_error(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as exit_info:
        _unknown_run(str(tmp_path))
    assert exit_info.value.exit_code == 1
    text = capsys.readouterr().err
    assert "error: no run 'no-such-run'" in text
    assert "internal error" not in text
