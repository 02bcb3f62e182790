"""The evaluations of a training run (`mcwq_t5x.train`; T5X's `training_eval/` and
`inference_eval/` in `t5x/train.py`): the periodic loss and decoding (`PeriodicEvaluator`), which
metric may select the decoded checkpoint (`selection_metric`), which checkpoint the final
evaluation decodes (`choose_checkpoint`) and the final decoding of each reported split into
MODEL_DIR/predictions/ and metrics/ (`final_evaluation`).

Losses are per target token; exact match and BLEU in percent (`evaluation.metrics`).
"""
from __future__ import annotations

import dataclasses
import logging
import pathlib
import time
from typing import Any, Mapping, NamedTuple, Optional, Sequence

import jax
import numpy as np

from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import checkpoints
from mcwq_t5x.checkpointing import run_folder
from mcwq_t5x.data import pipeline
from mcwq_t5x.engine import partitioning
from mcwq_t5x.engine import trainer as trainer_lib
from mcwq_t5x.evaluation import prediction

#: The periodic losses recorded, per target token (`trainer.summarize_metrics`' keys).
LOSS_KEYS = ("loss", "cross_ent_loss", "accuracy")


@dataclasses.dataclass(frozen=True)
class EvaluationConfig:
  """How a training run decodes (periodic and final evaluation).

  Attributes:
    infer_eval_num_examples: INFER_EVAL_NUM_EXAMPLES, the periodic decoding's first N questions
      (None: all).
    infer_batch_size: INFER_BATCH_SIZE, rows per decoding batch.
    predict_kwargs: `model.predict_batch` options ({"num_decodes": NUM_DECODES}; 1: greedy).
    final_eval_num_examples: FINAL_EVAL_NUM_EXAMPLES, the final decoding's first N (None: all).
  """
  infer_eval_num_examples: Optional[int] = None
  infer_batch_size: int = 64
  predict_kwargs: Optional[Mapping[str, Any]] = None
  final_eval_num_examples: Optional[int] = None

  def check(self, model: Any) -> None:
    """ValueError naming PREDICT_KWARGS when the model cannot decode with `predict_kwargs`."""
    prediction.check_predict_kwargs(model, self.predict_kwargs)

  def infer_fn(self, model: Any, partitioner: partitioning.Partitioner) -> prediction.InferFn:
    """The decoding function of both evaluations (`prediction.get_infer_fn`)."""
    return prediction.get_infer_fn(model, partitioner, self.infer_batch_size, self.predict_kwargs)


def loss_over_split(trainer: trainer_lib.Trainer, state: Any, arrays: Mapping[str, np.ndarray],
                    batch_size: int, partitioner: partitioning.Partitioner) -> dict[str, float]:
  """{"loss", "cross_ent_loss", "accuracy"} per target token over every row of `arrays`
  (feature -> [rows, length]), in padded batches of `batch_size` (padding rows weigh 0)."""
  sums: dict[str, float] = {}
  n_rows = len(next(iter(arrays.values())))
  for start in range(0, n_rows, batch_size):
    chunk, _ = pipeline.pad_batch({
        k: v[start:start + batch_size] for k, v in arrays.items()
    }, batch_size)
    batch = {k: jax.device_put(v, partitioner.data_sharding) for k, v in chunk.items()}
    for k, v in jax.device_get(trainer.eval_step(state, batch)).items():
      sums[k] = sums.get(k, 0.0) + float(v)
  return {k: v for k, v in trainer_lib.summarize_metrics(sums).items() if k in LOSS_KEYS}


def selection_metric(metric_name_to_monitor: Optional[str],
                     train_eval_dataset_cfg: Optional[pipeline.DatasetConfig],
                     final_eval_dataset_cfgs: Sequence[pipeline.DatasetConfig],
                     evaluates: bool = True) -> Optional[str]:
  """The metric that may select the decoded checkpoint, or None (a warning says why):

  * the periodic evaluation reads a split the final evaluation reports (no held-out dev, e.g. the
    tiny job: its "dev loss" is the test loss), so that no checkpoint is chosen on the test set;
  * the run never evaluates (`evaluates` False: EVAL_PERIOD 0) or has no training-eval split.
  """
  if not metric_name_to_monitor:
    return metric_name_to_monitor
  if train_eval_dataset_cfg is not None:
    key = (train_eval_dataset_cfg.mixture_or_task_name, train_eval_dataset_cfg.split)
    if any((c.mixture_or_task_name, c.split) == key for c in final_eval_dataset_cfgs):
      logging.warning(
          "metric_name_to_monitor=%r would select the checkpoint on %s/%s, the split the final "
          "evaluation reports: no held-out dev split, so the final evaluation decodes the last "
          "checkpoint and the periodic figures are monitoring only", metric_name_to_monitor, *key)
      return None
  if not (evaluates and train_eval_dataset_cfg is not None):
    logging.warning(
        "metric_name_to_monitor=%r needs evaluations (eval_period > 0 and a training-eval "
        "split): keeping the most recent checkpoints and decoding the final parameters instead",
        metric_name_to_monitor)
    return None
  return metric_name_to_monitor


