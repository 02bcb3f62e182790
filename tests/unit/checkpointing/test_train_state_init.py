"""Tests of mcwq_t5x.checkpointing.train_state_init alone, with the tiny model and checkpoints
written here: a run's first state is MODEL_DIR's newest checkpoint (its data position, the metric
rows after it dropped; RESUME_PARAMS_ONLY with another optimizer), else INITIAL_CHECKPOINT_PATH's
parameters, else a fresh initialisation; a wrong INITIAL_CHECKPOINT_PATH fails before anything
is loaded; the tasks' and the recorded vocabulary are checked; the config objects' defaults."""
import json
import logging
import types

import jax
import numpy as np
import optax
import pytest

from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import checkpoints
from mcwq_t5x.checkpointing import run_folder
from mcwq_t5x.checkpointing import run_info
from mcwq_t5x.checkpointing import t5x_checkpoint_writer
from mcwq_t5x.checkpointing import train_state_init
from mcwq_t5x.data import pipeline
from mcwq_t5x.engine import partitioning
from mcwq_t5x.engine import trainer as trainer_lib
import tiny_engine

RESTORE = train_state_init.RestoreCheckpointConfig()


@pytest.fixture(scope="module")
def trainer():
  # why 4 devices and set_to_zero: the state's initialisation is then test_prediction.py's
  # program, which the session's compilation cache holds once
  partitioner = partitioning.Partitioner(devices=jax.devices()[:4])
  return trainer_lib.Trainer(
      tiny_engine.tiny_model(0.0), partitioner, lambda step: 0.0, optimizer=optax.set_to_zero())


def leaves(tree):
  return jax.tree_util.tree_leaves(jax.device_get(tree))


def assert_same_params(a, b):
  for x, y in zip(leaves(a), leaves(b)):
    np.testing.assert_array_equal(x, y)


def saved_run(trainer, model_dir, step, data_state, shift=0.0):
  """MODEL_DIR with one checkpoint at `step` of the fresh state's parameters + `shift`; returns
  those parameters (host)."""
  state = trainer.create_state(tiny_engine.SHAPES)
  state = state.replace(params=jax.tree_util.tree_map(lambda p: p + shift, state.params))
  manager = checkpoints.CheckpointManager(model_dir, async_save=False)
  manager.save(step, state, data_state, force=True)
  manager.close()
  return jax.device_get(state.params)


def init(trainer, model_dir, restore=RESTORE, total_steps=10):
  manager = checkpoints.CheckpointManager(model_dir, async_save=False)
  try:
    return train_state_init.restore_or_initialize(trainer, manager, restore, trainer.model,
                                                  tiny_engine.SHAPES, total_steps)
  finally:
    manager.close()


def test_a_fresh_run_initialises_from_the_seed(trainer, tmp_path, caplog):
  with caplog.at_level(logging.INFO):
    first = init(trainer, tmp_path)
  assert (first.step, first.data_state) == (0, None)
  assert_same_params(first.state.params, trainer.create_state(tiny_engine.SHAPES).params)
  assert [tuple(x.shape) for x in jax.tree_util.tree_leaves(first.abstract_state.params)
         ] == [x.shape for x in leaves(first.state.params)]
  assert "model: 0.01M parameters; starting at step 0 of 10" in caplog.text


