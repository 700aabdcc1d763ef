"""The Lightning and Hugging Face callbacks give the same step telemetry as a hand-written loop,
under ``traceml run`` with the real libraries (issue: capture, item 7)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_ai.telemetry.sqlite import read_only_uri

# Each test trains with Lightning or transformers under the real `traceml run` (up to 300 s each).
pytestmark = pytest.mark.timeout(600)

LIGHTNING_SCRIPT = '''
import torch, lightning
from torch.utils.data import DataLoader, TensorDataset
from traceml_ai.sdk.integrations.lightning import TraceMLCallback

class Model(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

torch.manual_seed(0)
data = TensorDataset(torch.randn(96, 8), torch.randint(0, 2, (96,)))
trainer = lightning.Trainer(max_epochs=2, callbacks=[TraceMLCallback()], logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)
trainer.fit(Model(), DataLoader(data, batch_size=16))
print("lightning done")
'''

HF_SCRIPT = '''
import torch
from transformers import Trainer, TrainingArguments
from traceml_ai.sdk.integrations.huggingface import TraceMLTrainerCallback

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    def forward(self, x, labels=None):
        logits = self.net(x)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}

class Data(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(96, 8, generator=g), torch.randint(0, 2, (96,), generator=g)
    def __len__(self):
        return 96
    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}

import sys
args = TrainingArguments(output_dir=sys.argv[1], num_train_epochs=2, per_device_train_batch_size=16,
                         report_to=[], save_strategy="no", use_cpu=True, logging_strategy="no",
                         disable_tqdm=True)
Trainer(model=Model(), args=args, train_dataset=Data(), callbacks=[TraceMLTrainerCallback()]).train()
print("hf done")
'''


def _run(tmp_path: Path, script_text: str, *args: str) -> Path:
    script = tmp_path / "train.py"
    script.write_text(script_text)
    logs = tmp_path / "runs"
    proc = subprocess.run(
        [sys.executable, "-m", "traceml_ai", "run", "--mode", "quiet", "--logs-dir", str(logs), "--interval", "0.2",
         str(script), *args],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = logs.iterdir()
    return run_dir


def _phases(run_dir: Path) -> tuple[int, set[str]]:
    db = sqlite3.connect(read_only_uri(run_dir / 'aggregator' / 'telemetry.sqlite'), uri=True)
    rows = db.execute("SELECT step, events_json FROM step_time_samples").fetchall()
    names = {name for _, events in rows for name in json.loads(events)}
    return len(rows), names


def test_lightning_callback_times_every_training_batch(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    run_dir = _run(tmp_path, LIGHTNING_SCRIPT)
    steps, names = _phases(run_dir)
    assert steps == 12  # 2 epochs x 6 batches
    assert {"traceml:step", "traceml:forward", "traceml:backward", "traceml:optimizer_step"} <= names


def test_hugging_face_callback_times_every_optimisation_step(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    run_dir = _run(tmp_path, HF_SCRIPT, str(tmp_path / "hf-out"))
    steps, names = _phases(run_dir)
    assert steps == 12
    assert {"traceml:step", "traceml:forward", "traceml:backward", "traceml:optimizer_step"} <= names
