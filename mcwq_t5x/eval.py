r"""Evaluation main (T5X `t5x/eval.py` habit): decode a split of any task with a checkpoint.

Usage:
  python -m mcwq_t5x.eval --gin_file=gin/mcwq_t5x/models/tiny.gin --gin_file=gin/mcwq_t5x/runs/eval.gin \
    --gin.MIXTURE_OR_TASK_NAME="'mcwq_random_split_en'" --gin.CHECKPOINT_PATH="'runs/tiny'"
  python -m mcwq_t5x.eval --gin_file=gin/mcwq_t5x/zeroshot/mt5_small_mcd1_he.gin   # zero-shot he from en

The run file binds `eval_script.evaluate` by dynamic registration. CHECKPOINT_PATH is a MODEL_DIR
of `mcwq_t5x.train` or `t5x.train` (its newest readable checkpoint), one `checkpoint_<step>`, or a
Hugging Face / T5X-native checkpoint. Writes predictions/<task>_<split>.txt and
metrics/<task>_<split>.json under EVAL_OUTPUT_DIR (default <MODEL_DIR>/eval_<step>), each whole
or not at all, holding its eval.lock; a training's own results (an EVAL_OUTPUT_DIR that is its
MODEL_DIR) are never replaced. The vocabulary and dtype are the run.json's unless set, and so is
the task when MIXTURE_OR_TASK_NAME is unset; a task whose inputs have another form than the run's
(bare questions, prefixed ones) is evaluated with a warning naming both.
"""
from __future__ import annotations

import contextlib
import logging
import pathlib
from typing import Any, Mapping, Optional, Sequence

from mcwq_t5x.checkpointing import run_folder
from mcwq_t5x.checkpointing import run_info
from mcwq_t5x.checkpointing import run_lock
from mcwq_t5x.data import paths
from mcwq_t5x.data import pipeline
from mcwq_t5x.data import vocab
from mcwq_t5x.data import writers
from mcwq_t5x.engine import compilation_cache
from mcwq_t5x.engine import cpu_settings
from mcwq_t5x.engine import partitioning
from mcwq_t5x.evaluation import prediction
from mcwq_t5x import console
from mcwq_t5x import gin_utils


def default_output_dir(folder: pathlib.Path, step: Optional[int]) -> pathlib.Path:
  """EVAL_OUTPUT_DIR when unset: `<MODEL_DIR>/eval_<step>` (`<folder>/eval` without a step)."""
  if step is None:
    return pathlib.Path(folder) / "eval"
  return run_folder.eval_dir(folder, step)


def evaluate(*,
             model: Any,
             dataset_cfg: pipeline.DatasetConfig,
             checkpoint_path: str,
             output_dir: Optional[str] = None,
             partitioner: Optional[partitioning.Partitioner] = None,
             predict_kwargs: Optional[Mapping[str, Any]] = None,
             num_examples: Optional[int] = None) -> dict[str, Any]:
  """{"metrics", "predictions_path", "metrics_path"}: `dataset_cfg`'s split decoded with the
  checkpoint.

  `dataset_cfg.task_feature_lengths` None: each split's longest example. `predict_kwargs`: e.g.
  {"num_decodes": 4, "decoder_params": {"alpha": 0.6}} (beam search). Raises ValueError (bad
  `predict_kwargs`, task or vocabulary size), run_info.VocabularyMismatchError,
  prediction.UnwritableOutputError, FileNotFoundError, checkpoints.UnreadableCheckpointError /
  NoUsableCheckpointError, run_lock.EvalOutputDirInUseError (names the holder),
  run_folder.TrainingResultsError (EVAL_OUTPUT_DIR holds a training's own results of the split),
  writers.ResultWriteError.
  """
  prediction.check_predict_kwargs(model, predict_kwargs)
  with contextlib.ExitStack() as stack:  # holds EVAL_OUTPUT_DIR's lock until the files are written
    if output_dir is not None:
      prediction.check_writable(output_dir, "EVAL_OUTPUT_DIR")
      run_folder.check_keeps_training_results(output_dir, dataset_cfg.mixture_or_task_name,
                                              dataset_cfg.split)
      # A second eval into this folder stops here, before anything is loaded.
      stack.enter_context(run_lock.hold(output_dir, run_lock.EVAL_LOCK_FILE))
    partitioner = partitioner or partitioning.Partitioner()
    vocab = pipeline.output_vocabulary(dataset_cfg.mixture_or_task_name, dataset_cfg.module)
    run_info.check_model_vocabulary(vocab, model, f"task {dataset_cfg.mixture_or_task_name}",
                                    checkpoint_path)
    if getattr(model, "output_vocabulary", None) is not None:
      run_info.check_vocabulary(model.output_vocabulary, checkpoint_path, "eval (model)")
    # An unreadable newer checkpoint of a MODEL_DIR is skipped with a warning; a named one is an
    # error.
    params, step, folder = prediction.load_params(model, partitioner, checkpoint_path)
    if output_dir is None:
      # The report names the model after MODEL_DIR (the run), not this subfolder.
      output_dir = str(default_output_dir(folder, step))
      prediction.check_writable(output_dir, "default EVAL_OUTPUT_DIR")
      stack.enter_context(run_lock.hold(output_dir, run_lock.EVAL_LOCK_FILE))
    infer_fn = prediction.get_infer_fn(model, partitioner, dataset_cfg.batch_size, predict_kwargs)
    metrics, predictions = prediction.evaluate_split(dataset_cfg, infer_fn, params, num_examples)
    pred_path, met_path = prediction.write_predictions(
        output_dir,
        dataset_cfg,
        predictions,
        metrics,
        extra={
            "step": step,
            "checkpoint": str(checkpoint_path),
            "predict_kwargs": dict(predict_kwargs or {})
        })
    logging.info("%s/%s: %s (%d predictions) -> %s, %s", dataset_cfg.mixture_or_task_name,
                 dataset_cfg.split, metrics, len(predictions), pred_path, met_path)
    return {"metrics": metrics, "predictions_path": str(pred_path), "metrics_path": str(met_path)}


