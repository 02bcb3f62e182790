"""The training loop of `mcwq_t5x.train` (T5X's loop in `t5x/train.py`, big_vision's habit of a
loop that only steps): `TrainLoop` runs the steps with periodic log lines (`StepLogger`),
evaluations (a callable, `training_eval.PeriodicEvaluator` in the main) and checkpoints, saves at
the next step boundary on SIGTERM (`preemption.Preempted`), and stops on a non-finite loss naming
the last good checkpoint. `LostProcessStop` ends a process of a multi-process run whose other
process is gone (`process_watch`), naming it and the command that resumes the run.

Steps are dispatched without waiting for the device: their metrics stay on the device until the
next log step, and non-finite steps are recorded in the trainer's guard (the state freezes at the
last good one), checked before every log, evaluation and checkpoint save; so nothing from a
non-finite step is logged or saved, and the error names the first bad step (at most one log or
checkpoint interval late).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pathlib
import sys
import time
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional

import jax

from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import checkpoints
from mcwq_t5x.checkpointing import run_folder
from mcwq_t5x.data import pipeline
from mcwq_t5x.data import training_data
from mcwq_t5x.engine import flops as flops_lib
from mcwq_t5x.engine import preemption
from mcwq_t5x.engine import process_watch
from mcwq_t5x.engine import trainer as trainer_lib

#: The step metrics summed over a log interval (the rest of a step's metrics are per step).
SUMMED = ("loss", "cross_ent_loss", "z_loss", "accuracy_numerator", "num_tokens", "num_examples")
#: Steps dispatched ahead of the host at most: the host does not queue a whole log interval.
IN_FLIGHT = 2


def utilisation(summary: Mapping[str, float], peak: Optional[flops_lib.MatmulPeak]) -> str:
  """The step line's utilisation: "  12.3 GFLOP/s = 9.1% of the XLA matmul's 135.0" (the model
  FLOPs per second of the logged steps, `summary["model_gflops_per_s"]`, and their share of the
  start-up matmul peak), "  12.3 GFLOP/s" without a peak, "" without a FLOP count."""
  gflops = summary.get("model_gflops_per_s")
  if gflops is None:
    return ""
  if peak is None:
    return f"  {gflops:.1f} GFLOP/s"
  return (f"  {gflops:.1f} GFLOP/s = {100.0 * gflops / peak.gflops:.1f}% of the {peak.kernel} "
          f"matmul's {peak.gflops:.1f}")


class StepLogger:
  """The metrics of the steps since the last log line, then one log line, one TensorBoard scalar
  set (`writer`) and one MODEL_DIR/train_metrics.jsonl row.

  `step_flops`: model FLOPs of one step (None: no GFLOP/s); `peak`: the start-up matmul peak (None:
  no share of it); `t_start`: the run's start (`time.time()`), for the rows' "elapsed_s".
  """

  def __init__(self,
               model_dir: pathlib.Path,
               writer: run_folder.ScalarWriter,
               total_steps: int,
               batch_size: int,
               step_flops: Optional[float] = None,
               peak: Optional[flops_lib.MatmulPeak] = None,
               t_start: Optional[float] = None):
    self.model_dir, self.writer = pathlib.Path(model_dir), writer
    self.total_steps, self.batch_size = total_steps, batch_size
    self.step_flops, self.peak = step_flops, peak
    self.t_start = time.time() if t_start is None else t_start
    self.timer = trainer_lib.StepTimer()
    self.pending: list[dict[str, Any]] = []  # the device metrics of the steps not yet logged
    self.last_logged: dict[str, Any] = {}

  def add(self, metrics: Mapping[str, Any]) -> None:
    """Records a dispatched step's metrics; waits for the step `IN_FLIGHT` + 1 steps back."""
    self.pending.append(dict(metrics))
    if len(self.pending) > IN_FLIGHT:
      jax.block_until_ready(self.pending[-IN_FLIGHT - 1]["loss"])

  def log(self, step: int) -> dict[str, Any]:
    """Logs the steps recorded since the last call, as of `step`; returns the row written."""
    sums: dict[str, float] = {}
    for host in jax.device_get(self.pending):
      for k in SUMMED:
        if k in host:
          sums[k] = sums.get(k, 0.0) + float(host[k])
      sums["learning_rate"] = float(host["learning_rate"])
      self.timer.add(
          float(host.get("num_examples", self.batch_size)), float(host.get("num_tokens", 0.0)),
          self.step_flops)
    self.pending = []
    summary = trainer_lib.summarize_metrics(sums)
    summary.update(self.timer.read_and_reset())
    summary.pop("num_tokens", None)
    summary.pop("num_examples", None)
    if self.peak is not None and "model_gflops_per_s" in summary:
      summary["matmul_peak_share"] = summary["model_gflops_per_s"] / self.peak.gflops
    self.writer.write_scalars(step, summary)
    logging.info(
        "step %d/%d (%.0f%%): loss %.4f  acc %.4f  lr %.2e  %.3fs/step  %.1f ex/s  "
        "%.0f tok/s%s", step, self.total_steps, 100.0 * step / self.total_steps, summary["loss"],
        summary.get("accuracy", float("nan")), summary["learning_rate"], summary["step_time_s"],
        summary["examples_per_s"], summary["tokens_per_s"], utilisation(summary, self.peak))
    self.last_logged = {"step": step, "elapsed_s": time.time() - self.t_start, **summary}
    run_folder.append_jsonl(self.model_dir / run_folder.TRAIN_METRICS,
                            pipeline.to_jsonable(self.last_logged))
    return self.last_logged


