r"""Training main (T5X `t5x/train.py` habit): gin-configured fine-tuning / training from scratch.

Usage:
  python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/mt5_base_mcd1_he.gin --gin.MODEL_DIR="'runs/x'"
  python -m mcwq_t5x.train --gin_file=... --gin.MODEL_DIR="'runs/x'" --multiprocess_gpu \
    --coordinator_address=HOST0:1234 --process_count=2 --process_index=0   # 1 on the other host

The run file binds `train_script.train` by dynamic registration (nothing is registered at import,
so one process can parse the real T5X's files too, `gin_utils`), with its checkpoint and decoding
settings grouped as T5X groups them (`checkpointing.train_state_init.CheckpointConfig`,
`evaluation.training_eval.EvaluationConfig`). `train` wires the parts: the run folder and devices
(`prepare_model_dir`, `start_devices`), the data (`data.training_data`), the first state
(`train_state_init.restore_or_initialize`: MODEL_DIR's newest readable checkpoint, else
INITIAL_CHECKPOINT_PATH), the loop (`checkpointing.train_loop.TrainLoop`: TRAIN_STEPS steps with
periodic logging, checkpoints and evaluation, T5X's `training_eval/` and `inference_eval/`; a
checkpoint at the next step boundary on SIGTERM, exit status 143) and the final decoding of each
split into MODEL_DIR/predictions/ and metrics/ (`training_eval.final_evaluation`, the files
`checkpointing.run_folder` names). `main` adds the multi-process set-up and the one training at a
time per MODEL_DIR (`run_lock`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import pathlib
import shlex
import sys
import time
from typing import Any, Callable, Optional, Sequence

import gin
import jax

from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import checkpoints as checkpoints_lib
from mcwq_t5x.checkpointing import run_folder
from mcwq_t5x.checkpointing import run_info
from mcwq_t5x.checkpointing import run_lock
from mcwq_t5x.checkpointing import train_loop
from mcwq_t5x.checkpointing import train_state_init
from mcwq_t5x.data import paths
from mcwq_t5x.data import pipeline
from mcwq_t5x.data import training_data
from mcwq_t5x.data import vocab
from mcwq_t5x.data import writers
from mcwq_t5x.engine import compilation_cache
from mcwq_t5x.engine import cpu_settings
from mcwq_t5x.engine import flops as flops_lib
from mcwq_t5x.engine import partitioning
from mcwq_t5x.engine import preemption
from mcwq_t5x.engine import process_watch
from mcwq_t5x.engine import trainer as trainer_lib
from mcwq_t5x.evaluation import prediction
from mcwq_t5x.evaluation import training_eval
from mcwq_t5x import console
from mcwq_t5x import gin_utils

# First line of the config.gin the training writes: a MODEL_DIR's config.gin without it (and
# without a run.json) is the user's own file, never overwritten.
CONFIG_GIN_HEADER = "# The operative gin config of this run, written by mcwq_t5x.train.\n"
# The step line's utilisation figure, here for the tests of `flops` (tests/unit/engine/).
utilisation = train_loop.utilisation


def check_own_config_gin(model_dir: pathlib.Path) -> None:
  """Raises ValueError when `model_dir/config.gin` exists and no training wrote it (no header,
  no run.json beside it): MODEL_DIR is a folder of the user's files."""
  path = model_dir / run_folder.CONFIG_GIN
  if not path.is_file() or (model_dir / run_info.RUN_JSON).is_file():
    return
  with open(path, "rb") as f:
    head = f.read(len(CONFIG_GIN_HEADER.encode()))
  if head != CONFIG_GIN_HEADER.encode():
    raise ValueError(f"MODEL_DIR {model_dir}: its config.gin was not written by a training "
                     "(no run.json, no mcwq_t5x.train header) and would be overwritten; "
                     "choose an empty folder or a run's MODEL_DIR as MODEL_DIR")


