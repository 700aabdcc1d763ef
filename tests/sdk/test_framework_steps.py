"""Unmodified Hugging Face and Lightning scripts under a real ``traceml run`` get one step per
optimizer update (issue 11, items 1-3): the callback is attached automatically (a manual one is
reused), micro-batches of gradient accumulation are merged into their update's step, and
``traceml watch`` / ``--disable-traceml`` attach nothing. Real transformers and lightning, a tiny
model on scikit-learn's digits."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_traceml

DATA = '''
import sys, torch
from sklearn.datasets import load_digits
digits = load_digits()
X = torch.tensor(digits.data[:384] / 16.0, dtype=torch.float32)
Y = torch.tensor(digits.target[:384], dtype=torch.long)
ACCUM = int(sys.argv[1])
MANUAL = sys.argv[2] == "manual"
'''

HF_SCRIPT = DATA + '''
from transformers import Trainer, TrainingArguments

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

class Digits(torch.utils.data.Dataset):
    def __len__(self):
        return len(X)
    def __getitem__(self, i):
        return {"x": X[i], "labels": Y[i]}

callbacks = []
if MANUAL:
    from traceml_ai.sdk.integrations.huggingface import TraceMLTrainerCallback
    callbacks = [TraceMLTrainerCallback()]
torch.manual_seed(0)
args = TrainingArguments(output_dir=sys.argv[3], num_train_epochs=1, per_device_train_batch_size=16,
                         gradient_accumulation_steps=ACCUM, report_to=[], save_strategy="no", use_cpu=True,
                         logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
trainer = Trainer(model=Model(), args=args, train_dataset=Digits(), callbacks=callbacks)
if sys.argv[2] == "late":  # added after the Trainer was built
    from traceml_ai.sdk.integrations.huggingface import TraceMLTrainerCallback
    trainer.add_callback(TraceMLTrainerCallback())
trainer.train()
print("updates", trainer.state.global_step)
'''

LIGHTNING_SCRIPT = DATA + '''
import lightning
from torch.utils.data import DataLoader, TensorDataset

class Model(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

callbacks = []
if MANUAL:
    from traceml_ai.sdk.integrations.lightning import TraceMLCallback
    callbacks = [TraceMLCallback()]
torch.manual_seed(0)
trainer = lightning.Trainer(max_epochs=1, accumulate_grad_batches=ACCUM, callbacks=callbacks, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            accelerator="cpu", devices=1)
trainer.fit(Model(), DataLoader(TensorDataset(X, Y), batch_size=16))
print("updates", trainer.global_step)
'''


def _launch(tmp_path: Path, script_text: str, *args: str, command: str = "run",
            extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> tuple[Any, Path]:
    script = tmp_path / "train.py"
    script.write_text(script_text)
    logs = tmp_path / "runs"
    proc = run_traceml(command, "--mode", "quiet", "--logs-dir", str(logs), "--interval", "0.2", *extra,
                       str(script), *args, cwd=tmp_path, timeout=360, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, logs


def _steps(logs: Path) -> list[tuple[int, dict[str, Any]]]:
    (run_dir,) = logs.iterdir()
    db = sqlite3.connect(f"file:{run_dir / 'aggregator' / 'telemetry.sqlite'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT step, events_json FROM step_time_samples ORDER BY step").fetchall()
    finally:
        db.close()
    return [(step, json.loads(events)) for step, events in rows]


def _calls(events: dict[str, Any], name: str) -> int:
    (stats,) = events[name].values()
    return int(stats["n_calls"])


def _updates(stdout: str) -> int:
    (line,) = [line for line in stdout.splitlines() if line.startswith("updates ")]
    return int(line.split()[1])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("accum", [1, 4])
def test_hugging_face_trainer_without_callback_gets_one_step_per_update(tmp_path: Path, accum: int) -> None:
    pytest.importorskip("transformers")
    proc, logs = _launch(tmp_path, HF_SCRIPT, str(accum), "auto", str(tmp_path / "out"))
    updates = _updates(proc.stdout)
    assert updates == 24 // accum
    assert "attached TraceML's Hugging Face Trainer callback" in proc.stderr
    steps = _steps(logs)
    assert [step for step, _ in steps] == list(range(updates))
    for _, events in steps:
        assert _calls(events, "traceml:step") == accum  # micro-batches per step
        assert _calls(events, "traceml:backward") == accum
        assert _calls(events, "traceml:forward") == accum
        assert _calls(events, "traceml:optimizer_step") == 1
    # Every micro-batch's fetch is in a step (accelerate fetches one batch ahead, so the first
    # step has one more and the last one fewer).
    fetches = [_calls(events, "traceml:dataloader_next") if "traceml:dataloader_next" in events else 0
               for _, events in steps]
    assert sum(fetches) == 24, fetches
    if accum > 1:
        assert f"{updates} steps, one per optimizer update ({updates} steps of {accum} micro-batches)" in proc.stderr
    (run_dir,) = logs.iterdir()
    doc = json.loads((run_dir / "aggregator" / "final_summary.json").read_text())
    assert doc["step_time"]["micro_batches_per_step"] == accum  # the summary says what a step held


@pytest.mark.timeout(120)
def test_a_hugging_face_callback_added_after_the_trainer_was_built_takes_the_automatic_ones_place(
        tmp_path: Path) -> None:
    """Review 11e: ``trainer.add_callback(TraceMLTrainerCallback())`` ran beside the automatic one,
    which said "trace_step nested inside an open step is ignored" to a user who wrote no trace_step."""
    pytest.importorskip("transformers")
    proc, logs = _launch(tmp_path, HF_SCRIPT, "4", "late", str(tmp_path / "out"))
    assert _updates(proc.stdout) == 6
    assert "nested" not in proc.stderr
    steps = _steps(logs)
    assert [step for step, _ in steps] == list(range(6))
    assert [_calls(events, "traceml:step") for _, events in steps] == [4] * 6


@pytest.mark.timeout(120)
@pytest.mark.parametrize("accum", [1, 4])
def test_lightning_trainer_without_callback_gets_one_step_per_update(tmp_path: Path, accum: int) -> None:
    pytest.importorskip("lightning")
    proc, logs = _launch(tmp_path, LIGHTNING_SCRIPT, str(accum), "auto")
    updates = _updates(proc.stdout)
    assert updates == 24 // accum
    assert "attached TraceML's Lightning callback" in proc.stderr
    steps = _steps(logs)
    assert [step for step, _ in steps] == list(range(updates))
    for _, events in steps:
        assert _calls(events, "traceml:step") == accum
        assert _calls(events, "traceml:backward") == accum
        assert _calls(events, "traceml:optimizer_step") == 1


@pytest.mark.timeout(120)
def test_lightning_with_a_short_last_update_counts_it_in_the_end_of_run_line(tmp_path: Path) -> None:
    """Issue 11 review: 25 micro-batches with accumulate_grad_batches=4 are 7 updates (Lightning steps
    the optimizer after the last, single micro-batch); the end-of-run line said 6 steps."""
    pytest.importorskip("lightning")
    proc, logs = _launch(tmp_path, LIGHTNING_SCRIPT.replace("[:384]", "[:400]"), "4", "auto")
    updates = _updates(proc.stdout)
    assert updates == 7
    steps = _steps(logs)
    assert [step for step, _ in steps] == list(range(updates))
    assert [_calls(events, "traceml:step") for _, events in steps] == [4] * 6 + [1]
    assert "7 steps, one per optimizer update (6 steps of 4 micro-batches, 1 step of 1 micro-batch)" in " ".join(
        proc.stderr.split())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["auto", "manual"])
def test_the_standalone_pytorch_lightning_package_gets_one_step_per_update(tmp_path: Path, how: str) -> None:
    """Review 11e: a script importing ``pytorch_lightning`` (a copy of Lightning with classes of its
    own) got no callback, no note and "no trace_step"; a callback passed by hand is not doubled."""
    pytest.importorskip("pytorch_lightning")
    script = LIGHTNING_SCRIPT.replace("import lightning\n", "import pytorch_lightning as lightning\n")
    proc, logs = _launch(tmp_path, script, "4", how)
    assert _updates(proc.stdout) == 6
    assert ("attached TraceML's Lightning callback" in proc.stderr) == (how == "auto")
    assert "nested" not in proc.stderr
    steps = _steps(logs)
    assert [step for step, _ in steps] == list(range(6))
    assert [_calls(events, "traceml:step") for _, events in steps] == [4] * 6


@pytest.mark.timeout(120)
def test_a_manual_callback_is_reused_not_doubled(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    proc, logs = _launch(tmp_path, LIGHTNING_SCRIPT, "4", "manual")
    assert "attached TraceML" not in proc.stderr
    assert "nested" not in proc.stderr  # a second callback would open steps inside the first's
    assert [step for step, _ in _steps(logs)] == list(range(6))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["watch", "disable"])
def test_watch_and_disable_attach_nothing(tmp_path: Path, how: str) -> None:
    pytest.importorskip("lightning")
    if how == "watch":
        proc, logs = _launch(tmp_path, LIGHTNING_SCRIPT, "1", "auto", command="watch")
        assert _steps(logs) == []
    else:
        proc, logs = _launch(tmp_path, LIGHTNING_SCRIPT, "1", "auto", extra=("--disable-traceml",))
    assert _updates(proc.stdout) == 24
    assert "attached TraceML" not in proc.stderr


PLAIN_SCRIPT = DATA + '''
import traceml_ai
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
where = sys.argv[3]
raise_at = int(sys.argv[4]) if len(sys.argv) > 4 else 5  # 4: the first micro-batch of the second update
# retry: the micro-batch is run again; skip: the loop goes on to the next micro-batch (an update whose
# last micro-batch raised never reaches its optimizer step); after: it raised after its update ran;
# optimizer: the optimizer step of the update ending at micro-batch raise_at raises (caught, skipped).
how = sys.argv[5] if len(sys.argv) > 5 else "retry"
updates = 0
retried = False
fail_next = False


def _fail(optimizer, args, kwargs):
    global fail_next
    if fail_next:
        fail_next = False
        raise RuntimeError("CUDA out of memory (planted, in the optimizer step)")


opt.register_step_pre_hook(_fail)
# 416 samples in batches of 16: 26 micro-batches, so 6 updates of 4 and 2 left over at the end.
loader = DataLoader(TensorDataset(torch.cat([X, X[:32]]), torch.cat([Y, Y[:32]])), batch_size=16)
for i, (x, y) in enumerate(loader):
    fail_next = how == "optimizer" and i == raise_at
    if how == "optimizer" and (i + 1) % ACCUM == 0:
        try:
            with traceml_ai.trace_step(model):
                (torch.nn.functional.cross_entropy(model(x), y) / ACCUM).backward()
                if where == "inside":
                    opt.step()
                    updates += 1
            if where == "outside":
                opt.step()
                updates += 1
        except RuntimeError:
            pass  # the user's OOM handling: skip this update
        opt.zero_grad()
        continue
    if i == raise_at and not retried and how != "optimizer":
        retried = True
        try:
            with traceml_ai.trace_step(model):
                torch.nn.functional.cross_entropy(model(x), y).backward()
                if how == "after":
                    opt.step()
                    updates += 1
                raise RuntimeError("CUDA out of memory (planted)")
        except RuntimeError:
            opt.zero_grad()  # the user's retry: throw this micro-batch's gradient away, go on
        if how != "retry":
            continue
    with traceml_ai.trace_step(model):
        loss = torch.nn.functional.cross_entropy(model(x), y) / ACCUM
        loss.backward()
        if where == "inside" and (i + 1) % ACCUM == 0:
            opt.step()
            opt.zero_grad()
            updates += 1
    if where == "outside" and (i + 1) % ACCUM == 0:
        opt.step()
        opt.zero_grad()
        updates += 1
print("updates", updates)
'''


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("where", "raise_at", "how"),
    [("inside", 5, "retry"), ("outside", 5, "retry"), ("inside", 4, "retry"), ("inside", 7, "retry"),
     ("inside", 7, "skip"), ("outside", 7, "skip"), ("inside", 7, "after"), ("inside", 23, "skip"),
     ("inside", 7, "optimizer"), ("outside", 7, "optimizer")],
)
def test_a_plain_loop_with_accumulation_gets_one_step_per_update(
    tmp_path: Path, where: str, raise_at: int, how: str
) -> None:
    proc, logs = _launch(tmp_path, PLAIN_SCRIPT, "4", "auto", where, str(raise_at), how)
    # A skipped last micro-batch takes its update's optimizer step with it.
    assert _updates(proc.stdout) == (5 if how in ("skip", "optimizer") else 6)
    steps = _steps(logs)
    # Six updates. The micro-batch that raised (inside the second update, or its first: issue 11
    # review, it used to split the update in two; or its last, retried, skipped or after the
    # optimizer step ran: issue 11 review, the next update was merged into the discarded one)
    # discards that update whole, and its number is not reused; the next update is a step like
    # the others, and the two micro-batches after the last update are dropped.
    # Raised in the last update (23): the micro-batches after it are still the incomplete end.
    assert [step for step, _ in steps] == ([0, 1, 2, 3, 4] if raise_at == 23 else [0, 2, 3, 4, 5])
    for _, events in steps:
        assert _calls(events, "traceml:step") == 4
        assert _calls(events, "traceml:backward") == 4
        assert _calls(events, "traceml:forward") == 4
        assert _calls(events, "traceml:optimizer_step") == 1
        (opt_stats,) = events["traceml:optimizer_step"].values()
        assert opt_stats["cpu_ms"] > 0
    assert "1 incomplete update of 2 micro-batch(es) at the end was dropped" in proc.stderr
    assert "1 step(s) raised and were discarded" in proc.stderr
    # the script's own count of updates can be one more than the steps: the note says why (review 11e)
    assert "an update whose micro-batch raised is discarded whole, its optimizer step included" in " ".join(
        proc.stderr.split())
    assert "(5 steps of 4 micro-batches)" in proc.stderr
    # The counts reach the run's summary, not only the rank's stderr.
    (run_dir,) = logs.iterdir()
    final = json.loads((run_dir / "aggregator" / "final_summary.json").read_text())
    assert final["steps"]["discarded"] == 1
    assert final["steps"]["dropped_updates"] == 1
    assert final["steps"]["dropped_micro_batches"] == 2
    shown = run_traceml("summary", str(run_dir), cwd=tmp_path, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "1 step(s) raised and were discarded" in shown.stdout
    assert "1 incomplete update(s) of 2 micro-batch(es) at the end dropped" in shown.stdout


RETRY_SCRIPT = '''
import torch
import traceml_ai

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
done = raised = 0
for i in range(30):
    try:
        with traceml_ai.trace_step(model):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            if i % 10 == 3:
                raise torch.OutOfMemoryError("CUDA out of memory (planted)")
            opt.step()
            opt.zero_grad()
        done += 1
    except torch.OutOfMemoryError:
        opt.zero_grad()  # the user's OOM handling: skip the batch and go on
        raised += 1
print("done", done, "raised", raised)
'''


@pytest.mark.timeout(120)
def test_steps_that_raise_are_counted_in_the_run_summary(tmp_path: Path) -> None:
    proc, logs = _launch(tmp_path, RETRY_SCRIPT)
    assert "done 27 raised 3" in proc.stdout
    steps = [step for step, _ in _steps(logs)]
    assert len(steps) == 27 and not {3, 13, 23} & set(steps)  # no row, and their numbers not reused
    (run_dir,) = logs.iterdir()
    final = json.loads((run_dir / "aggregator" / "final_summary.json").read_text())
    assert final["steps"]["discarded"] == 3
    assert final["steps"]["dropped_updates"] == 0
    shown = run_traceml("summary", "--json", str(run_dir), cwd=tmp_path, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["steps"]["discarded"] == 3
    text = run_traceml("summary", str(run_dir), cwd=tmp_path, timeout=60)
    assert "3 step(s) raised and were discarded" in text.stdout
    assert "incomplete update" not in text.stdout


SLOW_DATA_SCRIPT = """
import sys, time, torch
from sklearn.datasets import load_digits
from transformers import Trainer, TrainingArguments

