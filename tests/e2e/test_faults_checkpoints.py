"""The mains on faulty checkpoints and output folders, each run as users run
it, in a fresh process, with a very small model and a few steps on real MCWQ text: a disk that
fills up while a checkpoint is written, a corrupt newest checkpoint (eval falls back, a resumed
run moves it aside), a checkpoint folder without checkpoint files, the metric rows of a resumed
run, a MODEL_DIR trained again for another task, a non-finite update, an unwritable
EVAL_OUTPUT_DIR or one holding a training's results, a second training of a MODEL_DIR in use, a
SIGTERM (a scheduler's preemption notice)."""
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import socket
import sys

import numpy as np
import pytest

from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import run_lock
import mains
import tiny_engine

TINY = "gin/mcwq_t5x/tiny_random_split_en.gin"
MODEL = "gin/mcwq_t5x/models/tiny.gin"
RUN = mains.SMALL_MODEL + [
    "TASK_FEATURE_LENGTHS = {'inputs': 40, 'targets': 128}", "BATCH_SIZE = 8",
    "LOG_EVERY_STEPS = 1", "CHECKPOINT_PERIOD = 1", "EVAL_PERIOD = 0",
    "FINAL_EVAL_NUM_EXAMPLES = 4", "INFER_BATCH_SIZE = 4", "WARMUP_STEPS = 2",
    "HOST_DEVICE_COUNT = 2", "TRAIN_STEPS = 4", "KEEP_CHECKPOINTS = 2",
    "MIXTURE_OR_TASK_NAME = 'mcwq_gold_he'", "TRAIN_SPLIT = 'test'", "EVAL_SPLIT = 'test'",
    "FINAL_EVAL_SPLIT = 'test'"
] + [
    # why: no start-up timing of 2048x2048 matmuls (seconds of CPU in each training process); no
    # test here reads the peak (test_mains reads the session run's)
    "train_script.train.measure_matmul_peak = False"
]
# `python -m mcwq_t5x.train` whose disk fills up just before checkpoint_4 is written: a file fills
# the small tmpfs that holds MODEL_DIR but for 64 KiB, so TensorStore's array writes fail as on a
# real full disk (ValueError RESOURCE_EXHAUSTED, with writes still in flight).
FILL_DISK_AT_4 = """
import os, shutil, sys
import orbax.checkpoint as ocp
save = ocp.CheckpointManager.save
def fill_disk_at_4(self, step, *args, **kwargs):
  if step == 4:
    folder = os.path.dirname(str(self.directory))
    with open(os.path.join(folder, "ballast"), "wb") as f:
      while shutil.disk_usage(folder).free > 64 << 10:
        f.write(bytes(64 << 10))
        f.flush()
  return save(self, step, *args, **kwargs)
ocp.CheckpointManager.save = fill_disk_at_4
from mcwq_t5x import train
train.main(sys.argv[1:])
"""
# Where no tmpfs can be mounted: Orbax's writer of the `data/` item fails in the background with
# the OSError of a write on a full disk.
DISK_FULL_AT_4 = """
import errno, sys
import orbax.checkpoint as ocp
write = ocp.JsonCheckpointHandler._save_fn
async def disk_full_at_4(self, x, directory):
  if "checkpoint_4" in str(directory):
    raise OSError(errno.ENOSPC, "No space left on device")
  return await write(self, x, directory)
ocp.JsonCheckpointHandler._save_fn = disk_full_at_4
from mcwq_t5x import train
train.main(sys.argv[1:])
"""


def train_args(model_dir):
  return [f"--gin_file={TINY}", *mains.gin_flags(RUN + [f"MODEL_DIR = '{model_dir}'"])]


def steps_of(path):
  return [json.loads(l)["step"] for l in pathlib.Path(path).read_text().splitlines()]


