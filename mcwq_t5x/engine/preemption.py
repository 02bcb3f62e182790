"""Preemption: a SIGTERM asks the training loop to save a checkpoint at a step boundary and stop.

Schedulers (TPU and GPU job schedulers, SLURM, Kubernetes) send SIGTERM some time before they
stop a job; T5X saves at a preemption sync point, and `PreemptionWatch.reached(step)` gives the
loop the same: True at the first step boundary after a SIGTERM, in a multi-process run at the
same step in every process (JAX's preemption service, `jax.distributed`). One process: a Python
handler, installed while the watch is entered (main thread only). Without the service SIGTERM
keeps its default action and a warning says so. No TensorFlow or SeqIO import.
"""
from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import jax

#: The exit status of a run stopped by a preemption after saving: 128 + SIGTERM, what a process
#: killed by SIGTERM reports, so that schedulers and `cmd && next` chains see an unfinished run.
EXIT_STATUS = 128 + int(signal.SIGTERM)

ONE_PROCESS, JAX_SERVICE, NONE = "signal handler", "JAX preemption service", "none"


class PreemptionWatch:
  """Watches for SIGTERM during a training loop, from `start_step`; a context manager.

  `mode`: `ONE_PROCESS`, `JAX_SERVICE` or `NONE` (default action: not the main thread, or several
  processes without the service); `signalled`: one process, SIGTERM arrived.
  """

  def __init__(self, start_step: int = 0):
    self.start_step = int(start_step)
    self.mode = NONE
    self.signalled = False
    self._previous: Any = None

  def _handle(self, signum: int, frame: Any) -> None:
    del frame
    self.signalled = True
    signal.signal(signum, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    logging.warning(
        "SIGTERM received: the run saves a checkpoint at the end of this step and stops "
        "(another SIGTERM stops it at once)")

  def start(self) -> "PreemptionWatch":
    """Starts watching: installs the SIGTERM handler or checks JAX's preemption service."""
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      try:
        multihost_utils.reached_preemption_sync_point(self.start_step)
        self.mode = JAX_SERVICE
      except RuntimeError as e:  # the service is off
        logging.warning(
            "SIGTERM will stop this multi-process run without a checkpoint: JAX's preemption "
            "service is not running (%s)", e)
    elif threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._handle)
      self.mode = ONE_PROCESS
    return self

  def stop(self) -> None:
    """Stops watching: restores the previous SIGTERM handler (idempotent)."""
    if self.mode == ONE_PROCESS:
      signal.signal(signal.SIGTERM, self._previous)
    self.mode = NONE

  def __enter__(self) -> "PreemptionWatch":
    return self.start()

  def __exit__(self, *exc: Any) -> None:
    self.stop()

  def reached(self, step: int) -> bool:
    """Whether to save and stop after `step` (steps done); call it at every step, in every
    process."""
    if self.mode == JAX_SERVICE:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      # The service agrees on the largest step any process has reached, plus one.
      if multihost_utils.reached_preemption_sync_point(int(step)):
        self.signalled = True
      return self.signalled
    return self.signalled


class Preempted(Exception):
  """The run saved `checkpoint` at `step` after a SIGTERM and stopped (not an error: rerun to
  resume)."""

  def __init__(self, step: int, total_steps: int, checkpoint: Any):
    self.step, self.checkpoint = int(step), checkpoint
    super().__init__(f"SIGTERM received: saved checkpoint {checkpoint} at step {step} of "
                     f"{total_steps} and stopped; rerun the same command (every process of a "
                     "multi-process run) to resume from it")