def prepare_model_dir(model_dir: str,
                      train_dataset_cfg: pipeline.DatasetConfig,
                      restore: train_state_init.RestoreCheckpointConfig,
                      run_note: Optional[str] = None) -> pathlib.Path:
  """MODEL_DIR (absolute, made) with the operative gin config in its config.gin (process 0), after
  the checks that need nothing loaded: MODEL_DIR is not a folder of the user's files, an
  INITIAL_CHECKPOINT_PATH that will be read is a checkpoint, and a MODEL_DIR with checkpoints was
  trained on this task and split. Logs `run_note` and a training split
  other than "train"."""
  run_folder.check_local_model_dir(model_dir)
  model_dir_p = pathlib.Path(model_dir).absolute()
  model_dir_p.mkdir(parents=True, exist_ok=True)
  if run_note:
    logging.warning("NOTE: %s", run_note)
  if train_dataset_cfg.split != "train":
    logging.warning("training on split %r of %s (not 'train')", train_dataset_cfg.split,
                    train_dataset_cfg.mixture_or_task_name)
  check_own_config_gin(model_dir_p)
  restore.check(model_dir_p)
  train_state_init.check_resumable(model_dir_p, train_dataset_cfg)  # before config.gin is rewritten
  if jax.process_index() == 0:
    # why whole or not at all: the other processes of a run check this file meanwhile
    # (`check_own_config_gin`), and an empty one, seen while it was being written, was refused.
    with writers.open_atomic(model_dir_p / run_folder.CONFIG_GIN) as f:
      f.write(CONFIG_GIN_HEADER + gin.config_str())
  return model_dir_p


def start_devices(
    partitioner: Optional[partitioning.Partitioner],
    measure_matmul_peak: bool) -> tuple[partitioning.Partitioner, Optional[flops_lib.MatmulPeak]]:
  """(the partitioner, default `Partitioner()`; the float32 matmul peak or None), both logged."""
  partitioner = partitioner or partitioning.Partitioner()
  logging.info("mesh %s over %d devices (%s), %d process(es)", dict(partitioner.mesh.shape),
               jax.device_count(),
               jax.devices()[0].platform, jax.process_count())
  peak = flops_lib.matmul_peak() if measure_matmul_peak else None
  if peak is not None:
    logging.info("matmul peak: %.1f GFLOP/s, %s", peak.gflops, peak.describe())
  return partitioner, peak


def _checkpoint_config(checkpoint_cfg: Optional[train_state_init.CheckpointConfig],
                       period: Optional[int],
                       keep: Optional[int]) -> train_state_init.CheckpointConfig:
  """`checkpoint_cfg` (default `CheckpointConfig()`) with the Python callers' `period`/`keep`."""
  cfg = checkpoint_cfg or train_state_init.CheckpointConfig()
  changes = {k: v for k, v in (("period", period), ("keep", keep)) if v is not None}
  return dataclasses.replace(cfg, save=dataclasses.replace(cfg.save, **changes)) if changes else cfg


def set_up_data(model: Any, model_dir: pathlib.Path, partitioner: partitioning.Partitioner,
                train_dataset_cfg: pipeline.DatasetConfig,
                train_eval_dataset_cfg: Optional[pipeline.DatasetConfig], total_steps: int,
                random_seed: int, eval_steps: Optional[int]) -> training_data.TrainingData:
  """The run's data (`training_data.load`), after the vocabulary checks and run.json
  (`train_state_init.check_vocabularies`, `record_run`) and the batch size's check."""
  partitioner.check_batch_size(train_dataset_cfg.batch_size)  # why: before run.json records it
  train_state_init.check_vocabularies(model, model_dir, [train_dataset_cfg, train_eval_dataset_cfg])
  train_state_init.record_run(model_dir, model, train_dataset_cfg, total_steps)
  eval_batch_size = None
  if train_eval_dataset_cfg is not None:
    eval_batch_size = prediction.decoding_batch_size(train_eval_dataset_cfg.batch_size, partitioner)
  return training_data.load(
      train_dataset_cfg,
      local_rows=partitioner.local_batch_rows(train_dataset_cfg.batch_size),
      random_seed=random_seed,
      eval_cfg=train_eval_dataset_cfg,
      eval_batch_size=eval_batch_size,
      eval_steps=eval_steps,
      process=(jax.process_index(), jax.process_count()))