@pytest.fixture(scope="module")
def disk_full_run(tmp_path_factory, mcwq_dir):
  """A 4-step run (a checkpoint every step, the last 2 kept) whose disk fills up while it writes
  checkpoint_4: (model_dir, the finished process, the MODEL_DIR it ran in). In a 32 MiB tmpfs
  (`mains.in_a_mount_namespace`; MODEL_DIR copied out to model_dir afterwards) where one can be mounted,
  else with a failure injected into Orbax's writer. Read-only for the tests: copy it to change
  it."""
  del mcwq_dir  # the real data must be there
  model_dir = tmp_path_factory.mktemp("disk_full_run") / "run"
  mount = tmp_path_factory.mktemp("disk_full_tmpfs")
  ran_in = mount / "run"
  prefix = mains.in_a_mount_namespace(
      f"mount -t tmpfs -o size=32m tmpfs {shlex.quote(str(mount))}",
      after=f"cp -a {shlex.quote(str(ran_in))} {shlex.quote(str(model_dir))}")
  if prefix is None:
    out = mains.run([sys.executable, "-c", DISK_FULL_AT_4, *train_args(model_dir)], check=False)
    return model_dir, out, model_dir
  out = mains.run([*prefix, sys.executable, "-c", FILL_DISK_AT_4, *train_args(ran_in)], check=False)
  return model_dir, out, ran_in


def copy_of(run, tmp_path):
  shutil.copytree(run, tmp_path / "run")
  return tmp_path / "run"


def test_disk_full_ends_with_one_clear_line(disk_full_run):
  """The one line says what happened and what to do; nothing after it, and no traceback of
  Orbax's writes in flight; the last good checkpoint is kept and can be read."""
  model_dir, out, ran_in = disk_full_run
  assert out.returncode == 1, out.stderr[-3000:]
  last = out.stderr.strip().splitlines()[-1]
  assert re.fullmatch(
      rf"CheckpointSaveError: writing checkpoint {ran_in}/checkpoint_4 failed: no space left on "
      r"device \((ValueError: RESOURCE_EXHAUSTED: |OSError: \[Errno 28\] )[^\n]*No space left on "
      rf"device[^\n]*\); the last good checkpoint is {ran_in}/checkpoint_3; free disk space, then "
      "rerun the same command to resume", last), out.stderr[-3000:]
  # The process exits cleanly: no save left running at interpreter shutdown, no traceback.
  for noise in ("sys.meta_path is None", "Exception ignored", "Fatal Python error", "Traceback",
                "never retrieved", "Event loop is closed"):
    assert noise not in out.stderr, out.stderr[-3000:]
  assert checkpoint_paths.finished_steps(model_dir) == [2, 3]  # read by the infer test below


# `python -m mcwq_t5x.infer` whose files cannot grow past 64 bytes (RLIMIT_FSIZE, SIGXFSZ ignored):
# a write past that fails with EFBIG as one on a full disk fails with ENOSPC, with no mount.
SMALL_FILES = """
import resource, runpy, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))
runpy.run_module("mcwq_t5x.infer", run_name="__main__", alter_sys=True)
"""


def test_infer_output_on_a_full_disk_keeps_the_previous_file(disk_full_run, tmp_path):
  """`infer --output` decodes with the run's last good checkpoint (checkpoint_3, read back after
  the full disk), then cannot write its queries: the previous file is kept whole, no temporary
  file is left, and one line says so."""
  output = tmp_path / "queries.txt"
  output.write_text("the previous queries\n")
  out = mains.run(
      [
          sys.executable, "-c", SMALL_FILES, f"--gin_file={MODEL}",
          "--gin_file=gin/mcwq_t5x/runs/infer.gin", f"--gin.CHECKPOINT_PATH='{disk_full_run[0]}'",
          "--gin.MAX_DECODE_LENGTH=16", "--sparql", f"--output={output}",
          *mains.gin_flags(mains.SMALL_MODEL)
      ],
      input="Did M0 direct M1\n" * 8,
      # why: the limit would cut the compilation cache's entries too
      env={"MCWQ_T5X_COMPILATION_CACHE": "off"},
      unset=["JAX_COMPILATION_CACHE_DIR"],
      check=False)
  assert out.returncode == 1, out.stderr[-3000:]
  assert out.stderr.strip().splitlines()[-1] == (
      f"ResultWriteError: cannot write {output}: File too large (EFBIG); nothing was written (the "
      "previous queries.txt, if any, is unchanged)"), out.stderr[-3000:]
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  assert output.read_text() == "the previous queries\n"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["queries.txt"]


@pytest.fixture(scope="module")
def resumed_run(disk_full_run, tmp_path_factory):
  """`disk_full_run` with its checkpoint_3 corrupted, resumed to its end (final evaluation
  included): (model_dir, the finished process). Read-only for the tests: copy it to change it."""
  model_dir = copy_of(disk_full_run[0], tmp_path_factory.mktemp("resumed_run"))
  assert steps_of(model_dir / "train_metrics.jsonl") == [1, 2, 3, 4]
  tiny_engine.corrupt_checkpoint(model_dir / "checkpoint_3")
  return model_dir, mains.python_m("mcwq_t5x.train", *train_args(model_dir))


