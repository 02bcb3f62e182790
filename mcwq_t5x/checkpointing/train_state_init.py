"""The checkpoint settings of a training run and its first train state (T5X's `CheckpointConfig`,
`SaveCheckpointConfig`, `RestoreCheckpointConfig` and `TrainStateInitializer`).

`restore_or_initialize` gives the state a run starts from, first found first: MODEL_DIR's newest
readable checkpoint (an older one when the newest is corrupt; RESUME_PARAMS_ONLY: its parameters
and step with a fresh optimizer state), else the parameters of INITIAL_CHECKPOINT_PATH (any
format `checkpoint_loaders` reads) with a fresh optimizer, else a fresh initialisation.
`check_vocabularies` and `record_run` keep a run on one vocabulary: each task must fit the model,
and a resumed run must have the vocabulary its run.json records.

The gin files bind the configs by dynamic registration (`gin/mcwq_t5x/runs/finetune.gin`): the
macros CHECKPOINT_PERIOD, KEEP_CHECKPOINTS, METRIC_NAME_TO_MONITOR, METRIC_MODE,
INITIAL_CHECKPOINT_PATH and RESUME_PARAMS_ONLY.
"""
from __future__ import annotations

import dataclasses
import logging
import pathlib
from typing import Any, Mapping, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mcwq_t5x.checkpointing import checkpoint_loaders
from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import checkpoints
from mcwq_t5x.checkpointing import run_folder
from mcwq_t5x.checkpointing import run_info
from mcwq_t5x.data import pipeline
from mcwq_t5x.data import training_data

#: feature -> the shape of a global batch's array of it.
Shapes = Mapping[str, Sequence[int]]


@dataclasses.dataclass(frozen=True)
class SaveCheckpointConfig:
  """How a run saves (T5X's `SaveCheckpointConfig`; `SaveBestCheckpointer`'s metric).

  Attributes:
    period: CHECKPOINT_PERIOD, steps between checkpoints (the last step is always saved).
    keep: KEEP_CHECKPOINTS, how many to keep (None: all); with a metric, that many best plus the
      newest.
    metric_name_to_monitor, metric_mode: METRIC_NAME_TO_MONITOR (an `eval_metrics.jsonl` key, e.g.
      "training_eval/loss"; None: keep the newest) and METRIC_MODE ("min" or "max").
  """
  period: int = 1000
  keep: Optional[int] = 3
  metric_name_to_monitor: Optional[str] = None
  metric_mode: str = "min"

  def check(self) -> None:
    """Fails at once, before anything is loaded: `checkpoints.KeepCheckpointsError` for a `keep`
    below 1."""
    checkpoints.check_max_to_keep(self.keep)

  def manager(self, model_dir: checkpoint_paths.PathLike,
              metric_name_to_monitor: Optional[str]) -> checkpoints.CheckpointManager:
    """The run's `CheckpointManager`, keeping by `metric_name_to_monitor` (the metric the run can
    select by, `training_eval.selection_metric`; None: the newest). ValueError: bad metric_mode."""
    return checkpoints.CheckpointManager(
        model_dir,
        save_interval_steps=self.period,
        max_to_keep=self.keep,
        metric_name_to_monitor=metric_name_to_monitor,
        metric_mode=self.metric_mode)


@dataclasses.dataclass(frozen=True)
class RestoreCheckpointConfig:
  """Where a run's first state comes from when MODEL_DIR has no checkpoint, and how it resumes
  (T5X's `RestoreCheckpointConfig`).

  Attributes:
    path: INITIAL_CHECKPOINT_PATH, parameters only, with a fresh optimizer (ours, `t5x.train`'s,
      T5X-native or Hugging Face); ignored when MODEL_DIR has a checkpoint.
    resume_params_only: RESUME_PARAMS_ONLY, resume MODEL_DIR's parameters and step with a fresh
      optimizer state.
  """
  path: Optional[str] = None
  resume_params_only: bool = False

  def check(self, model_dir: checkpoint_paths.PathLike) -> None:
    """Fails at once (`checkpoint_paths.INPUT_ERRORS`, naming the path) when `path` will be read
    and holds no checkpoint: before the data is read and the step compiled."""
    if self.path and not checkpoint_paths.finished_steps(model_dir):
      checkpoint_paths.locate(self.path)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
  """A run's saving and restoring (T5X's `CheckpointConfig`)."""
  save: SaveCheckpointConfig = dataclasses.field(default_factory=SaveCheckpointConfig)
  restore: RestoreCheckpointConfig = dataclasses.field(default_factory=RestoreCheckpointConfig)


