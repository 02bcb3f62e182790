"""Multi-process training on one machine, for real: 2 processes on 127.0.0.1 (CPU collectives,
`jax.distributed`), each with 2 XLA host devices, launched as a user launches them on 2 GPU hosts
(`python -m mcwq_t5x.train ... --multiprocess_gpu --coordinator_address=HOST:PORT
--process_count=2 --process_index=I`), against one process with 4 devices on the same global
batch: the same losses, one checkpoint written by both processes together, and a stopped pair
that resumes from it with the losses of the uninterrupted run.

Real MCWQ text (the 155 Hebrew gold test questions), a very small network, 6 steps of 8 packed
rows, dropout on, no periodic evaluation, a final evaluation of 8 questions.
"""
import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import traverse_util

from mcwq_t5x import checkpoints
from mcwq_t5x import partitioning
from mcwq_t5x import utils
import mains

TINY = "gin/mcwq_t5x/tiny_random_split_en.gin"
STEPS = 6
STOP = 3  # the first launch of the pair stops here (after checkpointing), the second resumes
RUN = mains.SMALL_MODEL + [
    "TASK_FEATURE_LENGTHS = {'inputs': 40, 'targets': 128}", "BATCH_SIZE = 8",
    "LOG_EVERY_STEPS = 1", f"CHECKPOINT_PERIOD = {STOP}", "EVAL_PERIOD = 0",
    "FINAL_EVAL_NUM_EXAMPLES = 8", "INFER_BATCH_SIZE = 8", "WARMUP_STEPS = 2",
    f"TRAIN_STEPS = {STEPS}", "MIXTURE_OR_TASK_NAME = 'mcwq_gold_he'", "TRAIN_SPLIT = 'test'",
    "EVAL_SPLIT = 'test'", "FINAL_EVAL_SPLIT = 'test'"
]
TIMEOUT_S = 900  # per launch


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def train_args(model_dir, host_devices, *extra):
  return [
      sys.executable, "-m", "mcwq_t5x.train", f"--gin_file={TINY}", *mains.gin_flags(
          RUN + [f"MODEL_DIR = '{model_dir}'", f"HOST_DEVICE_COUNT = {host_devices}", *extra])
  ]


def launch_pair(model_dir: pathlib.Path, *extra: str, timeout: int = TIMEOUT_S) -> list[str]:
  """Runs the 2-process job (process 0 and 1 of `train_args(...)` with T5X's multi-process flags)
  and returns the two logs. If one process fails or the pair outlives `timeout`, both are killed
  (a process left alone would wait for its peer in a collective) and the test fails with the
  logs' ends."""
  port = free_port()
  env = dict(os.environ)
  env.pop("XLA_FLAGS", None)  # the test session's 8 fake devices; HOST_DEVICE_COUNT sets 2
  logs = [model_dir.parent / f"{model_dir.name}.process_{i}.log" for i in range(2)]
  procs = []
  for i, log in enumerate(logs):
    args = train_args(model_dir, 2, *extra) + [
        "--multiprocess_gpu", f"--coordinator_address=127.0.0.1:{port}", "--process_count=2",
        f"--process_index={i}"
    ]
    with open(log, "w") as f:
      procs.append(
          subprocess.Popen(
              args,
              cwd=mains.REPO,
              env=env,
              stdout=f,
              stderr=subprocess.STDOUT,
              start_new_session=True))
  deadline = time.time() + timeout
  try:
    while any(p.poll() is None for p in procs):
      if any(p.poll() not in (None, 0) for p in procs) or time.time() > deadline:
        break
      time.sleep(1)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  texts = [log.read_text(errors="replace") for log in logs]
  codes = [p.returncode for p in procs]
  assert codes == [0,
                   0], (f"2-process run exited {codes} (negative: killed after a peer failed "
                        f"or after {timeout}s)\n" +
                        "\n".join(f"--- process {i} ---\n{t[-4000:]}" for i, t in enumerate(texts)))
  return texts


def losses(model_dir) -> dict[int, float]:
  lines = (pathlib.Path(model_dir) / "train_metrics.jsonl").read_text().splitlines()
  return {r["step"]: r["loss"] for r in map(json.loads, lines)}


