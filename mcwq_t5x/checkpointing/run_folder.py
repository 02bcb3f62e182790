"""The run folder (MODEL_DIR) of `mcwq_t5x.train` and `mcwq_t5x.eval`: the name of every file and
folder in it, "is this a run folder, and of which run", and the writers of its metrics files and
TensorBoard event files, and what a training start added to it (`FolderBefore`: a start that
fails before it trains is undone). T5X's layout (`checkpoint_<step>/`, `train/`,
`eval/`) plus ours.

  train.lock  run.json  vocab/spm.model  config.gin  checkpoint_<step>/  train/ eval/
  train_metrics.jsonl  eval_metrics.jsonl  predictions/<task>_<split>.txt
  metrics/<task>_<split>.json  eval_<step>/{eval.lock,predictions/,metrics/} (`mcwq_t5x.eval`)
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import logging
import pathlib
import re
import time
from typing import Any, Mapping, Optional

import jax

from mcwq_t5x.checkpointing import checkpoint_paths

LOCK_FILE = "train.lock"  # `run_lock`
EVAL_LOCK_FILE = "eval.lock"  # `run_lock`, in EVAL_OUTPUT_DIR (`eval_<step>/`)
RUN_JSON = "run.json"  # `run_info`
CONFIG_GIN = "config.gin"  # the operative gin config (T5X writes the same name)
TRAIN_METRICS = "train_metrics.jsonl"  # one JSON line per log step
EVAL_METRICS = "eval_metrics.jsonl"  # one JSON line per evaluation
METRICS_FILES = (TRAIN_METRICS, EVAL_METRICS)
TRAIN_EVENTS, EVAL_EVENTS = "train", "eval"  # TensorBoard runs (T5X's names)
PREDICTIONS = "predictions"  # <task>_<split>.txt, one prediction per line
METRICS = "metrics"  # <task>_<split>.json
#: Folders `mcwq_t5x.eval` (`eval_<step>`) and the generated eval files (`{test,zeroshot,gold}_<lang>`)
#: write inside a run: their predictions are the run's.
_EVAL_SUBDIR_RE = re.compile(r"^(eval(_\d+)?|(test|zeroshot|gold)_[a-z]{2,3})$")


def eval_dir(model_dir: str | pathlib.Path, step: int) -> pathlib.Path:
  """`MODEL_DIR/eval_<step>`, `mcwq_t5x.eval`'s default EVAL_OUTPUT_DIR."""
  return pathlib.Path(model_dir) / f"eval_{step}"


def predictions_file(out_dir: str | pathlib.Path, task: str, split: str) -> pathlib.Path:
  """`OUT/predictions/<task>_<split>.txt`."""
  return pathlib.Path(out_dir) / PREDICTIONS / f"{task}_{split}.txt"


def metrics_file(out_dir: str | pathlib.Path, task: str, split: str) -> pathlib.Path:
  """`OUT/metrics/<task>_<split>.json`."""
  return pathlib.Path(out_dir) / METRICS / f"{task}_{split}.json"


class ModelDirNotLocalError(ValueError):
  """MODEL_DIR is an object-store URL (gs://, s3://): our engine writes a run to a local folder."""


def check_local_model_dir(model_dir: str | pathlib.Path) -> None:
  """Raises ModelDirNotLocalError for a URL MODEL_DIR, which `pathlib` would turn into the local
  folder `./gs:/bucket/...` (the object stores are read, for INITIAL_CHECKPOINT_PATH and
  checkpoints, never written)."""
  if checkpoint_paths.is_url(str(model_dir)):
    raise ModelDirNotLocalError(
        f"MODEL_DIR {model_dir}: our engine writes its runs to a local folder, not to an object "
        "store; train into a local MODEL_DIR and copy it there afterwards (e.g. gsutil cp -r), "
        "or train with the real T5X (python -m t5x.train), whose checkpoints go to gs://")


class TrainingResultsError(ValueError):
  """An eval would replace a training run's own results (its final evaluation's predictions and
  metrics in MODEL_DIR); the message names the files and the folders to use instead."""


