"""The training main in this process (`mcwq_t5x.train`): the gin files' macros reach the grouped
checkpoint and decoding configs, a Python caller's shorthand, the run folder's preparation and the
resume command; the tiny job selects no checkpoint; configuration errors are clear (through gin,
with the session run's settings on the 155 Hebrew gold questions: `scenarios.OUR_RUN`); an early
stop closes the metric writers; a non-finite loss names the last good checkpoint; a MODEL_DIR of
the user's files keeps its config.gin, which a training writes whole or not at all; refused before
anything is trained: KEEP_CHECKPOINTS = 0, a MODEL_DIR of another task, an example too long to
decode, a batch size the devices cannot share; the errors the main prints as one line.

The parts alone: tests/unit/data/test_training_data.py, tests/unit/checkpointing/
(test_train_state_init, test_train_loop), tests/unit/evaluation/test_training_eval.py. The mains as
users run them, in fresh processes: tests/e2e/ (test_mains, test_faults_checkpoints,
test_multiprocess, test_readme)."""
import logging

import gin
import numpy as np
import pytest

from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import checkpoints
from mcwq_t5x.checkpointing import run_folder
from mcwq_t5x.checkpointing import train_state_init
from mcwq_t5x.data import paths
from mcwq_t5x.data import pipeline
from mcwq_t5x.data import training_data
from mcwq_t5x.data import writers
from mcwq_t5x.engine import partitioning
from mcwq_t5x.engine import trainer as trainer_lib
from mcwq_t5x.evaluation import prediction
from mcwq_t5x.evaluation import training_eval
from mcwq_t5x import train as train_lib
import mains
import scenarios

TINY = "gin/mcwq_t5x/tiny_random_split_en.gin"
# why: the float32 matmul peak (six 2048x2048 matmuls, for the step log's share of it) is no part
# of what these in-process runs check; the commands' runs time it (tests/e2e/).
RUN = mains.SMALL_MODEL + scenarios.OUR_RUN + ["train_script.train.measure_matmul_peak = False"]


def test_the_macros_reach_the_grouped_configs():
  """Every checkpoint and decoding macro of the run files sets its field of the configs that
  `train` receives (T5X's grouping), and the overrides of a command line win."""
  fn = mains.configured(train_lib, "train", [TINY], [
      "CHECKPOINT_PERIOD = 7", "KEEP_CHECKPOINTS = None", "METRIC_NAME_TO_MONITOR = 'x/loss'",
      "METRIC_MODE = 'max'", "INITIAL_CHECKPOINT_PATH = '/ckpt'", "RESUME_PARAMS_ONLY = True",
      "INFER_EVAL_NUM_EXAMPLES = 9", "INFER_BATCH_SIZE = 12", "NUM_DECODES = 4",
      "FINAL_EVAL_NUM_EXAMPLES = 33", "EVAL_PERIOD = 11", "EVAL_STEPS = 3"
  ])
  del fn
  try:
    with gin.unlock_config():
      ckpt = gin.get_configurable(train_state_init.CheckpointConfig)()
      evaluation = gin.get_configurable(training_eval.EvaluationConfig)()
    assert ckpt == train_state_init.CheckpointConfig(
        train_state_init.SaveCheckpointConfig(7, None, "x/loss", "max"),
        train_state_init.RestoreCheckpointConfig("/ckpt", True))
    assert evaluation == training_eval.EvaluationConfig(9, 12, {"num_decodes": 4}, 33)
    assert [
        repr(gin.query_parameter(f"train_script.train.{name}"))
        for name in ("eval_period", "eval_steps")
    ] == ["%EVAL_PERIOD", "%EVAL_STEPS"]
  finally:
    gin.clear_config()


