"""``traceml demo``: train a real small model, write fake runs beside it, and show them.

The model is a scikit-learn MLP on the digits data set that ships with scikit-learn (1,797 8×8
images, no download), trained on the CPU for a few seconds per run and logged with
:class:`traceml_ai.Run` exactly as a user's script would.
"""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from traceml_ai.cli.common import UserError, one_line_errors, out
from traceml_ai.runs.fake import generate


def train_digits(runs_dir: Path, name: str, *, lr: float, hidden: int, epochs: int, seed: int = 0) -> str:
    """Train an MLP on scikit-learn's digits and log it as a run; return the run folder.

    Logs per epoch ``train/loss`` and ``lr``, then ``val/loss``, ``val/acc`` and ``val/auc`` (one-vs-rest
    macro AUC) on a held-out 25 %; the summary gets ``test/acc`` and ``test/auc`` on a further 25 %.
    """
    try:
        import numpy as np
        from sklearn.datasets import load_digits
        from sklearn.metrics import accuracy_score, log_loss, roc_auc_score
        from sklearn.model_selection import train_test_split
        from sklearn.neural_network import MLPClassifier
        from sklearn.preprocessing import StandardScaler
    except ImportError:
        raise UserError("the demo needs scikit-learn: pip install 'traceml-ai[demo]'") from None
    import traceml_ai

    x, y = load_digits(return_X_y=True)
    x_train, x_rest, y_train, y_rest = train_test_split(x, y, test_size=0.5, random_state=seed, stratify=y)
    x_val, x_test, y_val, y_test = train_test_split(x_rest, y_rest, test_size=0.5, random_state=seed, stratify=y_rest)
    scaler = StandardScaler().fit(x_train)
    x_train, x_val, x_test = scaler.transform(x_train), scaler.transform(x_val), scaler.transform(x_test)
    classes = np.unique(y)
    params = {
        "data": {"dataset": "sklearn-digits", "train_size": len(y_train), "val_size": len(y_val)},
        "model": {"name": "mlp", "hidden": hidden, "activation": "relu"},
        "optim": {"name": "adam", "lr": lr, "batch_size": 64},
        "train": {"epochs": epochs, "seed": seed},
    }
    model = MLPClassifier(
        hidden_layer_sizes=(hidden,), learning_rate_init=lr, batch_size=64, random_state=seed, max_iter=1
    )
    with traceml_ai.Run(
        runs_dir,
        name,
        params=params,
        group="digits-demo",
        tags=["demo", "real"],
        notes="A real MLP trained by `traceml demo` on scikit-learn's digits.",
        best={"val/acc": "max", "val/auc": "max", "val/loss": "min", "train/loss": "min"},
        heartbeat_s=5.0,
    ) as run:
        for epoch in range(epochs):
            model.partial_fit(x_train, y_train, classes=classes)  # one epoch of shuffled mini-batches
            proba = model.predict_proba(x_val)
            run.log(epoch, {"train/loss": float(model.loss_), "lr": lr})
            run.log(
                epoch,
                {
                    "val/loss": float(log_loss(y_val, proba, labels=classes)),
                    "val/acc": float(accuracy_score(y_val, proba.argmax(axis=1))),
                    "val/auc": float(roc_auc_score(y_val, proba, multi_class="ovr", labels=classes)),
                },
            )
        test_proba = model.predict_proba(x_test)
        run.summary["test/acc"] = float(accuracy_score(y_test, test_proba.argmax(axis=1)))
        run.summary["test/auc"] = float(roc_auc_score(y_test, test_proba, multi_class="ovr", labels=classes))
        run.summary["best_checkpoint"] = "checkpoints/none (the demo keeps no weights)"
    return run.dir


