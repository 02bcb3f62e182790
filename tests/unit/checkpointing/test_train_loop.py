"""Tests of mcwq_t5x.checkpointing.train_loop alone: the loop's schedule of log lines, evaluations
and checkpoints, an early stop, a SIGTERM's checkpoint, a non-finite loss and a failed save (with a
stand-in trainer and checkpoint manager that record what the loop asks of them), the step lines'
sums, one loop of the real tiny trainer and checkpoint manager, and the last line of a process
whose other process is gone. Whole runs: tests/unit/entry_points/test_train.py, tests/e2e/."""
import json
import logging
import os
import signal
import types

import jax
import numpy as np
import optax
import pytest

from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import checkpoints
from mcwq_t5x.checkpointing import run_folder
from mcwq_t5x.checkpointing import train_loop
from mcwq_t5x.data import pipeline
from mcwq_t5x.data import training_data
from mcwq_t5x.engine import flops
from mcwq_t5x.engine import partitioning
from mcwq_t5x.engine import preemption
from mcwq_t5x.engine import trainer as trainer_lib
import tiny_engine

TOKENS = 10  # target tokens of every stand-in step


class StandInTrainer:
  """Steps a state `SimpleNamespace(step)`: update s (1-based) has the token-loss sum 20 s over
  `TOKENS` tokens (2 s per token) and learning rate s / 100. `bad_step`: from that update on the
  guard records a non-finite loss and the state stays; `sigterm_at`: that update sends SIGTERM."""

  model = None  # no network config: no FLOP count

  def __init__(self, bad_step=None, sigterm_at=None):
    self.partitioner = types.SimpleNamespace(make_global_batch=lambda local, size: local)
    self.bad_step, self.sigterm_at = bad_step, sigterm_at
    self.rows_seen = []

  def initial_guard(self):
    return {"bad_step": None}

  def train_step_async(self, state, batch, guard):
    self.rows_seen.append(batch["row"][:, 0].tolist())
    step = state.step + 1
    if step == self.sigterm_at:
      os.kill(os.getpid(), signal.SIGTERM)
    if self.bad_step is not None and step >= self.bad_step:
      guard = {"bad_step": guard["bad_step"] or step}
    else:
      state = types.SimpleNamespace(step=step)
    metrics = {
        "loss": np.float32(20.0 * step),
        "num_tokens": np.float32(TOKENS),
        "num_examples": np.float32(len(batch["row"])),
        "learning_rate": np.float32(step / 100)
    }
    return state, metrics, guard

  @staticmethod
  def check_finite(guard, state):
    if guard["bad_step"] is not None:
      raise trainer_lib.NonFiniteLossError(guard["bad_step"], state, float("nan"), float("nan"))


class StandInManager:
  """Records `save(step, ...)` calls; the steps it keeps are the forced ones and the multiples of
  `period`, as `CheckpointManager`. `fail_at`: that save raises CheckpointSaveError."""

  def __init__(self, directory, period, metric_name_to_monitor=None, fail_at=None):
    self.directory, self.period = directory, period
    self.metric_name_to_monitor, self.fail_at = metric_name_to_monitor, fail_at
    self.saves, self.kept, self.closed = [], [], False

  def save(self, step, state, data_state, force=False, metrics=None):
    if step == self.fail_at:
      raise checkpoints.CheckpointSaveError(f"checkpoint_{step} could not be written")
    self.saves.append((step, int(state.step), data_state["step"], force, metrics))
    if force or step % self.period == 0:
      self.kept.append(step)

  def latest_step(self):
    return self.kept[-1] if self.kept else None

  def wait(self):
    pass

  def close(self):
    self.closed = True


def rows_data(batch_size=4, n=10):
  """`TrainingData` over `n` rows whose feature "row" [n, 1] is the row's index."""
  cfg = pipeline.DatasetConfig("task", None, "train", batch_size, seed=3)
  batches = pipeline.DeterministicBatches({"row": np.arange(n, dtype=np.int32)[:, None]},
                                          batch_size,
                                          seed=3)
  return training_data.TrainingData(cfg, batches, slice(0, batch_size), 3)