def test_resume_past_a_corrupt_checkpoint(resumed_run):
  """Resumed past a corrupt checkpoint_3 (from checkpoint_2): checkpoint_3 is moved aside and
  written anew, retention keeps readable checkpoints, and the metric rows of steps 3-4, logged
  before the run stopped, are not written twice."""
  model_dir, out = resumed_run
  assert "resumed from checkpoint 2 after skipping corrupt" in out.stderr
  assert steps_of(model_dir / "train_metrics.jsonl") == [1, 2, 3, 4]
  assert checkpoint_paths.finished_steps(model_dir) == [3, 4]
  assert len(list(model_dir.glob("checkpoint_3.corrupt-*"))) == 1
  assert json.loads((model_dir / "metrics/mcwq_gold_he_test.json").read_text())["step"] == 4


def test_a_run_folder_is_not_resumed_for_another_task(disk_full_run, tmp_path):
  """The MODEL_DIR of a run on mcwq_gold_he/test, trained again for mcwq_gold_zh: refused with one
  line naming both (resuming would decode the Hebrew model as the Chinese one's result), before
  its run.json and config.gin change."""
  model_dir = copy_of(disk_full_run[0], tmp_path)
  before = {name: (model_dir / name).read_text() for name in ("run.json", "config.gin")}
  out = mains.python_m(
      "mcwq_t5x.train",
      *train_args(model_dir),
      *mains.gin_flags(["MIXTURE_OR_TASK_NAME = 'mcwq_gold_zh'"]),
      check=False)
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  assert out.stderr.rstrip().splitlines()[-1] == (
      f"OtherTrainingDataError: MODEL_DIR {model_dir} holds a training on mcwq_gold_he/test (its "
      "run.json; newest checkpoint checkpoint_3), this run asks for mcwq_gold_zh/test: resuming "
      "would go on from that model and report it as one of mcwq_gold_zh. Give this run another "
      f"MODEL_DIR; to fine-tune from that run, also set INITIAL_CHECKPOINT_PATH = '{model_dir}' "
      "(its newest checkpoint's parameters, a fresh optimizer state)"), out.stderr[-3000:]
  assert {name: (model_dir / name).read_text() for name in before} == before
  assert not (model_dir / "metrics").exists()


def test_a_non_finite_update_is_never_saved_and_ends_with_one_line(tmp_path):
  """A learning rate of 1e39 (Inf in float32) gives the first update a finite loss and gradient
  but NaN parameters: no checkpoint of them (it was saved and named as the one to resume from),
  and one last line saying what to do."""
  model_dir = tmp_path / "run"
  out = mains.python_m(
      "mcwq_t5x.train",
      *train_args(model_dir),
      *mains.gin_flags(["LEARNING_RATE = 1e39", "WARMUP_STEPS = 0", "LR_SCHEDULE = 'constant'"]),
      check=False)
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  assert re.fullmatch(
      r"NonFiniteLossError: non-finite loss, gradient or update at step 0 \(loss sum=[0-9.e+]+, "
      r"grad norm=[0-9.e+]+\); the train state was not updated; no checkpoint had been written: "
      r"lower LEARNING_RATE \(or set GRAD_CLIP_NORM\) and rerun",
      out.stderr.rstrip().splitlines()[-1]), out.stderr[-3000:]
  assert checkpoint_paths.finished_steps(model_dir) == []


def test_eval_never_replaces_a_trainings_own_results(resumed_run, tmp_path):
  """EVAL_OUTPUT_DIR = the training's MODEL_DIR: its final evaluation's predictions of the split
  would be replaced by the eval's (4 lines here, 6,282 in a real run): refused in one line before
  anything is loaded, the files unchanged."""
  model_dir = copy_of(resumed_run[0], tmp_path)
  results = [
      model_dir / "predictions/mcwq_gold_he_test.txt", model_dir / "metrics/mcwq_gold_he_test.json"
  ]
  before = [f.read_text() for f in results]
  out = mains.python_m(
      "mcwq_t5x.eval", *eval_args(model_dir / "checkpoint_2", model_dir), check=False)
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  assert out.stderr.rstrip().splitlines()[-1] == (
      f"TrainingResultsError: EVAL_OUTPUT_DIR {model_dir} is a training run's MODEL_DIR, and "
      f"{results[0]} with {results[1]} are its final evaluation of mcwq_gold_he/test: this eval "
      f"would replace them. Leave EVAL_OUTPUT_DIR unset (it is then {model_dir}/eval_<step>) or "
      "give another folder"), out.stderr[-3000:]
  assert [f.read_text() for f in results] == before
  assert "restored the parameters" not in out.stderr  # refused before the checkpoint was read