def test_a_python_callers_checkpoint_shorthand():
  cfg = train_state_init.CheckpointConfig(
      train_state_init.SaveCheckpointConfig(period=5, keep=2, metric_name_to_monitor="m"))
  assert train_lib._checkpoint_config(cfg, None, None) is cfg  # pylint: disable=protected-access
  changed = train_lib._checkpoint_config(cfg, 10**9, 1)  # pylint: disable=protected-access
  assert (changed.save.period, changed.save.keep, changed.save.metric_name_to_monitor) == (10**9, 1,
                                                                                           "m")
  assert train_lib._checkpoint_config(None, None, 4).save.keep == 4  # pylint: disable=protected-access


def test_prepare_model_dir_writes_the_operative_config(tmp_path, caplog):
  mains.configured(train_lib, "train", [TINY], ["TRAIN_STEPS = 3"])
  try:
    cfg = pipeline.DatasetConfig("mcwq_gold_he", None, "test", 8)
    with caplog.at_level(logging.WARNING):
      out = train_lib.prepare_model_dir(
          str(tmp_path / "run"), cfg, train_state_init.RestoreCheckpointConfig(), "a note")
    assert out == (tmp_path / "run").absolute()
    assert (out / "config.gin").read_text() == train_lib.CONFIG_GIN_HEADER + gin.config_str()
    assert "NOTE: a note" in caplog.text and "training on split 'test' of mcwq_gold_he" in caplog.text
    with pytest.raises(checkpoint_paths.INPUT_ERRORS, match="no_such_checkpoint"):
      train_lib.prepare_model_dir(
          str(tmp_path / "other"), cfg,
          train_state_init.RestoreCheckpointConfig(path=str(tmp_path / "no_such_checkpoint")))
    assert not (tmp_path / "other" / "config.gin").exists()  # refused before it wrote anything
  finally:
    gin.clear_config()


def test_the_resume_command():
  assert train_lib.command_line([
      "--gin_file=a b.gin", "--gin.MODEL_DIR='x'"
  ]) == ("python -m mcwq_t5x.train '--gin_file=a b.gin' '--gin.MODEL_DIR='\"'\"'x'\"'\"''")


def test_tiny_job_selects_no_checkpoint():
  """The tiny job has no held-out dev (EVAL_SPLIT is test): it decodes its last checkpoint."""
  fn = mains.configured(train_lib, "train", [TINY], mains.SMALL_MODEL)
  try:
    assert gin.query_parameter("%EVAL_SPLIT") == gin.query_parameter("%FINAL_EVAL_SPLIT") == "test"
    assert gin.query_parameter("%METRIC_NAME_TO_MONITOR") is None
    assert "monitoring only" in gin.query_parameter("%RUN_NOTE")
  finally:
    gin.clear_config()
  del fn


# --- configuration errors, through gin in this process -----------------------------------------
def configured_train(model_dir, *extra):
  return mains.configured(train_lib, "train", [TINY], RUN + [f"MODEL_DIR = '{model_dir}'", *extra])


def test_unknown_task_names_the_closest(tmp_path):
  with pytest.raises(
      ValueError, match="unknown task or mixture 'mcwq_mcd9_en'.*closest.*mcwq_mcd1_en"):
    configured_train(tmp_path, "MIXTURE_OR_TASK_NAME = 'mcwq_mcd9_en'")()


def test_missing_data_dir(tmp_path, monkeypatch):
  monkeypatch.setenv("MCWQ_DATA_DIR", str(tmp_path / "no_such_dir"))
  with pytest.raises(paths.DataNotFoundError, match="no_such_dir"):
    configured_train(tmp_path / "run")()


def test_vocab_model_size_mismatch(tmp_path):
  with pytest.raises(
      ValueError, match="vocabulary/model mismatch.*2000 pieces.*vocab_size is 1000"):
    configured_train(tmp_path, "network.get_config.vocab_size = 1000")()