def monitoring_note(periodic_cfgs: Sequence[Optional[pipeline.DatasetConfig]],
                    final_eval_dataset_cfgs: Sequence[pipeline.DatasetConfig]) -> str:
  """The eval lines' note when a periodic evaluation reads a reported split, else ""."""
  reported = {(c.mixture_or_task_name, c.split) for c in final_eval_dataset_cfgs}
  if any((c.mixture_or_task_name, c.split) in reported for c in periodic_cfgs if c is not None):
    return " (monitoring on the reported split, selects nothing)"
  return ""


class PeriodicEvaluator:
  """The training-time evaluation of a state: the loss over `eval_arrays` ("training_eval/...",
  in batches of `eval_batch_size` on the trainer's mesh) and the decoding of
  `infer_eval_dataset_cfg` with `infer_fn` ("inference_eval/...", its first
  `infer_eval_num_examples`, the split tokenised once per run: `evaluator`, else at the first
  evaluation); either may be None (skipped). `note`: `monitoring_note`'s, in each eval line."""

  def __init__(self,
               trainer: trainer_lib.Trainer,
               model_dir: pathlib.Path,
               eval_arrays: Optional[Mapping[str, np.ndarray]] = None,
               eval_batch_size: Optional[int] = None,
               infer_eval_dataset_cfg: Optional[pipeline.DatasetConfig] = None,
               infer_fn: Optional[prediction.InferFn] = None,
               infer_eval_num_examples: Optional[int] = None,
               note: str = "",
               evaluator: Any = None):
    self.trainer, self.model_dir = trainer, pathlib.Path(model_dir)
    self.eval_arrays, self.eval_batch_size = eval_arrays, eval_batch_size
    self.infer_eval_dataset_cfg, self.infer_fn = infer_eval_dataset_cfg, infer_fn
    self.infer_eval_num_examples, self.note = infer_eval_num_examples, note
    self._evaluator: Any = evaluator

  def __call__(self, step: int, state: Any, writer: run_folder.ScalarWriter) -> dict[str, Any]:
    """{"step", metric: value} of `state` at `step`; a record with metrics is written to `writer`
    (TensorBoard), MODEL_DIR/eval_metrics.jsonl and the log."""
    record: dict[str, Any] = {"step": step}
    if self.eval_arrays is not None:  # the "dev loss" (of whatever split EVAL_SPLIT names)
      losses = loss_over_split(self.trainer, state, self.eval_arrays, self.eval_batch_size,
                               self.trainer.partitioner)
      record.update({f"training_eval/{k}": v for k, v in losses.items()})
    if self.infer_eval_dataset_cfg is not None:
      t = time.time()
      if self._evaluator is None:
        self._evaluator = prediction.make_evaluator(self.infer_eval_dataset_cfg,
                                                    self.infer_eval_num_examples)
      metrics, _ = prediction.evaluate_split(
          self.infer_eval_dataset_cfg,
          self.infer_fn,
          state.params,
          self.infer_eval_num_examples,
          evaluator=self._evaluator,
          return_predictions=False)
      record.update({f"inference_eval/{k}": v for k, v in metrics.items()})
      record["inference_eval/time_s"] = time.time() - t
    if len(record) > 1:
      scalars = {k: v for k, v in record.items() if k != "step"}
      writer.write_scalars(step, scalars)
      writer.flush()
      logging.info("eval step %d%s: %s", step, self.note, {
          k: round(v, 4) for k, v in scalars.items()
      })
      run_folder.append_jsonl(self.model_dir / run_folder.EVAL_METRICS,
                              pipeline.to_jsonable(record))
    return record


