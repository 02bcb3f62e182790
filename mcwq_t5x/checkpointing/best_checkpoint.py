"""The checkpoint with the best logged metric (e.g. the lowest dev loss) in a MODEL_DIR.

The MCWQ paper's recipe (Cui et al., TACL 2022, Sec. 5; the authors' Hugging Face scripts in
coastalcph/seq2sparql, `load_best_model_at_end` by `eval_loss`) decodes the test set with the
checkpoint of the lowest dev loss. `read_metric(model_dir, name)` gives step -> value from our
`eval_metrics.jsonl` and from TensorBoard event files (T5X's `{run}/{tag}`);
`checkpoint_path(path, metric_name_to_monitor, metric_mode)` the best finished
`checkpoint_<step>`, for the eval files of both engines. No TensorFlow import.
"""
from __future__ import annotations

import json
import logging
import math
import pathlib
import re
from typing import Iterable, Mapping, Optional

from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import run_folder

EVAL_METRICS_FILE = run_folder.EVAL_METRICS


def _from_jsonl(model_dir: pathlib.Path, name: str) -> dict[int, float]:
  out = {}
  f = model_dir / EVAL_METRICS_FILE
  if f.is_file():
    for line in f.read_text().splitlines():
      if not line.strip():
        continue
      record = json.loads(line)
      if name in record and "step" in record:
        out[int(record["step"])] = float(record[name])
  return out


def _from_event_files(model_dir: pathlib.Path, name: str) -> dict[int, float]:
  """T5X `populate_metrics_for_steps`: `name` = `{run}/{tag}`, run a folder under `model_dir`."""
  parts = name.split("/")
  out: dict[int, float] = {}
  for i in range(len(parts) - 1, 0, -1):
    run_dir = model_dir.joinpath(*parts[:i])
    tag = "/".join(parts[i:])
    if not run_dir.is_dir() or not any(run_dir.glob("events.out.tfevents*")):
      continue
    from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
    from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
    acc = event_accumulator.EventAccumulator(
        str(run_dir), size_guidance={
            event_accumulator.TENSORS: 0,
            event_accumulator.SCALARS: 0
        })
    acc.Reload()
    tags = acc.Tags()
    if tag in tags.get("tensors", []):
      for e in acc.Tensors(tag):
        out[int(e.step)] = float(tensor_util.make_ndarray(e.tensor_proto))
    elif tag in tags.get("scalars", []):
      for e in acc.Scalars(tag):
        out[int(e.step)] = float(e.value)
    if out:
      return out
  return out


def read_metric(model_dir: str | pathlib.Path, metric_name: str) -> dict[int, float]:
  """{step: value} of `metric_name` as either engine logged it in `model_dir` (later records win).

  `metric_name`: our `eval_metrics.jsonl` key ("training_eval/loss") or T5X's TensorBoard
  `{run}/{tag}` ("training_eval/mcwq_mcd1_en_prefixed/loss"); {} when never logged.
  """
  d = pathlib.Path(model_dir)
  return _from_jsonl(d, metric_name) or _from_event_files(d, metric_name)


def best_of(values: Mapping[int, float],
            metric_mode: str = "min",
            steps: Optional[Iterable[int]] = None) -> Optional[int]:
  """The step of the best finite value among `steps` (None: all of `values`; ties: the earlier),
  or None; ValueError for a bad `metric_mode`."""
  if metric_mode not in ("min", "max"):
    raise ValueError(f"metric_mode must be 'min' or 'max', got {metric_mode!r}")
  among = None if steps is None else set(steps)
  finite = [(s, v) for s, v in values.items() if math.isfinite(v) and (among is None or s in among)]
  if not finite:
    return None
  sign = 1.0 if metric_mode == "min" else -1.0
  return min(finite, key=lambda sv: (sign * sv[1], sv[0]))[0]


_EVAL_SPLIT_RE = re.compile(r"^EVAL_SPLIT\s*=\s*['\"](\w+)['\"]\s*$", re.M)


def monitored_split(model_dir: str | pathlib.Path) -> Optional[str]:
  """The split of the run's periodic evaluation (`EVAL_SPLIT` of our `MODEL_DIR/config.gin`), or
  None when the run does not say (no config.gin, or T5X's)."""
  config = pathlib.Path(model_dir) / run_folder.CONFIG_GIN
  if not config.is_file():
    return None
  m = _EVAL_SPLIT_RE.search(config.read_text(errors="replace"))
  return m.group(1) if m else None


