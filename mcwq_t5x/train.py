r"""Training main (T5X `t5x/train.py` habit): gin-configured fine-tuning / training from scratch.

Usage:
  python -m mcwq_t5x.train --gin_file=gin/mcwq_t5x/mt5_base_mcd1_he.gin --gin.MODEL_DIR="'runs/x'"
  python -m mcwq_t5x.train --gin_file=... --gin.MODEL_DIR="'runs/x'" --multiprocess_gpu \
    --coordinator_address=HOST0:1234 --process_count=2 --process_index=0   # 1 on the other host

The run file binds `train_script.train` by dynamic registration (nothing is registered at import,
so one process can parse the real T5X's files too, `gin_utils`). `train` builds the mesh, model
and `Trainer`; resumes from MODEL_DIR's newest readable checkpoint, else INITIAL_CHECKPOINT_PATH;
trains TRAIN_STEPS steps with periodic logging, checkpoints and evaluation (loss and decoding,
T5X's `training_eval/` and `inference_eval/`); saves at the next step boundary on SIGTERM (exit
status 143); and decodes the final splits into MODEL_DIR/predictions/ and metrics/ (the files
`checkpointing.run_folder` names). One training at a time per MODEL_DIR (`run_lock`).
"""
from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import shlex
import sys
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from mcwq_t5x.checkpointing import checkpoint_loaders
from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import checkpoints as checkpoints_lib
from mcwq_t5x.checkpointing import run_info
from mcwq_t5x.checkpointing import run_folder
from mcwq_t5x.checkpointing import run_lock
from mcwq_t5x.data import paths
from mcwq_t5x.data import pipeline
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
from mcwq_t5x import console
from mcwq_t5x import gin_utils


def check_model_and_task(model: Any, cfg: pipeline.DatasetConfig) -> None:
  """Checks the task exists and its vocabulary fits the model's `vocab_size`.

  ValueError names the closest registered tasks, or both sizes.
  """
  vocab = pipeline.output_vocabulary(cfg.mixture_or_task_name, cfg.module)
  run_info.check_model_vocabulary(vocab, model, f"task {cfg.mixture_or_task_name}")


def loss_over_split(trainer: trainer_lib.Trainer, state: Any, arrays: Mapping[str, np.ndarray],
                    batch_size: int, partitioner: partitioning.Partitioner) -> dict[str, float]:
  """{"loss", "cross_ent_loss", "accuracy"} per target token over every row of `arrays`."""
  sums: dict[str, float] = {}
  n_rows = len(next(iter(arrays.values())))
  for start in range(0, n_rows, batch_size):
    chunk, _ = pipeline.pad_batch({
        k: v[start:start + batch_size] for k, v in arrays.items()
    }, batch_size)
    batch = {k: jax.device_put(v, partitioner.data_sharding) for k, v in chunk.items()}
    for k, v in jax.device_get(trainer.eval_step(state, batch)).items():
      sums[k] = sums.get(k, 0.0) + float(v)
  return {
      k: v
      for k, v in trainer_lib.summarize_metrics(sums).items()
      if k in ("loss", "cross_ent_loss", "accuracy")
  }


def selection_metric(metric_name_to_monitor: Optional[str],
                     train_eval_dataset_cfg: Optional[pipeline.DatasetConfig],
                     final_eval_dataset_cfgs: Sequence[pipeline.DatasetConfig]) -> Optional[str]:
  """The metric that may select the decoded checkpoint: None when the periodic evaluation reads a
  split the final evaluation reports (no held-out dev, e.g. the tiny job: its "dev loss" is the
  test loss), so that no checkpoint is chosen on the test set; a warning says so."""
  if not metric_name_to_monitor or train_eval_dataset_cfg is None:
    return metric_name_to_monitor
  key = (train_eval_dataset_cfg.mixture_or_task_name, train_eval_dataset_cfg.split)
  if any((c.mixture_or_task_name, c.split) == key for c in final_eval_dataset_cfgs):
    logging.warning(
        "metric_name_to_monitor=%r would select the checkpoint on %s/%s, the split the final "
        "evaluation reports: no held-out dev split, so the final evaluation decodes the last "
        "checkpoint and the periodic figures are monitoring only", metric_name_to_monitor, *key)
    return None
  return metric_name_to_monitor