def lengths_from_data(cfg: pipeline.DatasetConfig) -> bool:
  """Whether a decoding of `cfg` takes a feature's length from its longest example (no
  TASK_FEATURE_LENGTHS entry), so that `prediction.ExampleTooLongError` may refuse it."""
  lengths = cfg.task_feature_lengths or {}
  return not (lengths.get("inputs") and lengths.get("targets"))


def tokenise_unbounded(dataset_cfgs: Sequence[Optional[pipeline.DatasetConfig]],
                       num_examples: Optional[int] = None) -> dict[int, Any]:
  """{index in `dataset_cfgs`: its first `num_examples` tokenised (`prediction.make_evaluator`)}
  of the splits whose decoding takes a length from the data (None entries skipped), for
  `final_evaluation`'s `evaluators` and `PeriodicEvaluator`'s `evaluator`. Called before training:
  `prediction.ExampleTooLongError` then comes before the first step, not after the last."""
  return {
      i: prediction.make_evaluator(cfg, num_examples)
      for i, cfg in enumerate(dataset_cfgs)
      if cfg is not None and lengths_from_data(cfg)
  }


class Choice(NamedTuple):
  """The checkpoint the final evaluation decodes: its `step`, `params` and `selection` (how it was
  chosen, recorded in each metrics file)."""
  step: int
  params: Any
  selection: dict[str, Any]


def choose_checkpoint(manager: checkpoints.CheckpointManager,
                      step: int,
                      params: Any,
                      abstract_params: Any,
                      note: str = "") -> Choice:
  """With the manager's `metric_name_to_monitor`: the kept checkpoint of the best value (e.g. the
  lowest dev loss), its parameters read from disk unless it is the last `step` (`params`); else
  the last step. `note`: `monitoring_note`'s (the log line then says why nothing is selected)."""
  best = manager.best_step()
  if best is None:
    logging.info("final evaluation decodes the last checkpoint (checkpoint_%d)%s", step,
                 "" if not note else ": no held-out dev split, no checkpoint selection")
    return Choice(step, params, {"selected_by": "last checkpoint"})
  name, mode, value = manager.metric_name_to_monitor, manager.metric_mode, manager.metric(best)
  logging.info(
      "final evaluation decodes checkpoint_%d: the %s %s (%.6g) of the kept checkpoints "
      "%s", best, "lowest" if mode == "min" else "highest", name, value, manager.all_steps())
  if best != step:
    params = checkpoints.restore_params(
        checkpoint_paths.checkpoint_dir(manager.directory, best), abstract_params)
  return Choice(best, params, {"selected_by": name, "metric_mode": mode, name: value})


def final_evaluation(dataset_cfgs: Sequence[pipeline.DatasetConfig],
                     infer_fn: prediction.InferFn,
                     choice: Choice,
                     model_dir: pathlib.Path,
                     num_examples: Optional[int] = None,
                     evaluators: Optional[Mapping[int, Any]] = None) -> dict[str, dict[str, float]]:
  """{"<task>_<split>": metrics} of decoding each split's first `num_examples` (None: all) with
  `choice.params`; writes MODEL_DIR/predictions/<task>_<split>.txt and metrics/<task>_<split>.json
  (with the step, checkpoint, decoding time and `choice.selection`). `evaluators`:
  `tokenise_unbounded`'s (the others are tokenised here). Raises writers.ResultWriteError (a
  file could not be written), ValueError (unknown task)."""
  results = {}
  checkpoint = checkpoint_paths.checkpoint_dir(model_dir, choice.step)
  for i, cfg in enumerate(dataset_cfgs):
    t = time.time()
    metrics, predictions = prediction.evaluate_split(
        cfg, infer_fn, choice.params, num_examples, evaluator=(evaluators or {}).get(i))
    extra = {
        "step": choice.step,
        "checkpoint": str(checkpoint),
        "decode_time_s": time.time() - t,
        **choice.selection
    }
    pred_path, _ = prediction.write_predictions(model_dir, cfg, predictions, metrics, extra=extra)
    logging.info("final %s/%s (%d examples, %.1fs): %s -> %s", cfg.mixture_or_task_name, cfg.split,
                 len(predictions),
                 time.time() - t, metrics, pred_path)
    results[f"{cfg.mixture_or_task_name}_{cfg.split}"] = metrics
  return results