def check_resumable(model_dir: checkpoint_paths.PathLike, cfg: pipeline.DatasetConfig) -> None:
  """Raises `training_data.OtherTrainingDataError` when MODEL_DIR has a checkpoint and its run.json
  records another task or split than `cfg`'s (resuming would decode a model of the other data as
  this task's); nothing without a checkpoint or a run.json (then `TrainingData.check_resumed`
  compares the checkpoint's own record)."""
  model_dir = pathlib.Path(model_dir)
  steps = checkpoint_paths.finished_steps(model_dir)
  if not steps or not (model_dir / run_info.RUN_JSON).is_file():
    return
  run = run_info.read(model_dir / run_info.RUN_JSON)
  training_data.check_same_data(
      run, cfg, model_dir, f"its {run_info.RUN_JSON}; newest checkpoint "
      f"{checkpoint_paths.checkpoint_dir(model_dir, steps[-1]).name}")


def check_vocabularies(model: Any, model_dir: checkpoint_paths.PathLike,
                       dataset_cfgs: Sequence[Optional[pipeline.DatasetConfig]]) -> None:
  """Checks each task of `dataset_cfgs` (None entries skipped) exists and its vocabulary fits the
  model's `vocab_size`, and, when MODEL_DIR has a checkpoint, that the model's vocabulary is the
  one the run recorded.

  Raises:
    ValueError: an unknown task (naming the closest), a vocabulary/model size mismatch.
    run_info.VocabularyMismatchError: resuming with another vocabulary than run.json's.
  """
  for cfg in dataset_cfgs:
    if cfg is not None:
      vocabulary = pipeline.output_vocabulary(cfg.mixture_or_task_name, cfg.module)
      run_info.check_model_vocabulary(vocabulary, model, f"task {cfg.mixture_or_task_name}")
  if checkpoint_paths.finished_steps(model_dir):
    run_info.check_vocabulary(
        getattr(model, "output_vocabulary", None), model_dir, "train (resuming)")


def record_run(model_dir: checkpoint_paths.PathLike, model: Any, cfg: pipeline.DatasetConfig,
               total_steps: int) -> Optional[dict[str, Any]]:
  """Process 0 writes MODEL_DIR/run.json (`run_info.write`) and returns it; None elsewhere."""
  if jax.process_index() != 0:
    return None
  return run_info.write(
      model_dir,
      model=model,
      task=cfg.mixture_or_task_name,
      split=cfg.split,
      feature_lengths=cfg.task_feature_lengths,
      train_steps=total_steps,
      batch_size=cfg.batch_size,
      pack=cfg.pack,
      input_prefix=pipeline.input_prefixes(
          pipeline.get_mixture_or_task(cfg.mixture_or_task_name, cfg.module)))


class Initialized(NamedTuple):
  """What `restore_or_initialize` gives: the `TrainState`, its shapes (`abstract_state`, for
  restoring other checkpoints of the run), and the restored data position (None: not resumed)."""
  state: Any
  abstract_state: Any
  data_state: Optional[dict[str, Any]]

  @property
  def step(self) -> int:
    return int(self.state.step)


def restore_or_initialize(trainer: Any, manager: checkpoints.CheckpointManager,
                          restore: RestoreCheckpointConfig, model: Any, global_shapes: Shapes,
                          total_steps: int) -> Initialized:
  """The state a run starts from (the module docstring's order), on `trainer`'s mesh.

  `global_shapes`: feature -> a global batch's shape (int32 features). The run folder's metric
  rows after the start step are dropped (the resumed run writes those steps again).

  Raises:
    checkpoints.OptimizerStateMismatchError, MissingOptimizerError: the checkpoint's optimizer
      state does not fit this run's optimizer.
    checkpoints.NoUsableCheckpointError: MODEL_DIR has checkpoints and none can be read.
    checkpoint_paths.INPUT_ERRORS: INITIAL_CHECKPOINT_PATH holds no fitting checkpoint.
  """
  input_types = {k: jnp.int32 for k in global_shapes}
  abstract_state = trainer.state_shapes(global_shapes, input_types)
  restored = manager.restore_latest(
      abstract_state, optimizer=trainer.optimizer, params_only=restore.resume_params_only)
  data_state = None
  if restored is not None:
    step, state, data_state = restored
    logging.info("resumed from %s (data position: %s)",
                 checkpoint_paths.checkpoint_dir(manager.directory, step), data_state)
  elif restore.path:
    logging.info("initialising the parameters from %s (fresh optimizer state)", restore.path)
    params = checkpoint_loaders.load_params(restore.path, model.module.config,
                                            abstract_state.params).params
    state = trainer.create_state(global_shapes, input_types, init_params=params)
    del params  # why: the state holds the parameters; the loaded tree is one more model's worth
  else:
    state = trainer.create_state(global_shapes, input_types)
  start_step = int(state.step)
  run_folder.drop_metric_rows_after(pathlib.Path(manager.directory), start_step)
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))
  logging.info("model: %.2fM parameters; starting at step %d of %d", n_params / 1e6, start_step,
               total_steps)
  return Initialized(state, abstract_state, data_state)