digits = load_digits()
X = torch.tensor(digits.data[:512] / 16.0, dtype=torch.float32)
Y = torch.tensor(digits.target[:512], dtype=torch.long)

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

class SlowDigits(torch.utils.data.Dataset):
    def __len__(self):
        return len(X)
    def __getitem__(self, i):
        time.sleep(0.001)  # a slow disk or decoder
        return {"x": X[i], "labels": Y[i]}

torch.set_num_threads(1)
args = TrainingArguments(output_dir=sys.argv[1], num_train_epochs=1, per_device_train_batch_size=16,
                         report_to=[], save_strategy="no", use_cpu=True, logging_strategy="no", disable_tqdm=True)
Trainer(model=Model(), args=args, train_dataset=SlowDigits()).train()
"""


@pytest.mark.timeout(120)
def test_a_hugging_face_run_waiting_for_its_data_is_reported_input_bound(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    _, logs = _launch(tmp_path, SLOW_DATA_SCRIPT, str(tmp_path / "out"))
    (run_dir,) = logs.iterdir()
    doc = json.loads((run_dir / "aggregator" / "final_summary.json").read_text())
    first = doc["findings"][0]
    assert first["kind"] == "input_bound" and first["severity"] in ("warning", "critical"), doc["findings"]
    assert "ms per step" in first["summary"] and "of every hour of training" in first["summary"]


def _strategies(logs: Path) -> dict[int, tuple[str, str]]:
    """The latest runtime_environment row of each rank: (training_strategy, strategy_source)."""
    (run_dir,) = logs.iterdir()
    db = sqlite3.connect(f"file:{run_dir / 'aggregator' / 'telemetry.sqlite'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT global_rank, training_strategy, strategy_source FROM runtime_environment "
                          "ORDER BY rowid").fetchall()
    finally:
        db.close()
    return {rank: (strategy, source) for rank, strategy, source in rows}


DDP_ENV = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}


@pytest.mark.timeout(400)
def test_a_lightning_ddp_run_on_two_ranks_is_recorded_as_ddp(tmp_path: Path) -> None:
    """Review 11d: the callback was handed the LightningModule, never the DDP wrapper around it,
    so a Lightning DDP run said ``unknown`` on every rank."""
    pytest.importorskip("lightning")
    script = LIGHTNING_SCRIPT.replace('accelerator="cpu", devices=1', 'accelerator="cpu", devices=2, strategy="ddp"')
    assert script != LIGHTNING_SCRIPT
    proc, logs = _launch(tmp_path, script, "1", "auto", extra=("--nproc-per-node", "2"), env=DDP_ENV)
    assert _strategies(logs) == {0: ("DDP", "DistributedDataParallel model"),
                                 1: ("DDP", "DistributedDataParallel model")}, proc.stderr[-2000:]


@pytest.mark.timeout(400)
def test_a_hugging_face_trainer_on_two_ranks_is_recorded_as_ddp(tmp_path: Path) -> None:
    """Review 11d: the Trainer's callbacks get the unwrapped model; the DDP set-up is read from
    accelerate's state."""
    pytest.importorskip("transformers")
    proc, logs = _launch(tmp_path, HF_SCRIPT, "1", "auto", str(tmp_path / "out"), extra=("--nproc-per-node", "2"),
                         env=DDP_ENV)
    assert _strategies(logs) == {0: ("DDP", "accelerate distributed_type"),
                                 1: ("DDP", "accelerate distributed_type")}, proc.stderr[-2000:]