class LoopResult(NamedTuple):
  """How a loop ended: the `step` reached, its `state`, the last log row (`train_metrics`) and the
  loop's wall-clock seconds (`train_time_s`)."""
  step: int
  state: Any
  train_metrics: dict[str, Any]
  train_time_s: float

  def summary(self) -> dict[str, Any]:
    """{"step", "train_metrics", "train_time_s"} (the training main's result keys)."""
    return {
        "step": self.step,
        "train_metrics": self.train_metrics,
        "train_time_s": self.train_time_s
    }


class _Run(NamedTuple):
  """What one `TrainLoop.run` keeps between its steps: the log lines, the evaluations' writer, the
  SIGTERM watch and the step it stops at."""
  logger: StepLogger
  eval_writer: run_folder.ScalarWriter
  watch: preemption.PreemptionWatch
  stop_at: int

  @classmethod
  def open(cls, loop: "TrainLoop", step: int, stop_after_steps: Optional[int]) -> "_Run":
    """MODEL_DIR's TensorBoard writers (train/, eval/) and a watch from `step` (not started)."""
    model_dir = pathlib.Path(loop.manager.directory)
    writers = [
        run_folder.create_metric_writer(str(model_dir / name))
        for name in (run_folder.TRAIN_EVENTS, run_folder.EVAL_EVENTS)
    ]
    # Model FLOPs of a step (the network's matmuls on the batch's padded shapes), None for a
    # model without a T5 network config.
    step_flops = flops_lib.batch_train_step_flops(
        getattr(getattr(loop.trainer.model, "module", None), "config", None),
        loop.data.global_shapes())
    logger = StepLogger(model_dir, writers[0], loop.total_steps, loop.data.cfg.batch_size,
                        step_flops, loop.peak, loop.t_start)
    stop_at = loop.total_steps if stop_after_steps is None else min(stop_after_steps,
                                                                    loop.total_steps)
    # SIGTERM (a scheduler's preemption notice): a checkpoint at the next step boundary, the same
    # step in every process, then `preemption.Preempted` (see `preemption.PreemptionWatch`).
    return cls(logger, writers[1], preemption.PreemptionWatch(step), stop_at)

  def close(self) -> None:
    """Stops the watch and closes both writers (nothing is written to them after the loop)."""
    self.watch.stop()
    self.logger.writer.close()
    self.eval_writer.close()


