"""Multi-process training on one machine, for real: the README's 2-process command (2 processes on
127.0.0.1, CPU collectives, `jax.distributed`, each with 2 XLA host devices, launched as a user
launches them on 2 GPU hosts: `python -m mcwq_t5x.train ... --multiprocess_gpu
--coordinator_address=HOST:PORT --process_count=2 --process_index=I`), run once by the `readme`
fixture: its checkpoints hold both processes' shards and restore in one process.

Real MCWQ text (the 155 Hebrew gold test questions), a very small network, 6 steps of 8 packed
rows, dropout on, no periodic evaluation, a final evaluation of 8 questions
(`readme_commands.MULTIPROCESS`).

The same pair with one process signalled at a known step: a SIGTERM (a scheduler's preemption
notice) makes both save one checkpoint at the same step and stop; ONE process with 4 devices
resumes it and must reach the uninterrupted pair's losses and parameters (a run resumes with another
process count at the same data position: the examples of a step do not depend on the number of
processes). A SIGKILL (a process dies) makes the other say which process is gone and how to
resume, instead of ending in XLA's abort.
"""
import argparse
import json
import re
import shutil
import signal
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import traverse_util

from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import checkpoints
from mcwq_t5x.data import pipeline
from mcwq_t5x.engine import partitioning
import local_http
import mains
import readme_commands as rc
import scenarios

TINY = "gin/mcwq_t5x/tiny_random_split_en.gin"
STEPS, STOP = rc.MULTIPROCESS_STEPS, rc.MULTIPROCESS_CHECKPOINT
RUN = [b.replace("=", " = ", 1) for b in rc.MULTIPROCESS]
# Timeouts of JAX's distributed runtime that a busy machine exceeds (load 7 on 2 cores: a process
# starved for minutes while the other compiles), so that the outcome never depends on the load: a
# dead process is still named by the run's own watch (`process_watch.TIMEOUT_S`).
LOADED_HOST_TIMEOUTS = ["--initialization_timeout=900", "--heartbeat_timeout=900"]
# The resumed run's losses and parameters are compared with the pair's, not its decodes.
NO_FINAL_EVAL = ["train_script.train.final_eval_dataset_cfgs = []"]
pytestmark = pytest.mark.xdist_group(
    f"readme-{rc.chain(rc.MULTIPROCESS_RUN)}")  # reads its README runs


def read_params(model_dir, step) -> dict:
  """The parameters of `model_dir/checkpoint_<step>` as numpy arrays, in this one process."""
  folder = checkpoint_paths.checkpoint_dir(model_dir, step)
  meta = ocp.PyTreeCheckpointHandler().metadata(folder / checkpoint_paths.STATE_ITEM).tree["target"]
  abstract = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), meta)
  return traverse_util.flatten_dict(checkpoints.restore_params(folder, abstract))


@pytest.fixture(scope="module")
def runs(readme):
  """The README's pair (2 processes x 2 devices, uninterrupted); `preempted_pair` resumes a pair's
  checkpoint with one process."""
  pair = scenarios.check(readme.result(rc.MULTIPROCESS_RUN))
  return {"two": readme.repo / "runs/tiny_2proc", "pair_log": pair["stdout"] + pair["stderr"]}


def test_multiprocess_pair_feeds_half_of_each_global_batch(runs, preempted_pair):
  assert sorted(mains.train_losses(runs["two"])) == list(range(1, STEPS + 1))
  assert all(np.isfinite(list(mains.train_losses(runs["two"]).values())))
  for i in range(2):
    assert f"process {i} of 2 feeds rows {4 * i}:{4 * i + 4} of each batch of 8" in runs["pair_log"]
  assert "process 0 of 1 feeds rows 0:8 of each batch of 8" in preempted_pair["log"]
  # The pair's final evaluation ran once both had finished (written by process 0 only).
  metrics = json.loads((runs["two"] / "metrics/mcwq_gold_he_test.json").read_text())
  assert metrics["step"] == STEPS and metrics["num_examples"] == 8
  assert len((runs["two"] / "predictions/mcwq_gold_he_test.txt").read_text().splitlines()) == 8


