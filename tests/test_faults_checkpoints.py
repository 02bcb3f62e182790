"""The mains on faulty checkpoints and output folders, each run as users run
it, in a fresh process, with a very small model and a few steps on real MCWQ text: a disk that
fills up while a checkpoint is written, a corrupt newest checkpoint (eval falls back, a resumed
run moves it aside), the metric rows of a resumed run, an unwritable EVAL_OUTPUT_DIR."""
import json
import pathlib
import shutil
import sys

import pytest

from mcwq_t5x.checkpointing import checkpoint_paths
import mains
from test_checkpoints import _corrupt

TINY = "gin/mcwq_t5x/tiny_random_split_en.gin"
MODEL = "gin/mcwq_t5x/models/tiny.gin"
RUN = mains.SMALL_MODEL + [
    "TASK_FEATURE_LENGTHS = {'inputs': 40, 'targets': 128}", "BATCH_SIZE = 8",
    "LOG_EVERY_STEPS = 1", "CHECKPOINT_PERIOD = 1", "EVAL_PERIOD = 0",
    "FINAL_EVAL_NUM_EXAMPLES = 4", "INFER_BATCH_SIZE = 4", "WARMUP_STEPS = 2",
    "HOST_DEVICE_COUNT = 2", "TRAIN_STEPS = 4", "KEEP_CHECKPOINTS = 2",
    "MIXTURE_OR_TASK_NAME = 'mcwq_gold_he'", "TRAIN_SPLIT = 'test'", "EVAL_SPLIT = 'test'",
    "FINAL_EVAL_SPLIT = 'test'"
]
# `python -m mcwq_t5x.train` whose disk is full when checkpoint_4 is written: Orbax's writer of
# the `data/` item fails in the background, as a write on a full disk does.
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
  checkpoint_4: (model_dir, the finished process). Read-only for the tests: copy it to change it."""
  del mcwq_dir  # the real data must be there
  model_dir = tmp_path_factory.mktemp("disk_full_run")
  out = mains.run([sys.executable, "-c", DISK_FULL_AT_4, *train_args(model_dir)], check=False)
  return model_dir, out


def copy_of(run, tmp_path):
  shutil.copytree(run, tmp_path / "run")
  return tmp_path / "run"


def test_disk_full_ends_with_one_clear_line(disk_full_run):
  model_dir, out = disk_full_run
  assert out.returncode == 1, out.stderr[-3000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last == (f"CheckpointSaveError: writing checkpoint "
                  f"{model_dir}/checkpoint_4 failed (OSError: [Errno 28] No space left on device); "
                  f"the last good checkpoint is {model_dir}/checkpoint_3; free disk space, then "
                  "rerun the same command to resume"), out.stderr[-3000:]
  # The process exits cleanly: no save left running at interpreter shutdown.
  for noise in ("sys.meta_path is None", "Exception ignored", "Fatal Python error"):
    assert noise not in out.stderr
  assert checkpoint_paths.finished_steps(model_dir) == [2, 3]


def test_resume_past_a_corrupt_checkpoint(disk_full_run, tmp_path):
  """Resumed past a corrupt checkpoint_3 (from checkpoint_2): checkpoint_3 is moved aside and
  written anew, retention keeps readable checkpoints, and the metric rows of steps 3-4, logged
  before the run stopped, are not written twice."""
  model_dir = copy_of(disk_full_run[0], tmp_path)
  assert steps_of(model_dir / "train_metrics.jsonl") == [1, 2, 3, 4]
  _corrupt(model_dir / "checkpoint_3")
  out = mains.python_m("mcwq_t5x.train", *train_args(model_dir))
  assert "resumed from checkpoint 2 after skipping corrupt" in out.stderr
  assert steps_of(model_dir / "train_metrics.jsonl") == [1, 2, 3, 4]
  assert checkpoint_paths.finished_steps(model_dir) == [3, 4]
  assert len(list(model_dir.glob("checkpoint_3.corrupt-*"))) == 1
  assert json.loads((model_dir / "metrics/mcwq_gold_he_test.json").read_text())["step"] == 4


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
  _corrupt(model_dir / "checkpoint_3")
  out = mains.python_m("mcwq_t5x.eval", *eval_args(model_dir, tmp_path / "eval"))
  assert f"checkpoint {model_dir}/checkpoint_3 is unreadable" in out.stderr
  metrics = json.loads((tmp_path / "eval/metrics/mcwq_gold_he_test.json").read_text())
  assert metrics["step"] == 2 and metrics["num_examples"] == 4


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