#: `evaluate(step, state, writer)` -> {"step", metric: value}: a periodic evaluation.
Evaluate = Callable[[int, Any, run_folder.ScalarWriter], dict[str, Any]]


@contextlib.contextmanager
def stopping_cleanly(manager: checkpoints.CheckpointManager) -> Iterator[None]:
  """Ends a loop's checkpointing however the loop ends: waits for the last save (whose failure,
  e.g. a full disk, surfaces here); on a non-finite loss, logs the last good checkpoint and raises
  the error again with it named and what to do; on a failed save, logs it and closes the manager
  (no save left running at exit) and re-raises."""
  try:
    yield
    manager.wait()
  except trainer_lib.NonFiniteLossError as e:
    manager.wait()
    last = manager.latest_step()
    logging.error(
        "stopping on a non-finite loss at step %d; %s", e.step,
        (f"the last good checkpoint is step {last} in {manager.directory}" if last is not None else
         "no checkpoint had been written yet, so there is nothing to resume from"))
    # why a new error: the mains print its message as the one last line, so it says what to do
    note = ("; the last good checkpoint is "
            f"{checkpoint_paths.checkpoint_dir(manager.directory, last)}: lower LEARNING_RATE (or "
            "set GRAD_CLIP_NORM) and rerun to resume from it" if last is not None else
            "; no checkpoint had been written: lower LEARNING_RATE (or set GRAD_CLIP_NORM) and "
            "rerun")
    raise trainer_lib.NonFiniteLossError(e.step, e.state, e.loss, e.grad_norm, note) from e
  except checkpoints.CheckpointSaveError as e:
    logging.error("stopping: %s", e)
    manager.close()
    raise
  finally:
    manager.wait()


@dataclasses.dataclass
class TrainLoop:
  """Steps a state from its step to `total_steps` (or `stop_after_steps`), with a log line every
  `log_every_steps`, an evaluation every `eval_period` (0 or no `evaluate`: none) and at the last
  step, a checkpoint every `checkpoint_period` and at the end; the manager's
  `metric_name_to_monitor` makes every evaluated step a checkpoint. `run` writes MODEL_DIR's
  (`manager.directory`) TensorBoard events train/ and eval/, closed when it returns or raises.
  `peak`: the start-up matmul peak of the step lines; `t_start`: the run's start."""
  trainer: trainer_lib.Trainer
  data: training_data.TrainingData
  manager: checkpoints.CheckpointManager
  total_steps: int
  log_every_steps: int = 100
  checkpoint_period: int = 1000
  eval_period: int = 0
  evaluate: Optional[Evaluate] = None
  peak: Optional[flops_lib.MatmulPeak] = None
  t_start: Optional[float] = None

  def run(self, state: Any, stop_after_steps: Optional[int] = None) -> LoopResult:
    """Trains from `state.step` on.

    Raises:
      trainer.NonFiniteLossError: NaN/Inf loss, at the next log/eval/checkpoint step (logged with
        the last good checkpoint); nothing from the bad step on is logged or saved.
      checkpoints.CheckpointSaveError: a checkpoint write failed (names the last good one).
      preemption.Preempted: SIGTERM; the checkpoint of the next step boundary was saved.
    """
    step = int(state.step)
    guard = self.trainer.initial_guard()
    run = _Run.open(self, step, stop_after_steps)
    t_train, preempted = time.time(), False
    try:
      with stopping_cleanly(self.manager):
        run.watch.start()
        while step < run.stop_at and not preempted:
          state, guard, preempted = self._step(state, guard, step, run)
          step += 1
    finally:
      run.close()
    if preempted:
      self.manager.close()
      error = preemption.Preempted(step, self.total_steps,
                                   checkpoint_paths.checkpoint_dir(self.manager.directory, step))
      logging.warning("%s", error)
      raise error
    return LoopResult(step, state, run.logger.last_logged, time.time() - t_train)

  def _step(self, state: Any, guard: Any, step: int, run: _Run) -> tuple[Any, Any, bool]:
    """Update step `step` + 1, then its log line, evaluation and checkpoint where due; (state,
    guard, whether to stop after it on a SIGTERM)."""
    batch = self.trainer.partitioner.make_global_batch(
        self.data.local_batch(step), self.data.cfg.batch_size)
    state, metrics, guard = self.trainer.train_step_async(state, batch, guard)
    step += 1
    preempted = run.watch.reached(step)  # why every step: processes agree on the step to stop at
    run.logger.add(metrics)
    if step % self.log_every_steps == 0 or step == run.stop_at or preempted:
      self.trainer.check_finite(guard, state)
      run.logger.log(step)
    # Evaluate before saving, so that the checkpoint carries the step's metrics (best-keeping).
    record = None
    if self.eval_period and self.evaluate is not None and (step % self.eval_period == 0 or
                                                           step == self.total_steps):
      self.trainer.check_finite(guard, state)
      record = self.evaluate(step, state, run.eval_writer)
    force = (step == run.stop_at) or preempted or (bool(self.manager.metric_name_to_monitor) and
                                                   record is not None)
    if force or step % max(int(self.checkpoint_period), 1) == 0:
      self.trainer.check_finite(guard, state)  # never save a state frozen after a non-finite step
    self.manager.save(
        step,
        state,
        self.data.data_state(step),
        force=force,
        metrics=None if record is None else {
            k: v for k, v in record.items() if k != "step"
        })
    return state, guard, preempted