def capture_digits(runs_dir: Path) -> Path | None:
    """Train the PyTorch digits example under ``traceml run`` (full capture) into ``runs_dir``.

    Returns the run folder, or None when torch is not installed (one line says so) or the capture
    failed (its error line is printed; the rest of the demo goes on).
    """
    from traceml_ai.examples import TRAIN_DIGITS
    from traceml_ai.launcher.launch import LaunchError, LaunchOptions, launch

    if importlib.util.find_spec("torch") is None:
        out.print("[dim]torch is not installed: skipping the captured PyTorch run[/]")
        return None
    t = time.perf_counter()
    options = LaunchOptions(script=str(TRAIN_DIGITS), args=["--epochs", "4", "--batch-size", "16"],
                            logs_dir=str(runs_dir), name="digits-torch-captured", group="captured",
                            interval=0.5)
    try:
        result = launch(options, on_output=lambda stream, line: None)
    except LaunchError as exc:
        out.print(f"[yellow]the captured run did not start:[/] {escape(str(exc))}")
        return None
    if result.exit_code != 0 or result.run_dir is None:
        out.print(f"[yellow]the captured run ended with exit code {result.exit_code}[/]")
        return result.run_dir
    out.print(f"trained [bold]digits-torch-captured[/] (PyTorch, full telemetry) in {time.perf_counter() - t:.1f} s "
              f"→ {escape(str(result.run_dir))}")
    return result.run_dir


DEMO_MARKER = ".traceml-demo"


@one_line_errors
def demo(
    workspace: Annotated[
        Path, typer.Option("--workspace", "-w", help="Folder for the demo (its traceml/runs is recreated).")
    ] = Path("traceml-demo"),
    epochs: Annotated[int, typer.Option(min=1, max=500, help="Epochs per real run.")] = 30,
    fake: Annotated[int, typer.Option("--fake-runs", min=0, help="Fake runs written beside the real ones.")] = 24,
    no_ui: Annotated[bool, typer.Option("--no-ui", help="Stop after the table; do not start the viewer.")] = False,
    no_browser: Annotated[
        bool, typer.Option("--no-browser", help="Start the viewer but only print its URL.")
    ] = False,
    port: Annotated[int, typer.Option(help="Viewer port; 0 picks a free one.")] = 0,
) -> None:
    """Train two real small models on the CPU, capture a real PyTorch training with full telemetry,
    write fake runs beside them, show them in the terminal, then open the web viewer on them
    (Ctrl+C stops it).

    Example: traceml demo --workspace traceml-demo
    """
    runs_dir = workspace / "traceml" / "runs"
    marker = workspace / DEMO_MARKER
    if runs_dir.exists() and any(runs_dir.iterdir()):
        if not marker.exists():
            raise UserError(
                f"{runs_dir} already holds runs the demo did not write; the demo recreates that folder, "
                "so pick another --workspace"
            )
        generate(runs_dir, runs=0, clean=True)  # refuses a folder holding anything but runs
    runs_dir.mkdir(parents=True, exist_ok=True)
    marker.write_text("This folder was written by `traceml demo`, which recreates traceml/runs here.\n")
    t0 = time.perf_counter()
    written = generate(runs_dir, runs=fake, seed=0)
    out.print(f"wrote {len(written)} fake runs to [bold]{escape(str(runs_dir))}[/]")
    for name, lr, hidden in (("digits-mlp", 1e-3, 64), ("digits-mlp-wide", 3e-3, 256)):
        t = time.perf_counter()
        folder = train_digits(runs_dir, name, lr=lr, hidden=hidden, epochs=epochs)
        out.print(f"trained [bold]{name}[/] for {epochs} epochs in {time.perf_counter() - t:.1f} s → {escape(folder)}")
    captured = capture_digits(runs_dir)
    out.print(f"demo ready in {time.perf_counter() - t0:.1f} s\n")
    from traceml_ai.cli.runs import ls

    ls(
        roots=[str(runs_dir)],
        filter_=None,
        sort=["-started"],
        group_by=None,
        columns="name,status,group,started,duration_s,run.best.val/acc,run.best.val/auc,summary.test/acc,config.optim.lr",
        search=None,
        status=None,
        as_json=False,
        as_csv=False,
        stale_after_seconds=None,
    )
    shown = os.path.relpath(runs_dir)
    if captured is not None:
        out.print(f"\nTelemetry of the captured run: [bold]traceml summary {escape(os.path.relpath(captured))}[/]")
    out.print(
        "\nNext: [bold]traceml runs show digits-mlp --root "
        f"{escape(shown)}[/] · [bold]traceml ui {escape(shown)}[/]"
    )
    if no_ui:
        return
    from traceml_ai.cli.ui import ui

    out.print("\nStarting the viewer on the demo runs (Ctrl+C to stop) …")
    ui(roots=[str(runs_dir)], port=port, host=None, no_browser=no_browser, cache_dir=None,
       refresh_interval_seconds=None)