def check_keeps_training_results(out_dir: str | pathlib.Path, task: str, split: str) -> None:
  """Raises TrainingResultsError when `out_dir` is a run folder whose metrics file of `task` and
  `split` is not an eval's (`mcwq_t5x.eval` records its "predict_kwargs"; the training's final
  evaluation does not): writing there would replace the training's results."""
  out_dir = pathlib.Path(out_dir).absolute()
  met = metrics_file(out_dir, task, split)
  if not (is_run_folder(out_dir) and met.is_file()):
    return
  try:
    record = json.loads(met.read_text())
  except (OSError, ValueError):
    record = None  # why: whose it is cannot be told; it is kept
  if isinstance(record, dict) and "predict_kwargs" in record:
    return  # an earlier eval's: replaced, as an eval_<step> folder's are
  raise TrainingResultsError(
      f"EVAL_OUTPUT_DIR {out_dir} is a training run's MODEL_DIR, and "
      f"{predictions_file(out_dir, task, split)} with {met} are its final evaluation of "
      f"{task}/{split}: this eval would replace them. Leave EVAL_OUTPUT_DIR unset (it is then "
      f"{out_dir}/eval_<step>) or give another folder")


def is_run_folder(directory: str | pathlib.Path) -> bool:
  """Whether `directory` is a training run's MODEL_DIR (run.json, config.gin or checkpoints)."""
  d = pathlib.Path(directory)
  return ((d / RUN_JSON).is_file() or (d / CONFIG_GIN).is_file() or
          any(d.glob(f"{checkpoint_paths.CHECKPOINT_PREFIX}_*")))


def run_folder_of(directory: str | pathlib.Path) -> pathlib.Path:
  """The run folder of predictions in `directory`: above `predictions/` and the `eval_<step>/`
  (`{test,zeroshot,gold}_<lang>/`) folders written into a run. Absolute; not checked to exist."""
  d = pathlib.Path(directory).absolute()
  if d.name == PREDICTIONS:
    d = d.parent
  while _EVAL_SUBDIR_RE.match(d.name) and d.parent != d:
    d = d.parent
  return d


def run_name(directory: str | pathlib.Path) -> str:
  """The model name of predictions in `directory`: the name of `run_folder_of` ("model" at /)."""
  return run_folder_of(directory).name or "model"


def run_name_of_checkpoint(checkpoint: str) -> Optional[str]:
  """The run a CHECKPOINT_PATH names (MODEL_DIR or MODEL_DIR/checkpoint_<step>): the MODEL_DIR's
  last component, or None for an empty path. Pure string work (the path need not exist here)."""
  parts = [p for p in re.split(r"[/\\]+", checkpoint.strip()) if p]
  while parts and checkpoint_paths.step_of(parts[-1]) is not None:
    parts.pop()
  return parts[-1] if parts else None


def append_jsonl(path: pathlib.Path, record: Mapping[str, Any]) -> None:
  """Appends `record` (JSON-serialisable) as one sorted-keys line; process 0 only."""
  if jax.process_index() == 0:
    with open(path, "a") as f:
      f.write(json.dumps(record, sort_keys=True) + "\n")


def drop_metric_rows_after(model_dir: str | pathlib.Path, step: int) -> dict[str, int]:
  """{file: rows dropped} of the `METRICS_FILES` rows after `step` (process 0), each logged, and
  lines that are not JSON (cut off by a kill); OSError if a file cannot be rewritten."""
  # why: a run resumed from checkpoint `step` writes those rows again (TensorBoard readers drop
  # events after a restart step alike).
  dropped: dict[str, int] = {}
  if jax.process_index() != 0:
    return dropped
  for name in METRICS_FILES:
    path = pathlib.Path(model_dir) / name
    if not path.is_file():
      continue
    kept = []
    lines = path.read_text().splitlines()
    for line in lines:
      try:
        row_step = json.loads(line).get("step")
      except (ValueError, AttributeError):
        continue  # why: a line cut off when the run was killed
      if isinstance(row_step, (int, float)) and row_step <= step:
        kept.append(line)
    if len(kept) != len(lines):
      tmp = path.with_name(path.name + ".tmp")
      tmp.write_text("".join(l + "\n" for l in kept))
      tmp.replace(path)  # why: whole or not at all
      dropped[name] = len(lines) - len(kept)
      logging.info("%s: dropped %d row(s) after step %d (the run goes on from step %d)", path,
                   dropped[name], step, step)
  return dropped