def eval_args(checkpoint_path, output_dir):
  return [
      f"--gin_file={MODEL}", "--gin_file=gin/mcwq_t5x/runs/eval.gin",
      *mains.gin_flags(mains.SMALL_MODEL + [
          "MIXTURE_OR_TASK_NAME = 'mcwq_gold_he'", f"CHECKPOINT_PATH = '{checkpoint_path}'",
          "NUM_EXAMPLES = 4", f"EVAL_OUTPUT_DIR = '{output_dir}'", "BATCH_SIZE = 4"
      ])
  ]


def test_eval_of_a_run_folder_skips_its_corrupt_newest_checkpoint(disk_full_run, tmp_path):
  model_dir = copy_of(disk_full_run[0], tmp_path)
  tiny_engine.corrupt_checkpoint(model_dir / "checkpoint_3")
  out = mains.python_m("mcwq_t5x.eval", *eval_args(model_dir, tmp_path / "eval"))
  assert f"checkpoint {model_dir}/checkpoint_3 is unreadable" in out.stderr
  metrics = json.loads((tmp_path / "eval/metrics/mcwq_gold_he_test.json").read_text())
  assert metrics["step"] == 2 and metrics["num_examples"] == 4


def test_eval_of_a_run_folder_whose_checkpoints_are_all_unreadable_is_one_line(
    disk_full_run, tmp_path):
  """Every checkpoint of the CHECKPOINT_PATH folder corrupt: eval stops with one last line naming
  each unreadable checkpoint and what to do, and no traceback (TensorStore's other reads of a
  failed restore call back into its closed loop: dropped). A resumed training's same error is one
  line too, but Orbax's other reads may log asyncio's "exception was never retrieved" tracebacks
  before it (CHANGELOG, 2026-12-08), so it is not tested here."""
  model_dir = copy_of(disk_full_run[0], tmp_path)
  for step in (2, 3):
    tiny_engine.corrupt_checkpoint(model_dir / f"checkpoint_{step}")
  out = mains.python_m("mcwq_t5x.eval", *eval_args(model_dir, tmp_path / "eval"), check=False)
  assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  last = out.stderr.rstrip().splitlines()[-1]
  assert last.startswith(f"NoUsableCheckpointError: no checkpoint in {model_dir} could be read: "
                         f"checkpoint {model_dir}/checkpoint_3 is unreadable ("), last
  assert f"; checkpoint {model_dir}/checkpoint_2 is unreadable (" in last
  assert last.endswith("; name a readable checkpoint_<step> folder"), last


def test_eval_checks_its_output_folder_before_loading(tmp_path):
  """An EVAL_OUTPUT_DIR that cannot be written (under a regular file: even root cannot) fails
  before the checkpoint (here: none at all) is read and anything is decoded."""
  (tmp_path / "file").write_text("")
  out = mains.python_m(
      "mcwq_t5x.eval", *eval_args(tmp_path / "no_checkpoint", tmp_path / "file/out"), check=False)
  assert out.returncode == 1
  assert (
      f"mcwq_t5x.evaluation.prediction.UnwritableOutputError: cannot write to the EVAL_OUTPUT_DIR "
      f"{tmp_path}/file/out (NotADirectoryError: ") in out.stderr, out.stderr[-3000:]
  assert "no checkpoint" not in out.stderr