def loop(tmp_path, trainer, manager, **kwargs):
  settings = dict(total_steps=7, log_every_steps=3, checkpoint_period=manager.period)
  settings.update(kwargs)
  return train_loop.TrainLoop(trainer, rows_data(), manager, **settings)


def jsonl(path):
  return [json.loads(line) for line in path.read_text().splitlines()]


def evaluate_recorder(calls):

  def evaluate(step, state, writer):
    calls.append((step, state.step, writer))
    return {"step": step, "training_eval/loss": step / 10}

  return evaluate


def test_the_loop_logs_evaluates_and_saves_on_its_schedule(tmp_path):
  trainer, manager, calls = StandInTrainer(), StandInManager(tmp_path, 5), []
  result = loop(
      tmp_path, trainer, manager, eval_period=4,
      evaluate=evaluate_recorder(calls)).run(types.SimpleNamespace(step=0))
  assert (result.step, result.state.step) == (7, 7)
  # the batches of steps 0..6 in the data's order, this process's rows
  assert trainer.rows_seen == [rows_data().local_batch(s)["row"][:, 0].tolist() for s in range(7)]
  # log lines at every 3rd step and the last; loss per token: 2 s averaged over the interval
  rows = jsonl(tmp_path / run_folder.TRAIN_METRICS)
  assert [r["step"] for r in rows] == [3, 6, 7]
  assert [r["loss"] for r in rows] == pytest.approx([4.0, 10.0, 14.0])
  assert [r["learning_rate"] for r in rows] == pytest.approx([0.03, 0.06, 0.07])
  assert rows[-1] == result.train_metrics and "model_gflops_per_s" not in rows[-1]
  # evaluations at every 4th step and the last, with the eval writer; their metrics saved along
  assert [(s, state_step) for s, state_step, _ in calls] == [(4, 4), (7, 7)]
  assert all(isinstance(w, run_folder.ScalarWriter) and w._writer is None for _, _, w in calls)  # pylint: disable=protected-access
  assert [(s, force) for s, _, _, force, _ in manager.saves] == [(s, s == 7) for s in range(1, 8)]
  assert {
      s: m for s, _, _, _, m in manager.saves if m
  } == {
      4: {
          "training_eval/loss": 0.4
      },
      7: {
          "training_eval/loss": 0.7
      }
  }
  assert manager.kept == [5, 7] and not manager.closed
  assert (tmp_path / run_folder.TRAIN_EVENTS).is_dir() and (tmp_path /
                                                            run_folder.EVAL_EVENTS).is_dir()


def test_a_monitored_metric_saves_every_evaluated_step(tmp_path):
  manager = StandInManager(tmp_path, 5, metric_name_to_monitor="training_eval/loss")
  loop(
      tmp_path, StandInTrainer(), manager, eval_period=2,
      evaluate=evaluate_recorder([])).run(types.SimpleNamespace(step=0))
  assert [s for s, _, _, force, _ in manager.saves if force] == [2, 4, 6, 7]


def test_stop_after_steps_and_a_resumed_state(tmp_path):
  """From step 3 to `stop_after_steps` 5: two updates, a forced save at 5, no evaluation (none
  due), the batches of steps 3 and 4."""
  trainer, manager, calls = StandInTrainer(), StandInManager(tmp_path, 100), []
  result = loop(
      tmp_path, trainer, manager, eval_period=4, evaluate=evaluate_recorder(calls)).run(
          types.SimpleNamespace(step=3), stop_after_steps=5)
  assert result.step == 5 and calls == [(4, 4, calls[0][2])]
  assert [(s, force) for s, _, _, force, _ in manager.saves] == [(4, False), (5, True)]
  assert trainer.rows_seen == [rows_data().local_batch(s)["row"][:, 0].tolist() for s in (3, 4)]
  assert [r["step"] for r in jsonl(tmp_path / run_folder.TRAIN_METRICS)] == [5]


