r"""Evaluation main (T5X `t5x/eval.py` habit): decode a split of any task with a checkpoint.

Usage:
  python -m mcwq_t5x.eval --gin_file=gin/models/tiny.gin --gin_file=gin/runs/eval.gin \
    --gin.MIXTURE_OR_TASK_NAME="'mcwq_random_split_en'" --gin.CHECKPOINT_PATH="'runs/tiny'"
  python -m mcwq_t5x.eval --gin_file=gin/zeroshot/mt5_small_mcd1_he.gin   # zero-shot he from en

Writes, under EVAL_OUTPUT_DIR (default: <checkpoint's MODEL_DIR>/eval_<step>):
  predictions/<task>_<split>.txt   one prediction per line, in source order
  metrics/<task>_<split>.json      the task's metrics (exact_match, bleu) + step, checkpoint, count

CHECKPOINT_PATH may be a MODEL_DIR of `mcwq_t5x.train`, its checkpoints folder or one step folder
(only the parameters are read), or a pretrained Hugging Face / T5X-native checkpoint
(`mcwq_t5x.checkpoint_import.load_pretrained`).
"""
from __future__ import annotations

import logging
import pathlib
import sys
from typing import Any, Mapping, Optional, Sequence

import gin
import jax
import optax

from mcwq_t5x import checkpoints as checkpoints_lib
from mcwq_t5x import gin_utils
from mcwq_t5x import partitioning
from mcwq_t5x import trainer as trainer_lib
from mcwq_t5x import utils

if __name__ == "__main__":
  # Run the package module (one gin registration of `evaluate`), see mcwq_t5x/train.py.
  from mcwq_t5x import eval as _eval_module  # pylint: disable=g-import-not-at-top
  _eval_module.main()
  sys.exit(0)


def load_params(model: Any, partitioner: partitioning.Partitioner, checkpoint_path: str
                ) -> tuple[Any, Optional[int], pathlib.Path]:
  """Loads sharded parameters for inference.

  Args:
    model: the `EncoderDecoderModel`.
    partitioner: the mesh.
    checkpoint_path: a `mcwq_t5x.train` MODEL_DIR / checkpoints folder / step folder, or a pretrained
      HF or T5X-native checkpoint.

  Returns:
    (params sharded over the mesh, step or None, folder the checkpoint came from).

  Raises:
    FileNotFoundError: nothing usable at `checkpoint_path`.
  """
  # Shapes/shardings of the parameters; an empty optimizer keeps this cheap.
  tr = trainer_lib.Trainer(model, partitioner, lambda step: 0.0, optimizer=optax.set_to_zero())
  shapes = {"encoder_input_tokens": (partitioner.data_parallel_size, 8),
            "decoder_input_tokens": (partitioner.data_parallel_size, 8)}
  abstract = tr.state_shapes(shapes).params
  try:
    folder, step = checkpoints_lib.resolve_checkpoint(checkpoint_path)
  except FileNotFoundError:
    if not pathlib.Path(checkpoint_path).exists() and "://" not in str(checkpoint_path):
      raise
    from mcwq_t5x import checkpoint_import  # pylint: disable=g-import-not-at-top
    params = checkpoint_import.load_pretrained(checkpoint_path, model.module.config)
    params = jax.tree_util.tree_map(lambda x, a: jax.device_put(x.astype(a.dtype), a.sharding),
                                    params, abstract)
    return params, None, pathlib.Path(checkpoint_path)
  mgr = checkpoints_lib.CheckpointManager(folder, async_save=False)
  params = mgr.restore_params(step, abstract)
  logging.info("restored parameters of %s/%d", folder, step)
  return params, step, folder


@gin.configurable
def evaluate(*,
             model: Any,
             dataset_cfg: utils.DatasetConfig,
             checkpoint_path: str,
             output_dir: Optional[str] = None,
             partitioner: Optional[partitioning.Partitioner] = None,
             predict_kwargs: Optional[Mapping[str, Any]] = None,
             num_examples: Optional[int] = None) -> dict[str, Any]:
  """Decodes `dataset_cfg`'s split with the checkpoint; writes predictions and a metrics JSON.

  Args:
    model: MODEL.
    dataset_cfg: task (MIXTURE_OR_TASK_NAME), split, batch size; `task_feature_lengths` None =
      each split's longest example (nothing truncated).
    checkpoint_path: CHECKPOINT_PATH (see `load_params`).
    output_dir: EVAL_OUTPUT_DIR (None: <MODEL_DIR>/eval_<step>).
    partitioner: mesh (default one model partition).
    predict_kwargs: `model.predict_batch` options, e.g. {"num_decodes": 4, "alpha": 0.6} for beam search.
    num_examples: only the first N examples (None = all).

  Returns:
    {"metrics": {...}, "predictions_path": str, "metrics_path": str}.

  Raises:
    ValueError: unknown task or vocabulary/model mismatch.
    FileNotFoundError: no checkpoint at `checkpoint_path`.
  """
  from mcwq_t5x import train as train_lib  # pylint: disable=g-import-not-at-top
  partitioner = partitioner or partitioning.Partitioner()
  train_lib.check_model_and_task(model, dataset_cfg)
  params, step, folder = load_params(model, partitioner, checkpoint_path)
  if output_dir is None:
    model_dir = folder.parent if folder.name == "checkpoints" else folder
    output_dir = str(model_dir / (f"eval_{step}" if step is not None else "eval"))
  predictor = train_lib.Predictor(model, partitioner, dataset_cfg.batch_size, predict_kwargs)
  metrics, predictions = train_lib.run_decoding_eval(dataset_cfg, predictor, params, num_examples)
  pred_path, met_path = train_lib.write_predictions(
      output_dir, dataset_cfg, predictions, metrics,
      extra={"step": step, "checkpoint": str(checkpoint_path),
             "predict_kwargs": dict(predict_kwargs or {})})
  logging.info("%s/%s: %s (%d predictions) -> %s, %s", dataset_cfg.mixture_or_task_name,
               dataset_cfg.split, metrics, len(predictions), pred_path, met_path)
  return {"metrics": metrics, "predictions_path": str(pred_path), "metrics_path": str(met_path)}


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
  """Entry point: gin flags -> `evaluate`."""
  gin_utils.setup_logging()
  gin_utils.parse_flags(argv, description=__doc__.splitlines()[0])
  partitioning.set_host_device_count()
  partitioning.initialize_distributed()
  result = evaluate()  # pylint: disable=no-value-for-parameter
  print(result["metrics"])
  return result