@pytest.mark.parametrize("main", ["infer", "eval", "train"])
def test_a_checkpoint_folder_without_checkpoint_files_is_one_line(main, tmp_path):
  """A `checkpoint_<step>` folder that is empty (infer; train's INITIAL_CHECKPOINT_PATH, checked
  before the data and the compile) or holds no checkpoint files (eval): exit 1 and one last line
  naming the folder and what is missing (no traceback of `checkpoint_paths.locate`'s
  ValueError)."""
  folder = tmp_path / "run/checkpoint_5"
  folder.mkdir(parents=True)
  if main == "eval":
    (folder / "notes.txt").write_text("")
    args = eval_args(folder, tmp_path / "eval")
  elif main == "train":
    args = [
        f"--gin_file={TINY}", *mains.gin_flags(
            RUN + [f"MODEL_DIR = '{tmp_path / 'new'}'", f"INITIAL_CHECKPOINT_PATH = '{folder}'"])
    ]
  else:
    args = [
        f"--gin_file={MODEL}", "--gin_file=gin/mcwq_t5x/runs/infer.gin",
        f"--gin.CHECKPOINT_PATH='{folder}'", *mains.gin_flags(mains.SMALL_MODEL)
    ]
  out = mains.python_m(f"mcwq_t5x.{main}", *args, input="Did M0 direct M1\n", check=False)
  assert out.returncode == 1 and out.stdout == "", out.stderr[-3000:]
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  holds = ("the folder is empty"
           if main != "eval" else "the folder holds no checkpoint files (it has: notes.txt)")
  assert out.stderr.rstrip().splitlines()[-1] == (
      f"NotACheckpointError: {folder}: not a checkpoint: {holds}; expected its 'state/' Orbax "
      "item (mcwq_t5x.train, t5x.train) or a 'checkpoint' msgpack file (T5X)"), out.stderr[-3000:]


HOLD_EVAL_LOCK = """
import sys, time
from mcwq_t5x.checkpointing import run_lock
with run_lock.hold(sys.argv[1], run_lock.EVAL_LOCK_FILE):
  print("held", flush=True)
  time.sleep(600)
"""