def test_multiprocess_checkpoint_written_together_restores_in_one_process(runs, preempted_pair):
  """Both processes wrote their shards into one checkpoint folder per step (Orbax OCDBT: a
  `ocdbt.process_<i>` store each); it restores in this single process and holds the parameters
  that one process reached from the preempted pair's checkpoint."""
  two = runs["two"]
  assert checkpoint_paths.finished_steps(two) == [STOP, STEPS]
  assert not [p.name for p in two.iterdir() if "tmp" in p.name]
  for model_dir in (two, preempted_pair["dir"]):
    folder = checkpoint_paths.checkpoint_dir(model_dir,
                                             checkpoint_paths.finished_steps(model_dir)[-1])
    assert checkpoint_paths.checkpoint_format(folder) == checkpoint_paths.ITEM_FORMAT_MCWQ
    for item in (checkpoint_paths.STATE_ITEM, checkpoint_paths.OPTIMIZER_ITEM):
      assert {"ocdbt.process_0", "ocdbt.process_1"} <= {p.name for p in (folder / item).iterdir()}
  params_two = read_params(two, STEPS)
  params_one = read_params(preempted_pair["resumed"], STEPS)
  assert params_two.keys() == params_one.keys()
  for key in params_one:  # AdamW amplifies float32 rounding a little: close, not bitwise equal
    np.testing.assert_allclose(
        params_two[key], params_one[key], rtol=1e-4, atol=1e-5, err_msg="/".join(key))


# --- a process signalled: SIGTERM (preemption), SIGKILL (a process dies) ----------------------
# `python -m mcwq_t5x.train` that sends itself the signal $MCWQ_TEST_SIGNAL when its training loop
# dispatches step $MCWQ_TEST_SIGNAL_AT (counted from the loop's start): a scheduler's SIGTERM, or a
# process that dies (SIGKILL), at a known step.
SIGNAL_AT_STEP = """
import os, signal, sys
from mcwq_t5x.engine import trainer
step_fn, calls = trainer.Trainer.train_step_async, []
def signalling(self, *args, **kwargs):
  calls.append(1)
  if len(calls) == int(os.environ["MCWQ_TEST_SIGNAL_AT"]):
    os.kill(os.getpid(), getattr(signal, os.environ["MCWQ_TEST_SIGNAL"]))
  return step_fn(self, *args, **kwargs)
trainer.Trainer.train_step_async = signalling
from mcwq_t5x import train
train.main(sys.argv[1:])
"""


def run_pair(folder, model_dir, signal_name, at_step, extra=()):
  """The README's pair (2 processes x 2 devices, `RUN`) on `model_dir`, process 1 sending itself
  `signal_name` at step `at_step`: [(exit status, log)] of processes 0 and 1."""
  port = local_http.free_port()
  started = []
  for i in range(2):
    args = [
        f"--gin_file={TINY}", *mains.gin_flags(RUN + [f"MODEL_DIR = '{model_dir}'"]),
        *LOADED_HOST_TIMEOUTS, *extra, "--multiprocess_gpu",
        f"--coordinator_address=127.0.0.1:{port}", "--process_count=2", f"--process_index={i}"
    ]
    head = [sys.executable, "-c", SIGNAL_AT_STEP] if i else [sys.executable, "-m", "mcwq_t5x.train"]
    env = {"MCWQ_TEST_SIGNAL": signal_name, "MCWQ_TEST_SIGNAL_AT": str(at_step)} if i else None
    log = folder / f"process_{i}.log"
    started.append((mains.start(head + args, log, env=env), log))
  try:
    for process, _ in started:
      process.wait(timeout=900)
  finally:
    for process, _ in started:
      if process.poll() is None:
        process.kill()
        process.wait()
  return [(process.returncode, log.read_text(errors="replace")) for process, log in started]