class ScalarWriter:
  """TensorBoard event files of plain `simple_value` scalars in `logdir` (process 0, no TensorFlow):
  `EventAccumulator(dir).Scalars(tag)` lists them, not clu's or TF2's tensor summaries."""

  def __init__(self, logdir: str):
    self._writer = None
    if jax.process_index() == 0:
      from tensorboard.summary.writer import event_file_writer  # pylint: disable=g-import-not-at-top
      pathlib.Path(logdir).mkdir(parents=True, exist_ok=True)
      self._writer = event_file_writer.EventFileWriter(str(logdir))

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Writes one scalar per entry at `step`."""
    if self._writer is None:
      return
    from tensorboard.compat.proto import event_pb2, summary_pb2  # pylint: disable=g-import-not-at-top
    values = [summary_pb2.Summary.Value(tag=k, simple_value=float(v)) for k, v in scalars.items()]
    self._writer.add_event(
        event_pb2.Event(
            step=int(step), wall_time=time.time(), summary=summary_pb2.Summary(value=values)))

  def flush(self) -> None:
    if self._writer is not None:
      self._writer.flush()

  def close(self) -> None:
    if self._writer is not None:
      self._writer.close()
      self._writer = None


def create_metric_writer(logdir: str) -> ScalarWriter:
  """The TensorBoard writer of `logdir` (`ScalarWriter`)."""
  return ScalarWriter(logdir)


# The files a start rewrites in a MODEL_DIR that had them (a resumed run's): kept to put back.
_REWRITTEN_AT_START = (CONFIG_GIN, RUN_JSON)


@dataclasses.dataclass(frozen=True)
class FolderBefore:
  """What a MODEL_DIR held before a training started, to undo a failed start
  (`undo_failed_start`).

  Attributes:
    folder: MODEL_DIR (absolute).
    existed: whether the folder existed.
    entries: the relative paths of every file and folder in it.
    saved: the bytes of the `_REWRITTEN_AT_START` files it had.
    steps: its finished checkpoint steps.
    metrics: the size in bytes of each of its `METRICS_FILES` (0: none).
  """
  folder: pathlib.Path
  existed: bool
  entries: frozenset[str]
  saved: Mapping[str, bytes]
  steps: tuple[int, ...]
  metrics: tuple[int, ...]

  @classmethod
  def take(cls, model_dir: str | pathlib.Path) -> "FolderBefore":
    """The state of `model_dir` now (a missing folder: `existed` False, nothing in it)."""
    folder = pathlib.Path(model_dir).absolute()
    if not folder.is_dir():
      return cls(folder, False, frozenset(), {}, (), _metrics_sizes(folder))
    entries = frozenset(str(p.relative_to(folder)) for p in folder.rglob("*"))
    saved = {n: (folder / n).read_bytes() for n in _REWRITTEN_AT_START if (folder / n).is_file()}
    return cls(folder, True, entries, saved, tuple(checkpoint_paths.finished_steps(folder)),
               _metrics_sizes(folder))

  def undo_failed_start(self) -> list[str]:
    """Puts MODEL_DIR back as it was when the run wrote neither a checkpoint nor a metrics row
    since `take` (it failed before training: a bad task, vocabulary or checkpoint): the folder
    removed if it did not exist, else the files and folders added since removed and the rewritten
    files (config.gin, run.json) restored. A folder with a new checkpoint or metrics row is left
    alone (a run that trained). Returns the removed or restored paths (relative); OSError if one
    cannot be removed."""
    if (not self.folder.is_dir() or
        tuple(checkpoint_paths.finished_steps(self.folder)) != self.steps or
        _metrics_sizes(self.folder) != self.metrics):
      return []
    if not self.existed:
      shutil.rmtree(self.folder)
      return ["."]
    changed = []
    # Deepest first: a new folder is empty once its new files are gone.
    for path in sorted(self.folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
      rel = str(path.relative_to(self.folder))
      if rel in self.entries:
        continue
      if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
      else:
        path.unlink()
      changed.append(rel)
    for name, data in self.saved.items():
      path = self.folder / name
      if not path.is_file() or path.read_bytes() != data:
        path.write_bytes(data)
        changed.append(name)
    return sorted(changed)


def _metrics_sizes(folder: pathlib.Path) -> tuple[int, ...]:
  """The size in bytes of each of `folder`'s `METRICS_FILES` (0: none)."""
  return tuple((folder / n).stat().st_size if (folder / n).is_file() else 0 for n in METRICS_FILES)