def test_a_run_resumes_its_newest_checkpoint_and_drops_later_metric_rows(trainer, tmp_path, caplog):
  saved = saved_run(trainer, tmp_path, 3, {"data_seed": 5, "global_batch_size": 8}, shift=1.0)
  rows = [{"step": s, "loss": 1.0} for s in (2, 3, 4)]
  (tmp_path / run_folder.TRAIN_METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
  with caplog.at_level(logging.INFO):
    # INITIAL_CHECKPOINT_PATH is ignored when MODEL_DIR has a checkpoint (even a wrong one)
    resumed = init(trainer, tmp_path, train_state_init.RestoreCheckpointConfig(path="/no/such"))
  assert resumed.step == 3
  assert resumed.data_state == {"data_seed": 5, "global_batch_size": 8, "step": 3}
  assert_same_params(resumed.state.params, saved)
  assert [
      json.loads(line)["step"]
      for line in (tmp_path / run_folder.TRAIN_METRICS).read_text().splitlines()
  ] == [2, 3]
  assert f"resumed from {tmp_path / 'checkpoint_3'}" in caplog.text
  assert "starting at step 3 of 10" in caplog.text


def test_resume_params_only_takes_another_optimizer(trainer, tmp_path):
  saved = saved_run(trainer, tmp_path, 2, {}, shift=0.5)
  adamw = trainer_lib.Trainer(
      trainer.model, trainer.partitioner, lambda step: 1e-3, optimizer=optax.adamw(1e-3))
  with pytest.raises(checkpoints.OptimizerStateMismatchError, match="params_only=True"):
    init(adamw, tmp_path)
  resumed = init(adamw, tmp_path, train_state_init.RestoreCheckpointConfig(resume_params_only=True))
  assert resumed.step == 2
  assert_same_params(resumed.state.params, saved)
  # a fresh AdamW state: zero moments of every parameter's shape
  moments = [x for x in leaves(resumed.state.opt_state) if np.ndim(x) > 0]
  assert moments and all(not np.any(m) for m in moments)


def test_initial_checkpoint_path_gives_the_parameters_and_step_0(trainer, tmp_path, caplog):
  source = tmp_path / "pretrained"
  saved = saved_run(trainer, source, 7, {}, shift=2.0)
  with caplog.at_level(logging.INFO):
    first = init(trainer, tmp_path / "run",
                 train_state_init.RestoreCheckpointConfig(path=str(source / "checkpoint_7")))
  assert (first.step, first.data_state) == (0, None)
  assert_same_params(first.state.params, saved)
  assert f"initialising the parameters from {source / 'checkpoint_7'}" in caplog.text


def test_initial_checkpoint_path_in_a_bucket(trainer, tmp_path, local_gcs, caplog):
  """INITIAL_CHECKPOINT_PATH = 'gs://...' (as gin/mcwq_t5x/mt5_*.gin name mT5's, here a T5X-native
  checkpoint in the stand-in's bucket): checked, then read into the first state at step 0, with
  requests for that folder only. Before, the check raised NotACheckpointError for "gs:/pretrained/
  mt5/checkpoint_7" (one slash)."""
  params = jax.device_get(trainer.create_state(tiny_engine.SHAPES).params)
  params = jax.tree_util.tree_map(lambda p: p + 2.0, params)
  t5x_checkpoint_writer.save_t5x_checkpoint(
      params, local_gcs.root / "pretrained" / "mt5" / "checkpoint_7", step=7)
  restore = train_state_init.RestoreCheckpointConfig(path="gs://pretrained/mt5/checkpoint_7")
  restore.check(tmp_path / "run")
  with caplog.at_level(logging.INFO):
    first = init(trainer, tmp_path / "run", restore)
  assert (first.step, first.data_state) == (0, None)
  assert_same_params(first.state.params, params)
  assert "initialising the parameters from gs://pretrained/mt5/checkpoint_7" in caplog.text
  folder = "/storage/v1/b/pretrained/o"
  assert local_gcs.seen and all(
      p.startswith(f"{folder}?") or p.startswith(f"{folder}/mt5%2Fcheckpoint_7%2F")
      for p in local_gcs.seen), local_gcs.seen


def test_a_wrong_initial_checkpoint_path_fails_unless_model_dir_has_one(tmp_path):
  restore = train_state_init.RestoreCheckpointConfig(path=str(tmp_path / "missing"))
  with pytest.raises(checkpoint_paths.INPUT_ERRORS, match="missing"):
    restore.check(tmp_path)
  (tmp_path / "checkpoint_5" / checkpoint_paths.STATE_ITEM).mkdir(parents=True)
  restore.check(tmp_path)  # resuming: the path is not read
  train_state_init.RestoreCheckpointConfig().check(tmp_path / "empty")  # no path: nothing read


def vocabulary(path, content):
  """A SentencePiece-like vocabulary for `run_info`: its model file holds `content`."""
  path.write_bytes(content)
  return types.SimpleNamespace(sentencepiece_model_file=str(path), extra_ids=0)


def test_vocabularies_of_the_tasks_and_of_the_recorded_run(tmp_path):
  gold = pipeline.DatasetConfig("mcwq_gold_he", None, "test", 8, module="tasks.mcwq")
  with pytest.raises(ValueError, match="vocabulary/model mismatch.*vocab_size is 64"):
    train_state_init.check_vocabularies(tiny_engine.tiny_model(0.0), tmp_path, [gold])
  train_state_init.check_vocabularies(
      tiny_engine.tiny_model(0.0, vocab_size=2000), tmp_path, [gold, None])
  config = tiny_engine.config(2000)
  model = types.SimpleNamespace(
      module=types.SimpleNamespace(config=config),
      output_vocabulary=vocabulary(tmp_path / "a.model", b"first"))
  run = train_state_init.record_run(tmp_path / "run", model, gold, 300)
  assert (run["task"], run["split"], run["train_steps"], run["batch_size"],
          run["pack"]) == ("mcwq_gold_he", "test", 300, 8, False)
  assert (tmp_path / "run" / run_info.VOCAB_COPY).read_bytes() == b"first"
  other = types.SimpleNamespace(
      module=model.module, output_vocabulary=vocabulary(tmp_path / "b.model", b"second"))
  train_state_init.check_vocabularies(other, tmp_path / "run", [])  # nothing to resume yet
  (tmp_path / "run" / "checkpoint_1" / checkpoint_paths.STATE_ITEM).mkdir(parents=True)
  train_state_init.check_vocabularies(model, tmp_path / "run", [])
  with pytest.raises(run_info.VocabularyMismatchError, match="train \\(resuming\\).*b.model"):
    train_state_init.check_vocabularies(other, tmp_path / "run", [])


def test_the_configs_and_the_manager_they_make(tmp_path):
  cfg = train_state_init.CheckpointConfig()
  assert (cfg.save.period, cfg.save.keep, cfg.save.metric_name_to_monitor,
          cfg.save.metric_mode) == (1000, 3, None, "min")
  assert (cfg.restore.path, cfg.restore.resume_params_only) == (None, False)
  save = train_state_init.SaveCheckpointConfig(period=2, keep=1, metric_mode="max")
  manager = save.manager(tmp_path, "training_eval/accuracy")
  assert (manager.metric_name_to_monitor, manager.metric_mode) == ("training_eval/accuracy", "max")
  manager.close()
  with pytest.raises(ValueError, match="metric_mode must be 'min' or 'max'"):
    train_state_init.SaveCheckpointConfig(metric_mode="lowest").manager(tmp_path, None)
