"""The data of a training run (`mcwq_t5x.train`): the training split as deterministic global
batches and this process's rows of each, the rows of the periodic loss, and the data position
saved with every checkpoint (`TrainingData.data_state`), checked when a run resumes.

Every process reads the whole training split and gathers its rows of each global batch (its data
shard: `local_rows`, `partitioning.Partitioner.local_batch_rows`), so the global batch of a step
is the same for any number of processes. Arrays: feature -> int32 [rows, length]
(`pipeline.load_feature_arrays`).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Callable, Mapping, Optional

import numpy as np

from mcwq_t5x.data import pipeline

Arrays = dict[str, np.ndarray]


class OtherTrainingDataError(ValueError):
  """MODEL_DIR holds a training of another task or split than the one asked for: resuming it would
  go on from (and decode, as this task's) a model never trained on the asked data. The message
  names both and the way to fine-tune from that run instead."""


def check_same_data(saved: Mapping[str, Any], cfg: pipeline.DatasetConfig, model_dir: Any,
                    source: str) -> None:
  """Raises OtherTrainingDataError when `saved` ({"task", "split"}: a run.json or a checkpoint's
  data position, `source` says which) names another task or split than `cfg`; a missing or None
  field is not compared."""
  asked = {"task": cfg.mixture_or_task_name, "split": cfg.split}
  if all(saved.get(k) in (None, v) for k, v in asked.items()):
    return
  was = f"{saved.get('task')}/{saved.get('split')}"
  raise OtherTrainingDataError(
      f"MODEL_DIR {model_dir} holds a training on {was} ({source}), this run asks for "
      f"{asked['task']}/{asked['split']}: resuming would go on from that model and report it as "
      f"one of {asked['task']}. Give this run another MODEL_DIR; to fine-tune from that run, "
      f"also set INITIAL_CHECKPOINT_PATH = '{model_dir}' (its newest checkpoint's parameters, a "
      "fresh optimizer state)")


@dataclasses.dataclass(frozen=True)
class TrainingData:
  """The training batches of a run and the rows of its periodic loss.

  Attributes:
    cfg: the training split's `DatasetConfig` (task, split, global batch size).
    batches: batch `s` of the run depends only on (data_seed, s) (`DeterministicBatches`).
    local_rows: this process's rows of each global batch.
    data_seed: the data-order seed (`cfg.seed`, else the run's RANDOM_SEED).
    eval_arrays, eval_batch_size: the periodic loss's rows and batch size; None: no periodic loss.
  """
  cfg: pipeline.DatasetConfig
  batches: pipeline.DeterministicBatches
  local_rows: slice
  data_seed: int
  eval_arrays: Optional[Arrays] = None
  eval_batch_size: Optional[int] = None

  def local_batch(self, step: int) -> Arrays:
    """This process's rows of the global batch of `step` (0-based: the batch of update step+1)."""
    return self.batches.batch(step, self.local_rows)

  def global_shapes(self) -> dict[str, tuple[int, ...]]:
    """feature -> (global batch size, length): the shapes of a step's global batch."""
    example = self.local_batch(0)
    return {k: (self.cfg.batch_size,) + v.shape[1:] for k, v in example.items()}

  def data_state(self, step: int) -> dict[str, Any]:
    """The data position saved with the checkpoint of `step` (plain JSON values)."""
    return {
        "step": int(step),
        "data_seed": int(self.data_seed),
        "global_batch_size": int(self.cfg.batch_size),
        "task": self.cfg.mixture_or_task_name,
        "split": self.cfg.split
    }

  def check_resumed(self, data_state: Mapping[str, Any], model_dir: Any = "") -> bool:
    """False, with a warning, when a checkpoint's `data_state` has another data seed or global
    batch size than this run (the resumed run then reads its batches in another order).
    OtherTrainingDataError (naming `model_dir`) when it has another task or split."""
    check_same_data(data_state, self.cfg, model_dir,
                    f"the data position of checkpoint step {data_state.get('step')}")
    same = (
        data_state.get("data_seed", self.data_seed) == self.data_seed and
        data_state.get("global_batch_size", self.cfg.batch_size) == self.cfg.batch_size)
    if not same:
      logging.warning(
          "data seed/batch size changed since the checkpoint (%s); the data order "
          "will differ from the interrupted run", data_state)
    return same


def load(train_cfg: pipeline.DatasetConfig,
         *,
         local_rows: slice,
         random_seed: int = 0,
         eval_cfg: Optional[pipeline.DatasetConfig] = None,
         eval_batch_size: Optional[int] = None,
         eval_steps: Optional[int] = None,
         process: tuple[int, int] = (0, 1),
         load_arrays: Callable[..., Arrays] = pipeline.load_feature_arrays) -> TrainingData:
  """Reads the training split (all of it, in every process) and the periodic loss's rows.

  Args:
    train_cfg: the training split (`shuffle` and `seed` give the order; seed None: `random_seed`).
    local_rows: this process's rows of each global batch.
    eval_cfg: the periodic loss's split (None: none); its first `eval_steps * eval_batch_size`
      rows in source order (`eval_steps` None: every row).
    process: (this process's index, the number of processes), for the log line.
    load_arrays: `pipeline.load_feature_arrays` (a stand-in in tests).

  Raises:
    ValueError: unknown task, an empty split, a batch size below 1 (`DeterministicBatches`).
    paths.DataNotFoundError: the data folder is missing.
  """
  t0 = time.time()
  data_seed = random_seed if train_cfg.seed is None else train_cfg.seed
  batches = pipeline.DeterministicBatches(
      load_arrays(train_cfg), train_cfg.batch_size, seed=data_seed, shuffle=train_cfg.shuffle)
  logging.info(
      "training data: %d rows (%.1fs); process %d of %d feeds rows %d:%d of each batch of %d",
      batches.num_rows,
      time.time() - t0, process[0], process[1], local_rows.start, local_rows.stop,
      train_cfg.batch_size)
  eval_arrays = None
  if eval_cfg is not None:
    n = None if eval_steps is None else eval_steps * eval_batch_size
    # why one shard: every process scores every row of the periodic loss (the batches are global)
    eval_arrays = load_arrays(eval_cfg, 0, 1, num_examples=n)
  return TrainingData(train_cfg, batches, local_rows, int(data_seed), eval_arrays,
                      eval_batch_size if eval_cfg is not None else None)