def read_params(model_dir, step) -> dict:
  """The parameters of `model_dir/checkpoint_<step>` as numpy arrays, in this one process."""
  folder = checkpoints.checkpoint_dir(model_dir, step)
  meta = ocp.PyTreeCheckpointHandler().metadata(folder / checkpoints.STATE_ITEM).tree["target"]
  abstract = jax.tree_util.tree_map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), meta)
  return traverse_util.flatten_dict(checkpoints.restore_params(folder, abstract))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, mcwq_dir):
  """One process x 4 devices, uninterrupted; 2 processes x 2 devices, stopped after step STOP
  (as if killed) and launched again to finish."""
  del mcwq_dir  # the real data must be there
  base = tmp_path_factory.mktemp("multiprocess")
  one, two = base / "one_process", base / "two_processes"
  one_log = mains.run(train_args(one, 4), timeout=TIMEOUT_S).stderr
  first = launch_pair(two, f"train.stop_after_steps = {STOP}")
  losses_at_stop = losses(two)
  steps_at_stop = checkpoints.finished_steps(two)
  second = launch_pair(two)
  return {
      "one": one,
      "one_log": one_log,
      "two": two,
      "first_logs": first,
      "second_logs": second,
      "losses_at_stop": losses_at_stop,
      "steps_at_stop": steps_at_stop
  }


def test_multiprocess_losses_equal_single_process_run(runs):
  """2 processes x 2 devices train on the same global batches as 1 process x 4 devices."""
  one, two = losses(runs["one"]), losses(runs["two"])
  assert sorted(one) == list(range(1, STEPS + 1)) == sorted(two)
  assert all(np.isfinite(list(one.values())))
  # Uninterrupted steps 1..STOP of the pair (the first launch).
  before = runs["losses_at_stop"]
  assert sorted(before) == list(range(1, STOP + 1))
  np.testing.assert_allclose([before[s] for s in sorted(before)], [one[s] for s in sorted(before)],
                             rtol=1e-5)
  # Each process fed its half of every global batch of 8 rows.
  for i, log in enumerate(runs["first_logs"]):
    assert f"process {i} of 2 feeds rows {4 * i}:{4 * i + 4} of each batch of 8" in log
  assert "process 0 of 1 feeds rows 0:8 of each batch of 8" in runs["one_log"]


def test_multiprocess_killed_pair_resumes_with_uninterrupted_losses(runs):
  """The pair stopped after step STOP resumes from the shared checkpoint: steps STOP+1.. repeat
  the uninterrupted single-process run's losses."""
  assert runs["steps_at_stop"][-1] == STOP
  for log in runs["second_logs"]:
    assert f"resumed from {checkpoints.checkpoint_dir(runs['two'], STOP)}" in log
  one, two = losses(runs["one"]), losses(runs["two"])
  np.testing.assert_allclose([two[s] for s in range(1, STEPS + 1)],
                             [one[s] for s in range(1, STEPS + 1)],
                             rtol=1e-5)
  # The final evaluation ran once the pair had finished (written by process 0 only).
  metrics = json.loads((runs["two"] / "metrics/mcwq_gold_he_test.json").read_text())
  assert metrics["step"] == STEPS and metrics["num_examples"] == 8
  assert len((runs["two"] / "predictions/mcwq_gold_he_test.txt").read_text().splitlines()) == 8


def test_multiprocess_checkpoint_written_together_restores_in_one_process(runs):
  """Both processes wrote their shards into one checkpoint folder per step (Orbax OCDBT: a
  `ocdbt.process_<i>` store each); it restores in this single process and holds the parameters
  the single-process run reached."""
  two = runs["two"]
  assert checkpoints.finished_steps(two)[-1] == STEPS
  assert not [p.name for p in two.iterdir() if "tmp" in p.name]
  folder = checkpoints.checkpoint_dir(two, STEPS)
  assert checkpoints.checkpoint_format(folder) == checkpoints.FORMAT_MCWQ
  for item in (checkpoints.STATE_ITEM, checkpoints.OPTIMIZER_ITEM):
    assert {"ocdbt.process_0", "ocdbt.process_1"} <= {p.name for p in (folder / item).iterdir()}
  params_two, params_one = read_params(two, STEPS), read_params(runs["one"], STEPS)
  assert params_two.keys() == params_one.keys()
  for key in params_one:  # AdamW amplifies float32 rounding a little: close, not bitwise equal
    np.testing.assert_allclose(
        params_two[key], params_one[key], rtol=1e-4, atol=1e-5, err_msg="/".join(key))


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
  batches = utils.DeterministicBatches(arrays, 8, seed=5)
  np.testing.assert_array_equal(batches.batch(3, slice(4, 8))["x"], batches.batch(3)["x"][4:8])
  g = p.make_global_batch(batches.batch(3), 8)
  assert g["x"].shape == (8, 2) and g["x"].sharding == p.data_sharding
  with pytest.raises(
      ValueError, match=r"gives 4 rows, its share of the global batch of 8 is "
      r"rows 0:8"):
    p.make_global_batch(batches.batch(3, slice(0, 4)), 8)
  with pytest.raises(ValueError, match="batch size must be positive"):
    utils.DeterministicBatches(arrays, 0)