def last_line(log):
  return log.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def preempted_pair(tmp_path_factory):
  """The README's pair, process 1 SIGTERM'd (as a scheduler preempts) while dispatching step 2;
  then ONE process with 4 devices resumes its MODEL_DIR (as `runs` resumes the pair's)."""
  folder = tmp_path_factory.mktemp("preempted_pair")
  model_dir = folder / "run"
  outcomes = run_pair(folder, model_dir, "SIGTERM", 2)
  resumed = folder / "resumed_by_one_process"
  shutil.copytree(model_dir, resumed)
  args = [
      sys.executable, "-m", "mcwq_t5x.train", f"--gin_file={TINY}",
      *mains.gin_flags(RUN + [f"MODEL_DIR = '{resumed}'", "HOST_DEVICE_COUNT = 4"] + NO_FINAL_EVAL)
  ]
  return {"dir": model_dir, "outcomes": outcomes, "resumed": resumed, "log": mains.run(args).stderr}


def test_multiprocess_sigterm_saves_one_checkpoint_at_the_same_step_in_every_process(
    preempted_pair):
  """SIGTERM to one process of the pair: both save the checkpoint of one step boundary together
  (JAX's preemption sync point), say so in their last line and exit 143; no other checkpoint than
  the period's (none of step 1)."""
  model_dir = preempted_pair["dir"]
  (status_0, log_0), (status_1, log_1) = preempted_pair["outcomes"]
  assert (status_0, status_1) == (143, 143), log_0[-3000:] + log_1[-3000:]
  match = re.fullmatch(
      f"Preempted: SIGTERM received: saved checkpoint {re.escape(str(model_dir))}/checkpoint_(\\d+) "
      f"at step "
      f"(\\d+) of {STEPS} and stopped; rerun the same command \\(every process of a "
      "multi-process run\\) to resume from it", last_line(log_0))
  assert match and match.group(1) == match.group(2), log_0[-3000:]
  assert last_line(log_1) == last_line(log_0)
  step = int(match.group(1))
  assert 2 <= step <= STEPS
  assert checkpoint_paths.finished_steps(model_dir) == sorted({step}
                                                              | ({STOP} if step > STOP else set()))
  assert sorted(mains.train_losses(model_dir)) == list(range(1, step + 1))


def test_multiprocess_preempted_pair_resumes_with_the_uninterrupted_losses(preempted_pair, runs):
  """The preempted pair's losses, then those of one process resuming its checkpoint, are the
  losses of the README's pair, which ran uninterrupted."""
  step = checkpoint_paths.finished_steps(preempted_pair["dir"])[-1]
  assert f"resumed from {checkpoint_paths.checkpoint_dir(preempted_pair['resumed'], step)}" in (
      preempted_pair["log"])
  got, want = mains.train_losses(preempted_pair["resumed"]), mains.train_losses(runs["two"])
  assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
  np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(want)],
                             rtol=1e-5)


def test_multiprocess_a_dead_process_is_named_by_the_other_in_its_last_line(tmp_path):
  """Process 1 killed (SIGKILL) while dispatching step 5: process 0 does not end in XLA's abort
  (exit status 134, "The tasks have crashed") but with one line naming process 1 and the command
  that resumes the run from its newest checkpoint, exit status 1."""
  model_dir = tmp_path / "run"
  # why: the watch's 20 s default, waited out after the kill, was half of the test's time; 10 s
  # stays well above the longest pause of a loaded machine's live process
  (status_0, log_0), (status_1, _) = run_pair(tmp_path, model_dir, "SIGKILL", 5,
                                              ["--lost_process_timeout=10"])
  assert status_1 == -signal.SIGKILL
  assert status_0 == 1, log_0[-3000:]
  steps = checkpoint_paths.finished_steps(model_dir)
  resume_from = (
      str(checkpoint_paths.checkpoint_dir(model_dir, steps[-1]))
      if steps else "the start (no checkpoint had been written)")
  line = last_line(log_0)
  assert re.fullmatch(
      r"LostProcessError: process 1 of 2 is gone: it has not reported for \d+ s \(died, killed "
      r"or hung: see its log\); process 0 cannot go on without it and stops\. Rerun the same "
      r"command on every process \(--process_index 0 to 1\) to resume from " +
      re.escape(resume_from) + r"; this process's command: python -m mcwq_t5x\.train " +
      re.escape(f"--gin_file={TINY} ") + ".*--process_index=0", line), line
  assert "Check failure" not in log_0 and "The tasks have crashed" not in log_0