def test_sigterm_saves_the_next_step_and_raises_preempted(tmp_path, caplog):
  before = signal.getsignal(signal.SIGTERM)
  manager = StandInManager(tmp_path, 100)
  with pytest.raises(preemption.Preempted, match="saved checkpoint .*checkpoint_3 at step 3 of 7"):
    loop(tmp_path, StandInTrainer(sigterm_at=3), manager).run(types.SimpleNamespace(step=0))
  assert [(s, force) for s, _, _, force, _ in manager.saves] == [(1, False), (2, False), (3, True)]
  assert manager.closed and signal.getsignal(signal.SIGTERM) == before
  assert [r["step"] for r in jsonl(tmp_path / run_folder.TRAIN_METRICS)] == [3]
  assert "SIGTERM received" in caplog.text


@pytest.mark.parametrize("period, last", [(2, "step 2 in"), (100, "no checkpoint had been")])
def test_a_non_finite_loss_saves_nothing_after_it_and_names_the_last_good_checkpoint(
    tmp_path, caplog, period, last):
  """Update 3 is not finite: the check before the save of step 4 (period 2) or the log line of
  step 6 (period 100) raises; nothing from step 3 on is saved or logged."""
  manager = StandInManager(tmp_path, period)
  with pytest.raises(trainer_lib.NonFiniteLossError, match="at step 3"):
    loop(
        tmp_path, StandInTrainer(bad_step=3), manager,
        log_every_steps=6).run(types.SimpleNamespace(step=0))
  assert all(state_step <= 2 for _, state_step, _, _, _ in manager.saves)
  assert manager.kept == ([2] if period == 2 else [])
  assert not (tmp_path / run_folder.TRAIN_METRICS).exists()
  assert f"stopping on a non-finite loss at step 3; {'the last good checkpoint is ' if period == 2 else ''}{last}" in caplog.text


def test_a_failed_save_closes_the_manager(tmp_path, caplog):
  manager = StandInManager(tmp_path, 1, fail_at=2)
  with pytest.raises(checkpoints.CheckpointSaveError, match="checkpoint_2"):
    loop(tmp_path, StandInTrainer(), manager).run(types.SimpleNamespace(step=0))
  assert manager.closed and manager.kept == [1]
  assert "stopping: checkpoint_2 could not be written" in caplog.text


def test_step_logger_sums_an_interval_and_its_share_of_the_peak(tmp_path, caplog):
  writer = run_folder.create_metric_writer(str(tmp_path / "train"))
  peak = flops.MatmulPeak(gflops=80.0, kernel="XLA", measured={"XLA": 80.0}, n=2048)
  logger = train_loop.StepLogger(tmp_path, writer, 10, 8, step_flops=4e9, peak=peak, t_start=0.0)
  for step in (1, 2, 3):  # sums 2, 4, 6 over 10, 20, 30 tokens; 2 correct tokens each
    logger.add({
        "loss": np.float32(2 * step),
        "num_tokens": np.float32(10 * step),
        "accuracy_numerator": np.float32(2),
        "learning_rate": np.float32(step),
        "num_examples": np.float32(8)
    })
  with caplog.at_level(logging.INFO):
    row = logger.log(3)
  writer.close()
  assert logger.pending == [] and jsonl(tmp_path / run_folder.TRAIN_METRICS) == [row]
  assert (row["loss"], row["accuracy"], row["learning_rate"]) == pytest.approx((0.2, 0.1, 3.0))
  assert row["matmul_peak_share"] == pytest.approx(row["model_gflops_per_s"] / 80.0)
  assert row["model_gflops_per_s"] == pytest.approx(row["examples_per_s"] / 8 * 4)
  assert "num_tokens" not in row and row["elapsed_s"] > 0
  assert "step 3/10 (30%): loss 0.2000  acc 0.1000  lr 3.00e+00" in caplog.text
  assert train_loop.utilisation(row,
                                peak) in caplog.text and "% of the XLA matmul's 80.0" in caplog.text