#: `--help` epilog: the gin files and macros of this main.
GIN_HELP = gin_utils.gin_help([
    'gin/mcwq_t5x/models/tiny.gin + gin/mcwq_t5x/runs/eval.gin (any task and checkpoint)',
    'gin/mcwq_t5x/{test,zeroshot,gold}/mt5_small_mcd1_he.gin (paper evaluations)'
], [
    'MIXTURE_OR_TASK_NAME (default: the run\'s task, run.json)', 'CHECKPOINT_PATH', 'SPLIT',
    'EVAL_OUTPUT_DIR (default MODEL_DIR/eval_<step>)', 'TASK_FEATURE_LENGTHS', 'BATCH_SIZE',
    'PREDICT_KWARGS', 'NUM_EXAMPLES', 'HOST_DEVICE_COUNT'
])


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
  """Entry point (`python -m mcwq_t5x.eval`): gin flags -> `evaluate`; prints the metrics."""
  console.setup_logging()
  gin_utils.use_main_module_as("mcwq_t5x.eval")
  try:
    args = gin_utils.parse_flags(
        argv, description=__doc__.splitlines()[0], prog="python -m mcwq_t5x.eval", epilog=GIN_HELP)
  except gin_utils.GinConfigError as e:  # a typo in a flag or file: one line, exit status 1
    raise console.one_line_exit(e) from e
  try:
    vocab.check_vocabulary_variable()
    run_info.adopt_recorded_vocabulary(gin_utils.macro_value("CHECKPOINT_PATH"))
    # Unless the command line binds network.get_config.dtype (one stderr line says which).
    gin_utils.adopt_recorded_dtype(
        gin_utils.macro_value("CHECKPOINT_PATH"), args.command_line_bindings)
    # MIXTURE_OR_TASK_NAME unset: the run's task; one of another input form: a warning.
    gin_utils.adopt_recorded_task(
        gin_utils.macro_value("CHECKPOINT_PATH"), gin_utils.macro_value("MIXTURE_OR_TASK_MODULE"))
    gin_utils.call_configured(cpu_settings.set_host_device_count)
    compilation_cache.use_persistent_cache()
    gin_utils.call_configured(partitioning.initialize_distributed)
    result = gin_utils.call_configured(evaluate)  # pylint: disable=no-value-for-parameter
  # Missing data or vocabulary, a busy or unwritable EVAL_OUTPUT_DIR, a training's results in it:
  # one line, exit status 1.
  except (paths.DataNotFoundError, run_lock.EvalOutputDirInUseError, writers.ResultWriteError,
          run_folder.TrainingResultsError, pipeline.UnknownTaskError, gin_utils.GinConfigError,
          *prediction.INPUT_ERRORS) as e:
    raise console.one_line_exit(e) from e
  print(result["metrics"])
  return result


if __name__ == "__main__":
  console.quiet_native_logs()
  main()