def test_early_stop_closes_the_metric_writers(tmp_path, monkeypatch):
  """`stop_after_steps`: the run returns after its checkpoint, without the final evaluation, and
  its TensorBoard writers are closed (their events, the evaluation's too, are on disk)."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  writers = []
  create = run_folder.create_metric_writer
  monkeypatch.setattr(run_folder, "create_metric_writer",
                      lambda logdir: writers.append(create(logdir)) or writers[-1])
  run = configured_train(tmp_path, "EVAL_PERIOD = 2", "LOG_EVERY_STEPS = 2",
                         "INFER_EVAL_NUM_EXAMPLES = 2")
  result = run(stop_after_steps=2)
  assert result["step"] == 2 and result["final_eval"] == {}
  assert checkpoint_paths.finished_steps(tmp_path)[-1] == 2
  assert len(writers) == 2 and all(w._writer is None for w in writers)  # pylint: disable=protected-access
  for run, tag in (("train", "loss"), ("eval", "training_eval/loss")):
    acc = event_accumulator.EventAccumulator(str(tmp_path / run))
    acc.Reload()
    assert [e.step for e in acc.Scalars(tag)] == [2], run


def test_nan_loss_stops_and_says_which_checkpoint_is_good(tmp_path, caplog):
  """An absurd learning rate blows the weights up: the loss of step 2 is not finite."""
  with pytest.raises(trainer_lib.NonFiniteLossError, match="non-finite loss"):
    configured_train(tmp_path, "OPTIMIZER = 'adamw'", "LEARNING_RATE = 1e30", "WARMUP_STEPS = 0",
                     "CHECKPOINT_PERIOD = 1", "LR_SCHEDULE = 'constant'", "EVAL_PERIOD = 0")()
  steps = checkpoint_paths.finished_steps(tmp_path)
  assert steps and steps[-1] < 4
  assert f"the last good checkpoint is step {steps[-1]}" in caplog.text
  curve = mains.train_losses(tmp_path) if (tmp_path / "train_metrics.jsonl").exists() else {}
  assert all(np.isfinite(v) for v in curve.values())
  _, step = checkpoint_paths.resolve_checkpoint(tmp_path)
  assert step == steps[-1]


def test_a_model_dir_of_user_files_keeps_its_config_gin(tmp_path):
  """A MODEL_DIR whose config.gin no training wrote is refused, the file unchanged (never
  overwritten); a training's own config.gin carries the header that allows a rerun."""
  user = tmp_path / "config.gin"
  user.write_text("MY_SETTING = 1\n")
  with pytest.raises(ValueError, match=r"config\.gin was not written by a training"):
    configured_train(tmp_path)()
  assert user.read_text() == "MY_SETTING = 1\n"
  user.write_text(train_lib.CONFIG_GIN_HEADER + "MY_SETTING = 1\n")
  train_lib.check_own_config_gin(tmp_path)  # a training's own file: no error


def test_config_gin_is_written_whole_or_not_at_all(tmp_path, full_disk):
  """The other processes of a multi-process run check config.gin while process 0 writes it: an
  empty file, seen mid-write, failed them (`config.gin was not written by a training`, then
  XLA's abort). A disk full at its first character leaves no config.gin, and the rerun starts."""
  full_disk(0)
  with pytest.raises(writers.ResultWriteError, match=r"config\.gin"):
    configured_train(tmp_path, "TRAIN_STEPS = 0")()
  assert not (tmp_path / "config.gin").exists()
  train_lib.check_own_config_gin(tmp_path)  # the rerun is not refused


def test_keep_checkpoints_0_is_refused_before_anything_is_written(tmp_path):
  """Orbax keeps no checkpoint at all for KEEP_CHECKPOINTS = 0 (`LatestN(0)`): the run would end
  with none while its metrics name one. Refused before MODEL_DIR gets a file."""
  with pytest.raises(
      checkpoints.KeepCheckpointsError,
      match=r"^KEEP_CHECKPOINTS = 0: a run keeps at least its newest checkpoint"):
    configured_train(tmp_path / "run", "KEEP_CHECKPOINTS = 0")()
  assert not (tmp_path / "run").exists()