def test_a_loop_of_the_real_trainer_and_manager(tmp_path):
  """4 updates of the tiny model with checkpoints every 2 steps: both on disk, each with its data
  position; the loss lines of the real metrics; the restored newest state is the loop's."""
  partitioner = partitioning.Partitioner(devices=jax.devices()[:4])
  tr = trainer_lib.Trainer(
      tiny_engine.tiny_model(0.0), partitioner, lambda step: 0.0, optimizer=optax.set_to_zero())
  arrays = tiny_engine.synthetic_batch(0, batch=16)
  cfg = pipeline.DatasetConfig("task", None, "train", 8, seed=1)
  data = training_data.TrainingData(cfg, pipeline.DeterministicBatches(arrays, 8, seed=1),
                                    slice(0, 8), 1)
  manager = checkpoints.CheckpointManager(tmp_path, save_interval_steps=2)
  state = tr.create_state(data.global_shapes())
  result = train_loop.TrainLoop(
      tr, data, manager, 4, log_every_steps=2, checkpoint_period=2).run(state)
  manager.wait()
  assert checkpoint_paths.finished_steps(tmp_path) == [2, 4] and result.step == 4
  rows = jsonl(tmp_path / run_folder.TRAIN_METRICS)
  assert [r["step"] for r in rows] == [2, 4] and all(np.isfinite(r["loss"]) for r in rows)
  # zero updates: each step scores its batch with the initial parameters (16 rows, 2 batches)
  assert int(result.state.step) == 4 and rows[0]["loss"] == pytest.approx(rows[1]["loss"], rel=1e-5)
  restored_step, restored, data_state = manager.restore_latest(
      tr.state_shapes(data.global_shapes()), optimizer=tr.optimizer)
  manager.close()
  assert restored_step == 4 and data_state == data.data_state(4)
  for a, b in zip(
      jax.tree_util.tree_leaves(jax.device_get(result.state.params)),
      jax.tree_util.tree_leaves(jax.device_get(restored.params))):
    np.testing.assert_array_equal(a, b)


# --- a lost process ------------------------------------------------------------------------------
class NoVerdict:
  """A `ProcessWatch` that found no lost process in time."""

  def __init__(self):
    self.waited = None

  def wait_for_verdict(self, seconds):
    self.waited = seconds
    return None


def test_lost_process_stop_names_the_process_and_the_resume_command(tmp_path, capsys):
  codes = []
  stop = train_loop.LostProcessStop(
      tmp_path,
      "python -m mcwq_t5x.train --gin_file=x.gin",
      lambda e: f"{type(e).__name__}: {e}",
      exit_fn=codes.append)
  assert "to resume from the start (no checkpoint had been written)" in stop.message("p1 is gone")
  (tmp_path / "checkpoint_20" / checkpoint_paths.STATE_ITEM).mkdir(parents=True)  # finished
  stop("process 1 is gone (no report for 20 s)")
  line = capsys.readouterr().err.strip().splitlines()[-1]
  assert codes == [1]
  assert line.startswith("LostProcessError: process 1 is gone (no report for 20 s); process 0 ")
  assert f"to resume from {tmp_path / 'checkpoint_20'}" in line
  assert line.endswith("this process's command: python -m mcwq_t5x.train --gin_file=x.gin")


def test_lost_process_stop_after_a_collective_error(tmp_path, capsys):
  codes, watch = [], NoVerdict()
  stop = train_loop.LostProcessStop(None, "cmd", lambda e: f"{type(e).__name__}: {e}", codes.append)
  stop.on_error(ValueError("Connection reset by peer"), watch, 20.0)  # not a JAX runtime error
  assert codes == [] and watch.waited is None
  stop.on_error(
      jax.errors.JaxRuntimeError("UNAVAILABLE: Connection reset by peer\nmore"), watch, 20.0)
  assert codes == [1] and watch.waited == 25.0
  assert ("LostProcessError: another process of the run is gone (JaxRuntimeError: UNAVAILABLE: "
          "Connection reset by peer); process 0") in capsys.readouterr().err
