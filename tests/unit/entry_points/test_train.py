"""The training main in this process (`mcwq_t5x.train`): the periodic training-eval loss covers every
row of the split; a resumed run drops the metric rows after its step; checkpoint selection is never
on the reported split; TensorBoard gets plain scalars; configuration errors are clear (through gin,
with the session run's settings on the 155 Hebrew gold questions: `scenarios.OUR_RUN`); an early
stop closes the metric writers; a non-finite loss names the last good checkpoint.

The mains as users run them, in fresh processes: tests/e2e/ (test_mains, test_faults_checkpoints,
test_multiprocess, test_readme)."""
import logging

import gin
import jax
import numpy as np
import optax
import pytest

from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import run_folder
from mcwq_t5x.data import paths
from mcwq_t5x.data import pipeline
from mcwq_t5x.data import writers
from mcwq_t5x.engine import partitioning
from mcwq_t5x.engine import trainer as trainer_lib
from mcwq_t5x import train as train_lib
import mains
import scenarios
import tiny_engine

TINY = "gin/mcwq_t5x/tiny_random_split_en.gin"
# why: the float32 matmul peak (six 2048x2048 matmuls, for the step log's share of it) is no part
# of what these in-process runs check; the commands' runs time it (tests/e2e/).
RUN = mains.SMALL_MODEL + scenarios.OUR_RUN + ["train_script.train.measure_matmul_peak = False"]


def test_loss_over_split_scores_every_row_once():
  # why 4 devices: the state's initialisation is then test_prediction.py's program, which the
  # session's compilation cache holds once
  partitioner = partitioning.Partitioner(devices=jax.devices()[:4])
  model = tiny_engine.tiny_model(0.0)
  tr = trainer_lib.Trainer(model, partitioner, lambda step: 0.0, optimizer=optax.set_to_zero())
  state = tr.create_state(tiny_engine.SHAPES)
  rows = tiny_engine.synthetic_batch(0, batch=11)  # 11 rows: batches of 4, 4 and 3 (+1 padding)
  chunked = train_lib.loss_over_split(tr, state, rows, 4, partitioner)
  # Other groupings and paddings of the same rows (10 rows + 6 padding, 1 row + 3), in the two
  # batch shapes that are compiled anyway (4 and 16).
  whole = train_lib.loss_over_split(tr, state, {k: v[:10] for k, v in rows.items()}, 16, partitioner)
  last = train_lib.loss_over_split(tr, state, {k: v[10:] for k, v in rows.items()}, 4, partitioner)
  n_whole = float(rows["decoder_loss_weights"][:10].sum())
  n_last = float(rows["decoder_loss_weights"][10:].sum())
  expected = (whole["loss"] * n_whole + last["loss"] * n_last) / (n_whole + n_last)
  np.testing.assert_allclose(chunked["loss"], expected, rtol=1e-5)
  # A batch larger than the split still gives a loss (it is one padded batch).
  single = train_lib.loss_over_split(tr, state, rows, 16, partitioner)
  np.testing.assert_allclose(single["loss"], chunked["loss"], rtol=1e-5)


def test_selection_is_never_on_the_reported_split(caplog):
  test = pipeline.DatasetConfig("mcwq_random_split_en", None, "test", 8)
  dev = pipeline.DatasetConfig("mcwq_random_split_en", None, "validation", 8)
  assert train_lib.selection_metric("training_eval/loss", dev, [test]) == "training_eval/loss"
  with caplog.at_level(logging.WARNING):
    assert train_lib.selection_metric("training_eval/loss", test, [test]) is None
  assert "last checkpoint" in caplog.text and "monitoring only" in caplog.text


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
  """A MODEL_DIR whose config.gin no training wrote is refused, the file unchanged (before the fix
  the training overwrote it); a training's own config.gin carries the header that allows a rerun."""
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