def test_a_model_dir_of_another_task_is_refused_before_it_is_changed(tmp_path):
  """A MODEL_DIR with a checkpoint of mcwq_gold_en/test, resumed for mcwq_gold_he/test: refused,
  naming both and how to fine-tune from it; its run.json and config.gin stay the other run's."""
  (tmp_path / "checkpoint_3" / "state").mkdir(parents=True)
  (tmp_path / "checkpoint_3" / "data").mkdir()
  run_json = '{"format": 1, "task": "mcwq_gold_en", "split": "test"}\n'
  (tmp_path / "run.json").write_text(run_json)
  (tmp_path / "config.gin").write_text(train_lib.CONFIG_GIN_HEADER + "OTHER = 1\n")
  with pytest.raises(training_data.OtherTrainingDataError) as e:
    configured_train(tmp_path)()
  assert str(e.value).splitlines()[0] == (  # (gin adds a line naming `train`)
      f"MODEL_DIR {tmp_path} holds a training on mcwq_gold_en/test (its run.json; newest "
      "checkpoint checkpoint_3), this run asks for mcwq_gold_he/test: resuming would go on from "
      "that model and report it as one of mcwq_gold_he. Give this run another MODEL_DIR; to "
      f"fine-tune from that run, also set INITIAL_CHECKPOINT_PATH = '{tmp_path}' (its newest "
      "checkpoint's parameters, a fresh optimizer state)")
  assert (tmp_path / "run.json").read_text() == run_json
  assert (tmp_path / "config.gin").read_text() == train_lib.CONFIG_GIN_HEADER + "OTHER = 1\n"


def test_an_example_too_long_to_decode_stops_the_run_before_its_first_step(tmp_path, monkeypatch):
  """The decoded split's lengths come from the data (INFER_TASK_FEATURE_LENGTHS None): an example
  over the limit stops the run before training, not after its last step."""
  monkeypatch.setattr(prediction, "MAX_INFERRED_LENGTH", 20)
  with pytest.raises(prediction.ExampleTooLongError, match=r"^mcwq_gold_he/test: example \d+ "):
    configured_train(tmp_path, "TRAIN_STEPS = 2", "EVAL_PERIOD = 0")()
  assert not checkpoint_paths.finished_steps(tmp_path)
  assert not (tmp_path / run_folder.TRAIN_METRICS).exists()


def test_the_main_prints_a_users_errors_as_one_line():
  """The errors whose messages say what to do are `main`'s one last line (no traceback); the
  command-line check of the line is tests/e2e/test_faults_checkpoints.py."""
  for error in (trainer_lib.NonFiniteLossError, checkpoints.OptimizerStateMismatchError,
                writers.ResultWriteError, prediction.ExampleTooLongError,
                partitioning.BatchSizeError, checkpoints.KeepCheckpointsError,
                training_data.OtherTrainingDataError, checkpoints.CheckpointSaveError):
    assert issubclass(error, train_lib.ONE_LINE_ERRORS), error


def test_a_batch_size_the_devices_cannot_share_is_refused(tmp_path):
  with pytest.raises(
      partitioning.BatchSizeError,
      match=r"^batch size 7 must be a multiple of the data-parallel size"):
    configured_train(tmp_path, "BATCH_SIZE = 7")()
  assert not (tmp_path / "run.json").exists()  # refused before run.json records it


def test_an_object_store_model_dir_is_refused_before_a_local_folder_is_made(tmp_path, monkeypatch):
  """`pathlib` would make `gs://bucket/run` the local folder `gs:/bucket/run`; `main` checks the
  same before it takes the lock (`run_folder.check_local_model_dir`)."""
  monkeypatch.chdir(tmp_path)
  with pytest.raises(run_folder.ModelDirNotLocalError, match=r"^MODEL_DIR gs://bucket/run: our "):
    configured_train("gs://bucket/run", "TRAIN_STEPS = 2")()
  assert list(tmp_path.iterdir()) == []