def utilisation(summary: Mapping[str, float], peak: Optional[flops_lib.MatmulPeak]) -> str:
  """The step line's utilisation: "  12.3 GFLOP/s = 9.1% of the XLA matmul's 135.0" (the model
  FLOPs per second of the logged steps, `summary["model_gflops_per_s"]`, and their share of the
  start-up matmul peak), "  12.3 GFLOP/s" without a peak, "" without a FLOP count."""
  gflops = summary.get("model_gflops_per_s")
  if gflops is None:
    return ""
  if peak is None:
    return f"  {gflops:.1f} GFLOP/s"
  return (f"  {gflops:.1f} GFLOP/s = {100.0 * gflops / peak.gflops:.1f}% of the {peak.kernel} "
          f"matmul's {peak.gflops:.1f}")


# --------------------------------------------------------------------------------------------
# train()
# --------------------------------------------------------------------------------------------
# First line of the config.gin the training writes: a MODEL_DIR's config.gin without it (and
# without a run.json) is the user's own file, never overwritten.
CONFIG_GIN_HEADER = "# The operative gin config of this run, written by mcwq_t5x.train.\n"


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
          final_eval_num_examples: Optional[int] = None,
          eval_period: int = 1000,
          eval_steps: Optional[int] = 20,
          infer_eval_num_examples: Optional[int] = None,
          infer_batch_size: int = 64,
          predict_kwargs: Optional[Mapping[str, Any]] = None,
          log_every_steps: int = 100,
          checkpoint_period: int = 1000,
          keep_checkpoints: Optional[int] = 3,
          initial_checkpoint_path: Optional[str] = None,
          resume_params_only: bool = False,
          random_seed: int = 0,
          metric_name_to_monitor: Optional[str] = None,
          metric_mode: str = "min",
          stop_after_steps: Optional[int] = None,
          run_note: Optional[str] = None,
          measure_matmul_peak: bool = True) -> dict[str, Any]:
  """Trains, evaluates and checkpoints; gin names as in T5X.

  Args:
    model: `engine.model.EncoderDecoderModel` (gin MODEL).
    train_dataset_cfg: MIXTURE_OR_TASK_NAME, TASK_FEATURE_LENGTHS, BATCH_SIZE, ...
    model_dir: MODEL_DIR. total_steps: TRAIN_STEPS (updates in total, resumed ones included).
    partitioner, trainer_cls: the mesh (`partitioning.Partitioner()`) and `trainer.Trainer`.
    train_eval_dataset_cfg, infer_eval_dataset_cfg: periodic loss / decoding data (None: skip).
    final_eval_dataset_cfgs: splits decoded at the end (first `final_eval_num_examples`).
    eval_period, eval_steps (None: every row), infer_eval_num_examples, infer_batch_size,
      predict_kwargs (`model.predict_batch`, {"num_decodes": 1} = greedy), log_every_steps,
      checkpoint_period (a final one is always written), keep_checkpoints: as in T5X.
    initial_checkpoint_path: INITIAL_CHECKPOINT_PATH, parameters only with a fresh optimizer (ours,
      `t5x.train`'s, T5X-native or Hugging Face); ignored when MODEL_DIR has a checkpoint.
    resume_params_only: RESUME_PARAMS_ONLY: resume parameters and step, fresh optimizer state.
    random_seed: init / dropout / data-order seed.
    metric_name_to_monitor, metric_mode: keep the best checkpoints by this `eval_metrics.jsonl` key
      ("training_eval/loss", "min") plus the newest, and decode the best (T5X
      `SaveBestCheckpointer`; the paper's recipe); None: the last ones, decode the final step.
    stop_after_steps: stop after checkpointing at this step, no final evaluation (resume tests).
    run_note: a line logged at start. measure_matmul_peak: time the float32 matmul peak at start
      (`flops.matmul_peak`) for the step lines' share of it.

  Returns:
    {"step", "final_eval": {task_split: metrics}, "train_metrics", "wall_s", "train_time_s",
     "decoded_step", "matmul_peak"}.

  Raises:
    ValueError: bad predict_kwargs (checked first), unknown task, vocabulary/model mismatch, batch.
    run_info.VocabularyMismatchError: resuming with another vocabulary than run.json's.
    trainer.NonFiniteLossError: NaN/Inf loss, raised at the next log/eval/checkpoint step and
      naming the bad step; nothing from it on is logged or saved.
    checkpoints.CheckpointSaveError: a checkpoint write failed (names the last good one).
    preemption.Preempted: SIGTERM; the checkpoint of the next step boundary was saved.
  """
  prediction.check_predict_kwargs(model, predict_kwargs)
  t_start = time.time()
  model_dir_p = pathlib.Path(model_dir).absolute()
  model_dir_p.mkdir(parents=True, exist_ok=True)
  if run_note:
    logging.warning("NOTE: %s", run_note)
  if train_dataset_cfg.split != "train":
    logging.warning("training on split %r of %s (not 'train')", train_dataset_cfg.split,
                    train_dataset_cfg.mixture_or_task_name)
  check_own_config_gin(model_dir_p)
  if initial_checkpoint_path and not checkpoint_paths.finished_steps(model_dir_p):
    checkpoint_paths.locate(initial_checkpoint_path)  # why: a wrong path fails before the compile
  if jax.process_index() == 0:
    # why whole or not at all: the other processes of a run check this file meanwhile
    # (`check_own_config_gin`), and an empty one, seen while it was being written, was refused.
    with writers.open_atomic(model_dir_p / run_folder.CONFIG_GIN) as f:
      f.write(CONFIG_GIN_HEADER + gin.config_str())
  partitioner = partitioner or partitioning.Partitioner()
  logging.info("mesh %s over %d devices (%s), %d process(es)", dict(partitioner.mesh.shape),
               jax.device_count(),
               jax.devices()[0].platform, jax.process_count())
  peak = flops_lib.matmul_peak() if measure_matmul_peak else None
  if peak is not None:
    logging.info("matmul peak: %.1f GFLOP/s, %s", peak.gflops, peak.describe())

  # --- data ---------------------------------------------------------------------------------
  check_model_and_task(model, train_dataset_cfg)
  if checkpoint_paths.finished_steps(model_dir_p):  # resuming: the vocabulary must not change
    run_info.check_vocabulary(
        getattr(model, "output_vocabulary", None), model_dir_p, "train (resuming)")
  if jax.process_index() == 0:
    run_info.write(
        model_dir_p,
        model=model,
        task=train_dataset_cfg.mixture_or_task_name,
        split=train_dataset_cfg.split,
        feature_lengths=train_dataset_cfg.task_feature_lengths,
        train_steps=total_steps,
        batch_size=train_dataset_cfg.batch_size,
        pack=train_dataset_cfg.pack)
  # Every process reads the whole split and gathers its rows of each global batch (its data
  # shard: `local_rows`), so the global batch of a step is the same for any number of processes.
  local_rows = partitioner.local_batch_rows(train_dataset_cfg.batch_size)
  t0 = time.time()
  train_arrays = pipeline.load_feature_arrays(train_dataset_cfg)
  data_seed = random_seed if train_dataset_cfg.seed is None else train_dataset_cfg.seed
  batches = pipeline.DeterministicBatches(
      train_arrays, train_dataset_cfg.batch_size, seed=data_seed, shuffle=train_dataset_cfg.shuffle)
  logging.info(
      "training data: %d rows (%.1fs); process %d of %d feeds rows %d:%d of each batch of %d",
      batches.num_rows,
      time.time() - t0, jax.process_index(), jax.process_count(), local_rows.start, local_rows.stop,
      train_dataset_cfg.batch_size)
  eval_arrays, eval_batch_size = None, None
  if train_eval_dataset_cfg is not None:
    check_model_and_task(model, train_eval_dataset_cfg)
    eval_batch_size = prediction.decoding_batch_size(train_eval_dataset_cfg.batch_size, partitioner)
    n = None if eval_steps is None else eval_steps * eval_batch_size
    eval_arrays = pipeline.load_feature_arrays(train_eval_dataset_cfg, 0, 1, num_examples=n)

  # --- state --------------------------------------------------------------------------------
  trainer = trainer_cls(model=model, partitioner=partitioner, seed=random_seed)
  example = batches.batch(0, local_rows)
  global_shapes = {k: (train_dataset_cfg.batch_size,) + v.shape[1:] for k, v in example.items()}
  input_types = {k: jnp.int32 for k in example}
  # Model FLOPs of a step (the network's matmuls on the batch's padded shapes), None for a model
  # without a T5 network config.
  step_flops = flops_lib.batch_train_step_flops(
      getattr(getattr(model, "module", None), "config", None), global_shapes)
  metric_name_to_monitor = selection_metric(metric_name_to_monitor, train_eval_dataset_cfg,
                                            final_eval_dataset_cfgs)
  if metric_name_to_monitor and not (eval_period and train_eval_dataset_cfg is not None):
    logging.warning(
        "metric_name_to_monitor=%r needs evaluations (eval_period > 0 and a training-eval "
        "split): keeping the most recent checkpoints and decoding the final parameters instead",
        metric_name_to_monitor)
    metric_name_to_monitor = None
  ckpt = checkpoints_lib.CheckpointManager(
      model_dir_p,
      save_interval_steps=checkpoint_period,
      max_to_keep=keep_checkpoints,
      metric_name_to_monitor=metric_name_to_monitor,
      metric_mode=metric_mode)
  abstract_state = trainer.state_shapes(global_shapes, input_types)
  # Resume wins over INITIAL_CHECKPOINT_PATH; a corrupt newest checkpoint falls back to an older
  # one.
  restored = ckpt.restore_latest(
      abstract_state, optimizer=trainer.optimizer, params_only=resume_params_only)
  if restored is not None:
    step, state, data_state = restored
    logging.info("resumed from %s (data position: %s)",
                 checkpoint_paths.checkpoint_dir(ckpt.directory, step), data_state)
    if data_state.get("data_seed", data_seed) != data_seed or data_state.get(
        "global_batch_size", train_dataset_cfg.batch_size) != train_dataset_cfg.batch_size:
      logging.warning(
          "data seed/batch size changed since the checkpoint (%s); the data order "
          "will differ from the interrupted run", data_state)
  elif initial_checkpoint_path:
    logging.info("initialising the parameters from %s (fresh optimizer state)",
                 initial_checkpoint_path)
    params = checkpoint_loaders.load_params(initial_checkpoint_path, model.module.config,
                                            abstract_state.params).params
    state = trainer.create_state(global_shapes, input_types, init_params=params)
    del params
  else:
    state = trainer.create_state(global_shapes, input_types)
  start_step = int(state.step)
  run_folder.drop_metric_rows_after(model_dir_p,
                                    start_step)  # a resumed run writes those steps again
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))
  logging.info("model: %.2fM parameters; starting at step %d of %d", n_params / 1e6, start_step,
               total_steps)

  def data_state(step):
    return {
        "step": int(step),
        "data_seed": int(data_seed),
        "global_batch_size": int(train_dataset_cfg.batch_size),
        "task": train_dataset_cfg.mixture_or_task_name,
        "split": train_dataset_cfg.split
    }

  infer_fn = prediction.get_infer_fn(model, partitioner, infer_batch_size, predict_kwargs)
  infer_eval: dict[str, Any] = {}

  reported = {(c.mixture_or_task_name, c.split) for c in final_eval_dataset_cfgs}
  monitor_note = ""
  if any((c.mixture_or_task_name, c.split) in reported
         for c in (train_eval_dataset_cfg, infer_eval_dataset_cfg)
         if c is not None):
    monitor_note = " (monitoring on the reported split, selects nothing)"

  def evaluate(step: int, train_state: Any) -> dict[str, Any]:
    """The training-time evaluation of `train_state` at `step` (logged and written)."""
    record: dict[str, Any] = {"step": step}
    if eval_arrays is not None:  # the "dev loss" (of whatever split EVAL_SPLIT names)
      losses = loss_over_split(trainer, train_state, eval_arrays, eval_batch_size, partitioner)
      record.update({f"training_eval/{k}": v for k, v in losses.items()})
    if infer_eval_dataset_cfg is not None:
      t = time.time()
      if "evaluator" not in infer_eval:  # built (the split tokenised) once per run
        infer_eval["evaluator"] = prediction.make_evaluator(infer_eval_dataset_cfg,
                                                            infer_eval_num_examples)
      metrics, _ = prediction.evaluate_split(
          infer_eval_dataset_cfg,
          infer_fn,
          train_state.params,
          infer_eval_num_examples,
          evaluator=infer_eval["evaluator"],
          return_predictions=False)
      record.update({f"inference_eval/{k}": v for k, v in metrics.items()})
      record["inference_eval/time_s"] = time.time() - t
    if len(record) > 1:
      eval_writer.write_scalars(step, {k: v for k, v in record.items() if k != "step"})
      eval_writer.flush()
      logging.info("eval step %d%s: %s", step, monitor_note, {
          k: round(v, 4) for k, v in record.items() if k != "step"
      })
      run_folder.append_jsonl(model_dir_p / run_folder.EVAL_METRICS, pipeline.to_jsonable(record))
    return record

  # --- loop ---------------------------------------------------------------------------------
  stop_at = total_steps if stop_after_steps is None else min(stop_after_steps, total_steps)
  timer = trainer_lib.StepTimer()
  last_logged: dict[str, Any] = {}
  step = start_step
  # Steps are dispatched without waiting for the device: their metrics stay on the device until
  # the next log step, and non-finite steps are recorded in `guard` (the state freezes at the last
  # good one), checked before every log, evaluation and checkpoint save; so nothing from a
  # non-finite step is logged or saved, and the error names the first bad step (at most one log or
  # checkpoint interval late).
  pending: list[dict[str, Any]] = []
  guard = trainer.initial_guard()
  # Closed when the loop ends, however it ends (nothing is written to them after it).
  train_writer = run_folder.create_metric_writer(str(model_dir_p / run_folder.TRAIN_EVENTS))
  eval_writer = run_folder.create_metric_writer(str(model_dir_p / run_folder.EVAL_EVENTS))
  t_train = time.time()
  # SIGTERM (a scheduler's preemption notice): a checkpoint at the next step boundary, the same
  # step in every process, then `preemption.Preempted` (see `preemption.PreemptionWatch`).
  watch = preemption.PreemptionWatch(start_step)
  preempted = False
  try:
    watch.start()
    while step < stop_at:
      local = batches.batch(step, local_rows)
      batch = partitioner.make_global_batch(local, train_dataset_cfg.batch_size)
      state, metrics, guard = trainer.train_step_async(state, batch, guard)
      step += 1
      preempted = watch.reached(step)
      pending.append(metrics)
      if len(pending) > 2:  # at most 2 steps in flight: the host does not queue a whole interval
        jax.block_until_ready(pending[-3]["loss"])
      if step % log_every_steps == 0 or step == stop_at or preempted:
        trainer.check_finite(guard, state)
        sums: dict[str, float] = {}
        for host in jax.device_get(pending):
          for k in ("loss", "cross_ent_loss", "z_loss", "accuracy_numerator", "num_tokens",
                    "num_examples"):
            if k in host:
              sums[k] = sums.get(k, 0.0) + float(host[k])
          sums["learning_rate"] = float(host["learning_rate"])
          timer.add(
              float(host.get("num_examples", train_dataset_cfg.batch_size)),
              float(host.get("num_tokens", 0.0)), step_flops)
        pending = []
        summary = trainer_lib.summarize_metrics(sums)
        summary.update(timer.read_and_reset())
        summary.pop("num_tokens", None)
        summary.pop("num_examples", None)
        if peak is not None and "model_gflops_per_s" in summary:
          summary["matmul_peak_share"] = summary["model_gflops_per_s"] / peak.gflops
        train_writer.write_scalars(step, summary)
        logging.info(
            "step %d/%d (%.0f%%): loss %.4f  acc %.4f  lr %.2e  %.3fs/step  %.1f ex/s  "
            "%.0f tok/s%s", step, total_steps, 100.0 * step / total_steps, summary["loss"],
            summary.get("accuracy", float("nan")), summary["learning_rate"], summary["step_time_s"],
            summary["examples_per_s"], summary["tokens_per_s"], utilisation(summary, peak))
        last_logged = {"step": step, "elapsed_s": time.time() - t_start, **summary}
        run_folder.append_jsonl(model_dir_p / run_folder.TRAIN_METRICS,
                                pipeline.to_jsonable(last_logged))
      # Evaluate before saving, so that the checkpoint carries the step's metrics (best-keeping).
      record = None
      if eval_period and (step % eval_period == 0 or step == total_steps):
        trainer.check_finite(guard, state)
        record = evaluate(step, state)
      force = (step == stop_at) or preempted or (bool(metric_name_to_monitor) and
                                                 record is not None)
      if force or step % max(int(checkpoint_period), 1) == 0:
        trainer.check_finite(guard, state)  # never save a state frozen after a non-finite step
      ckpt.save(
          step,
          state,
          data_state(step),
          force=force,
          metrics=None if record is None else {
              k: v for k, v in record.items() if k != "step"
          })
      if preempted:
        break
    ckpt.wait()  # the last save's failure (e.g. disk full) surfaces here, handled below
  except trainer_lib.NonFiniteLossError as e:
    ckpt.wait()
    last = ckpt.latest_step()
    logging.error(
        "stopping on a non-finite loss at step %d; %s", e.step,
        (f"the last good checkpoint is step {last} in {ckpt.directory}" if last is not None else
         "no checkpoint had been written yet, so there is nothing to resume from"))
    raise
  except checkpoints_lib.CheckpointSaveError as e:
    logging.error("stopping: %s", e)
    ckpt.close()  # no save left running when the interpreter exits
    raise
  finally:
    watch.stop()
    train_writer.close()
    eval_writer.close()
    ckpt.wait()
  train_time = time.time() - t_train
  if preempted:
    ckpt.close()
    error = preemption.Preempted(step, total_steps,
                                 checkpoint_paths.checkpoint_dir(ckpt.directory, step))
    logging.warning("%s", error)
    raise error
  result: dict[str, Any] = {
      "step": step,
      "train_metrics": last_logged,
      "train_time_s": train_time,
      "final_eval": {},
      "matmul_peak": peak
  }
  if step < total_steps:  # stopped early on purpose (stop_after_steps)
    ckpt.close()
    result["wall_s"] = time.time() - t_start
    return result

  # --- final evaluation ---------------------------------------------------------------------
  # With METRIC_NAME_TO_MONITOR: the kept checkpoint with the best value (e.g. the lowest dev loss).
  decoded_step, decode_params, selection = step, state.params, {}
  best = ckpt.best_step()
  if best is not None:
    best_value = ckpt.metric(best)
    selection = {
        "selected_by": metric_name_to_monitor,
        "metric_mode": metric_mode,
        metric_name_to_monitor: best_value
    }
    logging.info(
        "final evaluation decodes checkpoint_%d: the %s %s (%.6g) of the kept checkpoints "
        "%s", best, "lowest" if metric_mode == "min" else "highest", metric_name_to_monitor,
        best_value, ckpt.all_steps())
    if best != step:
      decode_params = checkpoints_lib.restore_params(
          checkpoint_paths.checkpoint_dir(ckpt.directory, best), abstract_state.params)
      decoded_step = best
  else:
    selection = {"selected_by": "last checkpoint"}
    logging.info("final evaluation decodes the last checkpoint (checkpoint_%d)%s", step,
                 "" if not monitor_note else ": no held-out dev split, no checkpoint selection")
  result["decoded_step"] = decoded_step
  for cfg in final_eval_dataset_cfgs:
    t = time.time()
    metrics, predictions = prediction.evaluate_split(cfg, infer_fn, decode_params,
                                                     final_eval_num_examples)
    pred_path, met_path = prediction.write_predictions(
        model_dir_p,
        cfg,
        predictions,
        metrics,
        extra={
            "step": decoded_step,
            "checkpoint": str(checkpoint_paths.checkpoint_dir(ckpt.directory, decoded_step)),
            "decode_time_s": time.time() - t,
            **selection
        })
    logging.info("final %s/%s (%d examples, %.1fs): %s -> %s", cfg.mixture_or_task_name, cfg.split,
                 len(predictions),
                 time.time() - t, metrics, pred_path)
    result["final_eval"][f"{cfg.mixture_or_task_name}_{cfg.split}"] = metrics
  ckpt.close()
  result["wall_s"] = time.time() - t_start
  logging.info("done in %.1fs (training %.1fs)", result["wall_s"], train_time)
  return result