def test_a_second_eval_into_one_output_dir_is_refused_naming_the_first(tmp_path):
  """Two evals into one EVAL_OUTPUT_DIR overwrite (or interleave) each other's files: the second
  stops at once, before reading a checkpoint (here: none at all), naming the first."""
  out_dir = tmp_path / "eval"
  log = tmp_path / "holder.log"
  holder = mains.start([sys.executable, "-c", HOLD_EVAL_LOCK, str(out_dir)], log)
  try:
    mains.wait_for_line(log, "^held$", holder)
    out = mains.python_m(
        "mcwq_t5x.eval", *eval_args(tmp_path / "no_checkpoint", out_dir), check=False)
  finally:
    holder.kill()
    holder.wait()
  assert out.returncode == 1, out.stderr[-3000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith(
      f"EvalOutputDirInUseError: EVAL_OUTPUT_DIR {out_dir} is in use by another eval: process "
      f"{holder.pid} on host {socket.gethostname()}, started "), last
  assert last.endswith(
      f"(python -c {out_dir}) holds {out_dir}/eval.lock. Two evals of one "
      "EVAL_OUTPUT_DIR overwrite each other's predictions and metrics: wait for "
      "that run to end (or stop it), or give this one another EVAL_OUTPUT_DIR"), last
  assert "no checkpoint" not in out.stderr  # refused before anything was loaded
  assert not (out_dir / "predictions").exists()


# --- Two trainings of one MODEL_DIR; SIGTERM -----------------------------------------------------
LONG = ["TRAIN_STEPS = 1000", "CHECKPOINT_PERIOD = 1000"]  # long enough to be interrupted


def long_args(model_dir, *bindings):
  return train_args(model_dir) + mains.gin_flags(LONG + list(bindings))


def losses_of(model_dir):
  rows = (pathlib.Path(model_dir) / "train_metrics.jsonl").read_text().splitlines()
  return {r["step"]: r["loss"] for r in map(json.loads, rows)}


@pytest.fixture(scope="module")
def preempted_run(tmp_path_factory, mcwq_dir):
  """A 1000-step run (a checkpoint every 1000 steps, none asked for before) that a second
  training of its MODEL_DIR tries to join once it has logged step 2 (the first paused meanwhile),
  then SIGTERM'd as a scheduler does: (model_dir, first process's pid, its exit status and log,
  the second's outcome).
  Read-only for the tests: copy it to change it."""
  del mcwq_dir  # the real data must be there
  folder = tmp_path_factory.mktemp("preempted_run")
  model_dir, log = folder / "run", folder / "first.log"
  first = mains.start([sys.executable, "-m", "mcwq_t5x.train", *long_args(model_dir)], log)
  try:
    mains.wait_for_line(log, r"INFO step 2/1000", first)
    # why: paused (alive, its lock held) while the second starts, instead of training on for the
    # second's whole start-up; the SIGTERM waits until it continues.
    first.send_signal(signal.SIGSTOP)
    try:
      second = mains.python_m("mcwq_t5x.train", *long_args(model_dir), check=False)
      first.send_signal(signal.SIGTERM)
    finally:
      first.send_signal(signal.SIGCONT)
    first.wait(timeout=600)
  finally:
    if first.poll() is None:
      first.kill()
  return model_dir, first.pid, first.returncode, log.read_text(), second


def test_a_second_training_of_a_model_dir_is_refused_naming_the_first(preempted_run):
  """Two trainings of one MODEL_DIR corrupt each other silently (both exit 0, interleaved metric
  rows, each deleting the other's checkpoints): the second stops at once, naming the folder and
  the process that holds it; the first's rows and checkpoints are its own."""
  model_dir, pid, _, _, second = preempted_run
  assert second.returncode == 1, second.stderr[-3000:]
  last = second.stderr.strip().splitlines()[-1]
  assert last.startswith(
      f"ModelDirInUseError: MODEL_DIR {model_dir} is in use by another training: process {pid} on "
      f"host {socket.gethostname()}, started "), last
  assert f"(python -m mcwq_t5x.train --gin_file={TINY} " in last
  assert last.endswith(f"holds {model_dir}/train.lock. Two trainings of one MODEL_DIR overwrite "
                       "each other's checkpoints and metrics: wait for that run to end (or stop "
                       "it), or give this one another MODEL_DIR"), last
  assert "model: " not in second.stderr  # refused before it built anything
  steps = steps_of(model_dir / "train_metrics.jsonl")
  assert steps == list(range(1, len(steps) + 1))


def test_sigterm_saves_at_the_next_step_and_the_resumed_run_has_the_same_losses(
    preempted_run, tmp_path):
  """SIGTERM: a checkpoint at the next step boundary (the only one: none at step 1 either), one
  last line saying so, exit status 143; the same command resumes from it, and its losses are
  those of a run never interrupted."""
  model_dir, _, returncode, log, _ = preempted_run
  assert returncode == 143, log[-3000:]
  match = re.fullmatch(
      f"Preempted: SIGTERM received: saved checkpoint {model_dir}/checkpoint_(\\d+) at step "
      r"(\d+) of 1000 and stopped; rerun the same command \(every process of a multi-process run\) "
      "to resume from it",
      log.strip().splitlines()[-1])
  assert match and match.group(1) == match.group(2), log[-3000:]
  step = int(match.group(1))
  assert step >= 2 and checkpoint_paths.finished_steps(model_dir) == [step]
  assert steps_of(model_dir / "train_metrics.jsonl") == list(range(1, step + 1))
  resumed = copy_of(model_dir, tmp_path)
  stop = [f"train_script.train.stop_after_steps = {step + 2}"]
  out = mains.python_m("mcwq_t5x.train", *long_args(resumed, *stop))
  assert f"resumed from {resumed}/checkpoint_{step}" in out.stderr
  reference = tmp_path / "uninterrupted"
  mains.python_m("mcwq_t5x.train", *long_args(reference, *stop))
  got, want = losses_of(resumed), losses_of(reference)
  assert sorted(got) == sorted(want) == list(range(1, step + 3))
  np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(want)],
                             rtol=1e-6)


HOLD_LOCK = """
import sys, time
from mcwq_t5x.checkpointing import run_lock
with run_lock.hold(sys.argv[1]):
  print("held", flush=True)
  time.sleep(600)
"""


def test_model_dir_lock_names_its_holder_and_dies_with_it(tmp_path):
  """The lock names the process that holds it; a holder killed with SIGKILL leaves no lock."""
  log = tmp_path / "holder.log"
  holder = mains.start([sys.executable, "-c", HOLD_LOCK, str(tmp_path / "run")], log)
  try:
    mains.wait_for_line(log, "^held$", holder)
    with pytest.raises(run_lock.ModelDirInUseError) as e:
      with run_lock.hold(tmp_path / "run"):
        pass
    assert f"is in use by another training: process {holder.pid} on host " in str(e.value)
    assert f"(python -c {tmp_path}/run) holds {tmp_path}/run/train.lock" in str(e.value)
  finally:
    holder.kill()
    holder.wait()
  with run_lock.hold(tmp_path / "run") as info:
    assert info["pid"] == os.getpid() and info["host"] == socket.gethostname()
  with run_lock.hold(tmp_path / "run"):  # released when the `with` block ends
    pass