# --- no processes launched ---------------------------------------------------------------------
def flags(*argv):
  parser = argparse.ArgumentParser()
  partitioning.add_multiprocess_flags(parser)
  return parser.parse_args(list(argv))


def test_multiprocess_flags_are_t5x_names_and_need_multiprocess_gpu():
  args = flags("--multiprocess_gpu", "--coordinator_address=10.0.0.1:1234", "--process_count=2",
               "--process_index=1")
  assert (args.multiprocess_gpu, args.coordinator_address, args.process_count,
          args.process_index) == (True, "10.0.0.1:1234", 2, 1)
  assert partitioning.initialize_from_flags(flags()) is None  # single process: nothing to do
  with pytest.raises(ValueError, match="--process_index given without --multiprocess_gpu"):
    partitioning.initialize_from_flags(flags("--process_index=1"))


def test_multiprocess_timeouts_reach_jax_distributed_initialize(monkeypatch):
  """The heartbeat timeout is the engine's (not JAX's 100 s) unless `--heartbeat_timeout` says
  otherwise; `--initialization_timeout` is passed as given."""
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: calls.append(kwargs))
  head = ("--multiprocess_gpu", "--coordinator_address=10.0.0.1:1234", "--process_count=2",
          "--process_index=1")
  assert partitioning.initialize_from_flags(flags(*head))
  assert partitioning.initialize_from_flags(
      flags(*head, "--initialization_timeout=900", "--heartbeat_timeout=30"))
  assert [(c.get("initialization_timeout"), c["heartbeat_timeout_seconds"]) for c in calls
         ] == [(None, partitioning.HEARTBEAT_TIMEOUT_S), (900, 30)]
  assert partitioning.HEARTBEAT_TIMEOUT_S > 100  # above JAX's default


@pytest.mark.parametrize("count,index,match", [(2, 2, r"process index 2 is outside \[0, 2\)"),
                                               (2, -1, "outside"), (0, 0, "at least 1")])
def test_multiprocess_bad_process_count_or_index(count, index, match):
  with pytest.raises(ValueError, match=match):
    partitioning.initialize_distributed("127.0.0.1:1", count, index)


def test_multiprocess_batch_rows_and_global_batch_single_process():
  """In one process the local rows are the whole global batch; rows of a batch are a slice of
  the same global batch (what each process of a multi-process run gathers)."""
  p = partitioning.Partitioner()  # the test session's 8 devices, one process
  assert p.local_batch_rows(16) == slice(0, 16)
  with pytest.raises(ValueError, match="multiple of the data-parallel size 8"):
    p.local_batch_rows(12)
  arrays = {"x": np.arange(40, dtype=np.int32).reshape(20, 2)}
  batches = pipeline.DeterministicBatches(arrays, 8, seed=5)
  np.testing.assert_array_equal(batches.batch(3, slice(4, 8))["x"], batches.batch(3)["x"][4:8])
  g = p.make_global_batch(batches.batch(3), 8)
  assert g["x"].shape == (8, 2) and g["x"].sharding == p.data_sharding
  with pytest.raises(
      ValueError, match=r"gives 4 rows, its share of the global batch of 8 is "
      r"rows 0:8"):
    p.make_global_batch(batches.batch(3, slice(0, 4)), 8)
  with pytest.raises(ValueError, match="batch size must be positive"):
    pipeline.DeterministicBatches(arrays, 0)