#: `--help` epilog: the gin files and macros of this main.
GIN_HELP = gin_utils.gin_help([
    'gin/mcwq_t5x/tiny_random_split_en.gin (the main job)',
    'gin/mcwq_t5x/mt5_small_mcd1_en.gin (paper experiments: gin/mcwq_t5x/{mt5,t5}_*.gin)',
    'gin/mcwq_t5x/recipes/t5x_adafactor.gin (after an experiment file)'
], [
    'MODEL_DIR', 'MIXTURE_OR_TASK_NAME', 'TASK_FEATURE_LENGTHS', 'TRAIN_STEPS', 'BATCH_SIZE',
    'LEARNING_RATE', 'TRAIN_SPLIT', 'EVAL_SPLIT', 'FINAL_EVAL_SPLIT', 'INITIAL_CHECKPOINT_PATH',
    'METRIC_NAME_TO_MONITOR', 'HOST_DEVICE_COUNT', 'NUM_PARTITIONS'
])


def main(argv: Optional[Sequence[str]] = None) -> dict[str, Any]:
  """Entry point (`python -m mcwq_t5x.train`): gin flags, multi-process set-up, `train()`.

  Raises gin_utils.GinConfigError (bad gin flags), ValueError (bad multi-process flags), SystemExit
  with one last line (`CheckpointSaveError`, `run_lock.ModelDirInUseError`, `DataNotFoundError`
  such as `vocab.VocabularyNotFoundError`; "Preempted: ..." with status 143; "LostProcessError: ..."
  naming a lost process and the resume command, status 1), and whatever `train` raises.
  """
  console.setup_logging()
  gin_utils.use_main_module_as("mcwq_t5x.train")
  args = gin_utils.parse_flags(
      argv,
      description=__doc__.splitlines()[0],
      extra_args=partitioning.add_multiprocess_flags,
      prog="python -m mcwq_t5x.train",
      epilog=GIN_HELP)
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
  lost_timeout = (
      process_watch.TIMEOUT_S if args.lost_process_timeout is None else args.lost_process_timeout)
  # If another process dies, the others end within `lost_timeout` s naming it and the resume
  # command.
  watch = process_watch.ProcessWatch(
      lambda lost: _stop_lost_process(lost, model_dir, argv), timeout_s=lost_timeout)
  watch.start()  # several processes: says which one is gone if one dies
  status = "done"
  try:
    # A second training of the folder stops at once, naming the holder (process 0 holds it for all).
    with run_lock.hold(model_dir) if model_dir else contextlib.nullcontext():
      if model_dir and checkpoint_paths.finished_steps(model_dir):  # resuming: its vocabulary
        run_info.adopt_recorded_vocabulary(model_dir)
      return gin_utils.call_configured(train)
  except (checkpoints_lib.CheckpointSaveError, run_lock.ModelDirInUseError, paths.DataNotFoundError,
          *checkpoint_paths.INPUT_ERRORS) as e:
    # One clear last line (Orbax has logged a failed save's details above), exit status 1. Every
    # process of a multi-process run stops so (the same save, the same lock).
    raise console.one_line_exit(e) from e
  except preemption.Preempted as e:
    console.print_error(e)
    sys.exit(preemption.EXIT_STATUS)
  except trainer_lib.NonFiniteLossError:  # every process at the same step
    raise
  except Exception as e:  # pylint: disable=broad-except  (this process's error, or another's end)
    if process_watch.is_lost_process_error(e):  # a collective lost its other end: which one?
      lost = watch.wait_for_verdict(lost_timeout + 5 * process_watch.INTERVAL_S)
      _stop_lost_process(
          lost or f"another process of the run is gone ({type(e).__name__}: "
          f"{str(console.original_error(e)).strip().splitlines()[0][:300]})", model_dir, argv)
    first = str(console.original_error(e)).strip().splitlines()
    status = f"failed: {type(console.original_error(e)).__name__}: {first[0][:300] if first else ''}"
    raise
  finally:
    watch.finish(status)