def train(*,
          model: Any,
          train_dataset_cfg: pipeline.DatasetConfig,
          model_dir: str,
          total_steps: int,
          partitioner: Optional[partitioning.Partitioner] = None,
          trainer_cls: Callable[..., trainer_lib.Trainer] = trainer_lib.Trainer,
          train_eval_dataset_cfg: Optional[pipeline.DatasetConfig] = None,
          infer_eval_dataset_cfg: Optional[pipeline.DatasetConfig] = None,
          final_eval_dataset_cfgs: Sequence[pipeline.DatasetConfig] = (),
          checkpoint_cfg: Optional[train_state_init.CheckpointConfig] = None,
          eval_cfg: Optional[training_eval.EvaluationConfig] = None,
          eval_period: int = 1000,
          eval_steps: Optional[int] = 20,
          log_every_steps: int = 100,
          random_seed: int = 0,
          stop_after_steps: Optional[int] = None,
          run_note: Optional[str] = None,
          measure_matmul_peak: bool = True,
          checkpoint_period: Optional[int] = None,
          keep_checkpoints: Optional[int] = None) -> dict[str, Any]:
  """Trains, evaluates and checkpoints: T5X's `train` with its gin names (module docstring).

  Args: MODEL, the training split, MODEL_DIR, TRAIN_STEPS (updates in total, resumed ones
  included); the mesh (default `Partitioner()`) and `trainer.Trainer`; the periodic loss's and
  decoding's splits (None: skipped) and the splits decoded at the end; the
  `train_state_init.CheckpointConfig` (its `period` and `keep` also as `checkpoint_period` and
  `keep_checkpoints`; None: the config's) and `training_eval.EvaluationConfig`; EVAL_PERIOD (0:
  none), EVAL_STEPS (None: every row), LOG_EVERY_STEPS, RANDOM_SEED; `stop_after_steps`: stop
  after that step's checkpoint, no final evaluation; RUN_NOTE, logged at start;
  `measure_matmul_peak`: time `flops.matmul_peak` at start, for the step lines' share of it.

  Returns {"step", "final_eval": {task_split: metrics}, "train_metrics", "wall_s", "train_time_s",
  "decoded_step", "matmul_peak"}. Raises ValueError (bad PREDICT_KWARGS, checked first; unknown
  task; vocabulary/model mismatch; batch) and what `train_state_init.check_vocabularies`,
  `restore_or_initialize` and `train_loop.TrainLoop.run` raise.
  """
  eval_cfg = eval_cfg or training_eval.EvaluationConfig()
  for cfg in (train_dataset_cfg, train_eval_dataset_cfg, infer_eval_dataset_cfg,
              *final_eval_dataset_cfgs):  # why: a misspelt task stops before anything is made
    if cfg is not None:
      pipeline.get_mixture_or_task(cfg.mixture_or_task_name, cfg.module)
  checkpoint_cfg = _checkpoint_config(checkpoint_cfg, checkpoint_period, keep_checkpoints)
  eval_cfg.check(model)
  checkpoint_cfg.save.check()
  t_start = time.time()
  model_dir_p = prepare_model_dir(model_dir, train_dataset_cfg, checkpoint_cfg.restore, run_note)
  partitioner, peak = start_devices(partitioner, measure_matmul_peak)
  data = set_up_data(model, model_dir_p, partitioner, train_dataset_cfg, train_eval_dataset_cfg,
                     total_steps, random_seed, eval_steps)
  # The decoded splits whose lengths come from the data, tokenised now: an example too long to
  # decode stops the run before its state is built, not after its last step.
  periodic_evaluator = training_eval.tokenise_unbounded(
      [infer_eval_dataset_cfg] if eval_period else [], eval_cfg.infer_eval_num_examples).get(0)
  finishes = stop_after_steps is None or stop_after_steps >= total_steps
  final_evaluators = training_eval.tokenise_unbounded(final_eval_dataset_cfgs if finishes else [],
                                                      eval_cfg.final_eval_num_examples)
  trainer = trainer_cls(model=model, partitioner=partitioner, seed=random_seed)
  ckpt = checkpoint_cfg.save.manager(
      model_dir_p,
      training_eval.selection_metric(checkpoint_cfg.save.metric_name_to_monitor,
                                     train_eval_dataset_cfg, final_eval_dataset_cfgs,
                                     bool(eval_period)))
  init = train_state_init.restore_or_initialize(trainer, ckpt, checkpoint_cfg.restore, model,
                                                data.global_shapes(), total_steps)
  if init.data_state is not None:
    data.check_resumed(init.data_state, model_dir_p)
  infer_fn = eval_cfg.infer_fn(model, partitioner)
  note = training_eval.monitoring_note([train_eval_dataset_cfg, infer_eval_dataset_cfg],
                                       final_eval_dataset_cfgs)
  evaluator = training_eval.PeriodicEvaluator(trainer, model_dir_p, data.eval_arrays,
                                              data.eval_batch_size, infer_eval_dataset_cfg,
                                              infer_fn, eval_cfg.infer_eval_num_examples, note,
                                              periodic_evaluator)
  out = train_loop.TrainLoop(trainer, data, ckpt, total_steps, log_every_steps,
                             checkpoint_cfg.save.period, eval_period, evaluator, peak,
                             t_start).run(init.state, stop_after_steps)
  result = {**out.summary(), "final_eval": {}, "matmul_peak": peak}
  finished = out.step >= total_steps  # else stopped early on purpose (stop_after_steps)
  if finished:
    choice = training_eval.choose_checkpoint(ckpt, out.step, out.state.params,
                                             init.abstract_state.params, note)
    result["decoded_step"] = choice.step
    result["final_eval"] = training_eval.final_evaluation(final_eval_dataset_cfgs, infer_fn, choice,
                                                          model_dir_p,
                                                          eval_cfg.final_eval_num_examples,
                                                          final_evaluators)
  ckpt.close()
  result["wall_s"] = time.time() - t_start
  if finished:
    logging.info("done in %.1fs (training %.1fs)", result["wall_s"], out.train_time_s)
  return result