class LostProcessStop:
  """The end of a process of a multi-process run whose other process is gone: one last line on
  stderr, `LostProcessError: ...` (`error_line`, the mains' `console.error_line`), naming the lost
  process and the command that resumes the run from MODEL_DIR's newest checkpoint
  (`process_watch.resume_message`), then exit status 1 at once, also from the watch's thread.
  Exiting normally would wait for JAX's shutdown barrier and end in XLA's abort ("The tasks have
  crashed", exit status 134) after our line. `exit_fn`: `os._exit` (a stand-in in tests)."""

  def __init__(self,
               model_dir: Optional[checkpoint_paths.PathLike],
               command: str,
               error_line: Callable[[BaseException], str],
               exit_fn: Callable[[int], Any] = os._exit):  # pylint: disable=protected-access
    self.model_dir, self.command = model_dir, command
    self.error_line, self.exit_fn = error_line, exit_fn

  def message(self, lost: str) -> str:
    """The last line's message: `lost` (which process and why), what to rerun, from where."""
    steps = checkpoint_paths.finished_steps(self.model_dir) if self.model_dir else []
    resume_from = (
        str(checkpoint_paths.checkpoint_dir(pathlib.Path(self.model_dir).absolute(), steps[-1]))
        if steps else "the start (no checkpoint had been written)")
    return process_watch.resume_message(lost, self.command, resume_from)

  def __call__(self, lost: str) -> None:
    """Prints the last line and ends the process (`ProcessWatch`'s `on_lost`)."""
    for handler in logging.getLogger().handlers:
      handler.flush()
    sys.stdout.flush()
    line = self.error_line(process_watch.LostProcessError(self.message(lost)))
    print(line, file=sys.stderr, flush=True)
    self.exit_fn(1)

  def on_error(self, error: BaseException, watch: process_watch.ProcessWatch,
               timeout_s: float) -> None:
    """Stops as `__call__` when `error` is a collective's error whose other end is gone: names the
    process the watch finds within `timeout_s` (+5 reports), else the error's first line."""
    if not process_watch.is_lost_process_error(error):
      return
    lost = watch.wait_for_verdict(timeout_s + 5 * process_watch.INTERVAL_S)
    first = str(error).strip().splitlines()
    self(lost or f"another process of the run is gone ({type(error).__name__}: "
         f"{first[0][:300] if first else ''})")