def _stop_lost_process(lost: str, model_dir: Optional[str], argv: Optional[Sequence[str]]) -> None:
  """Ends this process of a multi-process run whose other process is gone (`lost` says which and
  why): one last line, `LostProcessError: ...`, naming it and the command that resumes the run
  (`process_watch.resume_message`), exit status 1 at once (also from the watch's thread).
  Exiting normally would wait for JAX's shutdown barrier and end in XLA's abort ("The tasks have
  crashed", exit status 134) after our line."""
  steps = checkpoint_paths.finished_steps(model_dir) if model_dir else []
  resume_from = (
      str(checkpoint_paths.checkpoint_dir(pathlib.Path(model_dir).absolute(), steps[-1]))
      if steps else "the start (no checkpoint had been written)")
  command = (
      run_lock.command_line() if argv is None else " ".join(
          shlex.quote(a) for a in ["python", "-m", "mcwq_t5x.train", *argv]))
  message = process_watch.resume_message(lost, command, resume_from)
  for handler in logging.getLogger().handlers:
    handler.flush()
  sys.stdout.flush()
  print(console.error_line(process_watch.LostProcessError(message)), file=sys.stderr, flush=True)
  os._exit(1)  # pylint: disable=protected-access


if __name__ == "__main__":
  console.quiet_native_logs()
  main()