#: `--help` epilog: the gin files and macros of this main.
GIN_HELP = gin_utils.gin_help([
    'gin/mcwq_t5x/tiny_random_split_en.gin (the main job)',
    'gin/mcwq_t5x/mt5_small_mcd1_en.gin (paper experiments: gin/mcwq_t5x/{mt5,t5}_*.gin)',
    'gin/mcwq_t5x/recipes/t5x_adafactor.gin (after an experiment file)'
], [
    'MODEL_DIR', 'MIXTURE_OR_TASK_NAME', 'TASK_FEATURE_LENGTHS', 'TRAIN_STEPS', 'BATCH_SIZE',
    'LEARNING_RATE', 'TRAIN_SPLIT', 'EVAL_SPLIT', 'FINAL_EVAL_SPLIT', 'INITIAL_CHECKPOINT_PATH',
    'METRIC_NAME_TO_MONITOR', 'HOST_DEVICE_COUNT', 'NUM_PARTITIONS',
    'RUN_NOTE (a WARNING at the start; None: none)'
])

#: The errors `main` prints as one last line `<ErrorType>: <message>` (exit status 1): each message
#: names the file, folder or setting and what to do.
ONE_LINE_ERRORS = (checkpoints_lib.CheckpointSaveError, run_lock.ModelDirInUseError,
                   paths.DataNotFoundError, *checkpoint_paths.INPUT_ERRORS,
                   trainer_lib.NonFiniteLossError, checkpoints_lib.OptimizerStateMismatchError,
                   checkpoints_lib.KeepCheckpointsError, training_data.OtherTrainingDataError,
                   writers.ResultWriteError, prediction.ExampleTooLongError,
                   partitioning.BatchSizeError, pipeline.UnknownTaskError,
                   checkpoints_lib.NoUsableCheckpointError)


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
  """Entry point (`python -m mcwq_t5x.train`): gin flags, multi-process set-up, `train()`.

  Raises ValueError (bad multi-process flags), SystemExit with one last line
  (`gin_utils.GinConfigError`; `ONE_LINE_ERRORS`, e.g. `CheckpointSaveError`,
  `run_lock.ModelDirInUseError`, `pipeline.UnknownTaskError`, `DataNotFoundError` such as
  `vocab.VocabularyNotFoundError`, `NonFiniteLossError`; "Preempted: ..." with status 143;
  "LostProcessError: ..." naming a lost process and the resume command, status 1), and whatever
  else `train` raises; a start that fails before it trains leaves MODEL_DIR as it was
  (`undone_if_failed_at_start`).
  """
  console.setup_logging()
  gin_utils.use_main_module_as("mcwq_t5x.train")
  try:
    args = gin_utils.parse_flags(
        argv,
        description=__doc__.splitlines()[0],
        extra_args=partitioning.add_multiprocess_flags,
        prog="python -m mcwq_t5x.train",
        epilog=GIN_HELP)
  except gin_utils.GinConfigError as e:  # a typo in a flag or file: one line, exit status 1
    raise console.one_line_exit(e) from e
  try:
    vocab.check_vocabulary_variable()
  except paths.DataNotFoundError as e:
    raise console.one_line_exit(e) from e
  gin_utils.call_configured(cpu_settings.set_host_device_count)
  cpu_settings.set_xla_cpu_flags()
  compilation_cache.use_persistent_cache()
  # T5X's multi-process flags initialise `jax.distributed` before any device is used.
  if partitioning.initialize_from_flags(args) is None:
    gin_utils.call_configured(partitioning.initialize_distributed)
  # Freed host memory is kept for reuse (CPU training flags: `cpu_settings`).
  if jax.default_backend() == "cpu":
    cpu_settings.set_host_malloc_options()
  model_dir = gin_utils.macro_value("MODEL_DIR")
  try:
    if model_dir:
      run_folder.check_local_model_dir(model_dir)  # why: before the lock makes ./gs:/bucket/...
  except run_folder.ModelDirNotLocalError as e:
    raise console.one_line_exit(e) from e
  lost_timeout = (
      process_watch.TIMEOUT_S if args.lost_process_timeout is None else args.lost_process_timeout)
  # If another process dies, the others end within `lost_timeout` s naming it and the resume
  # command.
  stop = train_loop.LostProcessStop(model_dir, command_line(argv), console.error_line)
  watch = process_watch.ProcessWatch(stop, timeout_s=lost_timeout)
  watch.start()  # several processes: says which one is gone if one dies
  status = "done"
  try:
    # A second training of the folder stops at once, naming the holder (process 0 holds it for all).
    with undone_if_failed_at_start(model_dir), (run_lock.hold(model_dir)
                                                if model_dir else contextlib.nullcontext()):
      if model_dir and checkpoint_paths.finished_steps(model_dir):  # resuming: its vocabulary
        run_info.adopt_recorded_vocabulary(model_dir)
      return gin_utils.call_configured(train)
  except ONE_LINE_ERRORS as e:
    # One clear last line (Orbax has logged a failed save's details above), exit status 1. Every
    # process of a multi-process run stops so (the same save, the same lock, the same step).
    raise console.one_line_exit(e) from e
  except preemption.Preempted as e:
    console.print_error(e)
    sys.exit(preemption.EXIT_STATUS)
  except Exception as e:  # pylint: disable=broad-except  (this process's error, or another's end)
    error = console.original_error(e)
    stop.on_error(error, watch, lost_timeout)  # a collective lost its other end: names which
    first = str(error).strip().splitlines()
    status = f"failed: {type(error).__name__}: {first[0][:300] if first else ''}"
    raise
  finally:
    watch.finish(status)