def checkpoint_path(path: str,
                    metric_name_to_monitor: Optional[str] = None,
                    metric_mode: str = "min") -> str:
  """The checkpoint to decode for `path` (the eval files' `CHECKPOINT_PATH`).

  The absolute `MODEL_DIR/checkpoint_<step>` best by `metric_name_to_monitor` (None: the newest),
  a `checkpoint_<step>` unchanged; the newest, with a warning, when no kept checkpoint has the
  metric or the run monitored the test split. Raises NotACheckpointError, ValueError.
  """
  directory, newest = checkpoint_paths.resolve_checkpoint(path)
  p = pathlib.Path(path).absolute()
  if p.name.startswith(checkpoint_paths.CHECKPOINT_PREFIX + "_") or not metric_name_to_monitor:
    return str(checkpoint_paths.checkpoint_dir(directory, newest))
  if monitored_split(directory) == "test":
    logging.warning(
        "%s: the run's %s was measured on the test split (EVAL_SPLIT = 'test': no held-out "
        "dev); not selecting on it, using the newest checkpoint (step %d)", directory,
        metric_name_to_monitor, newest)
    return str(checkpoint_paths.checkpoint_dir(directory, newest))
  step = best_of(
      read_metric(directory, metric_name_to_monitor), metric_mode,
      checkpoint_paths.finished_steps(directory))
  if step is None:
    logging.warning("%s: no kept checkpoint has a logged %r; using the newest (step %d)", directory,
                    metric_name_to_monitor, newest)
    step = newest
  else:
    logging.info("%s: checkpoint_%d has the %s %s (%s)", directory, step,
                 "lowest" if metric_mode == "min" else "highest", metric_name_to_monitor,
                 read_metric(directory, metric_name_to_monitor)[step])
  return str(checkpoint_paths.checkpoint_dir(directory, step))


def t5x_save_best_checkpointer(metric_name_to_monitor: str,
                               metric_mode: str = "min",
                               keep_checkpoints_without_metrics: bool = True):
  """T5X's `checkpoints.SaveBestCheckpointer` as a partial for
  `SaveCheckpointConfig.checkpointer_cls` (`metric_name_to_monitor` T5X's `{run}/{tag}`). Imports
  T5X."""
  # why a partial: T5X's Orbax manager (`utils.create_checkpoint_manager_cls`) reads the
  # best-keeping settings only from one; a bare class keeps only the most recent checkpoints.
  import functools  # pylint: disable=g-import-not-at-top
  from t5x import checkpoints as t5x_checkpoints  # pylint: disable=g-import-not-at-top
  return functools.partial(
      t5x_checkpoints.SaveBestCheckpointer,
      metric_name_to_monitor=metric_name_to_monitor,
      metric_mode=metric_mode,
      keep_checkpoints_without_metrics=keep_checkpoints_without_metrics)


def t5x_initial_checkpoint(path: Optional[str]) -> Optional[str]:
  """`path` unchanged if it is a readable T5X checkpoint (local or `gs://`; None passes through, a
  from-scratch run), for T5X's `RestoreCheckpointConfig.path` of a fine-tuning run.

  Raises NotACheckpointError (a FileNotFoundError) naming `path`: not a T5X checkpoint (Orbax or
  msgpack), no such folder, or an object store that cannot be read (after TensorStore's retries).
  """
  # why: T5X's `fallback_to_scratch` fills every parameter it cannot read from a fresh
  # initialisation, so a missing checkpoint would silently train from scratch.
  if path is None:
    return None
  advice = ("make it readable (e.g. a local copy: gsutil -m cp -r <checkpoint_folder> .) and "
            "set INITIAL_CHECKPOINT_PATH to it, or INITIAL_CHECKPOINT_PATH = None to train "
            "from scratch")
  try:
    found, _ = checkpoint_paths.locate(path)
  except (checkpoint_paths.NotACheckpointError, checkpoint_paths.ObjectStoreError) as e:
    if isinstance(e, checkpoint_paths.ObjectStoreError):  # why: its message advises a local copy
      advice = "or INITIAL_CHECKPOINT_PATH = None to train from scratch"
    raise checkpoint_paths.NotACheckpointError(
        f"INITIAL_CHECKPOINT_PATH is not a readable T5X checkpoint: {e}; {advice}") from e
  if found not in (checkpoint_paths.FORMAT_T5X, checkpoint_paths.FORMAT_ORBAX):
    raise checkpoint_paths.NotACheckpointError(
        f"INITIAL_CHECKPOINT_PATH {path}: {checkpoint_paths.FORMAT_DESCRIPTIONS[found]}, which "
        f"T5X does not read; {advice}")
  return path