@contextlib.contextmanager
def undone_if_failed_at_start(model_dir: Optional[str]):
  """Context: when what it runs raises before the run wrote a checkpoint or a metrics row, MODEL_DIR
  is put back as it was (`run_folder.FolderBefore.undo_failed_start`, process 0): no config.gin,
  train.lock or run.json of a run that never trained is left. Another training's folder
  (`run_lock.ModelDirInUseError`) is never touched."""
  before = (
      run_folder.FolderBefore.take(model_dir) if model_dir and jax.process_index() == 0 else None)
  try:
    yield
  except run_lock.ModelDirInUseError:
    raise
  except BaseException:
    if before is not None:
      try:
        undone = before.undo_failed_start()
      except OSError as e:  # why: the run's own error is the one to report
        logging.warning("MODEL_DIR %s: cannot undo the failed start: %s", before.folder, e)
      else:
        if undone:
          logging.info("MODEL_DIR %s: the failed start undone (%s)", before.folder,
                       "folder removed" if undone == ["."] else ", ".join(undone))
    raise


def command_line(argv: Optional[Sequence[str]]) -> str:
  """The command that reruns this training: `python -m mcwq_t5x.train` with `argv`, or this
  process's own command line when `argv` is None (`run_lock.command_line`)."""
  if argv is None:
    return run_lock.command_line()
  return " ".join(shlex.quote(a) for a in ["python", "-m", "mcwq_t5x.train", *argv])


if __name__ == "__main__":
  console.quiet_native_logs()
  main()
