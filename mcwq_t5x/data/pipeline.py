"""Data plumbing for the mains: dataset configs, materialised feature arrays, deterministic batches.

The data half of T5X's `t5x/utils.py`: `DatasetConfig` (T5X's fields), `get_mixture_or_task`
(imports the configured task module, then SeqIO's registries: the engine knows no task),
`load_feature_arrays` (a split or `seqio.ShardInfo` shard through `seqio.EncDecFeatureConverter`
into numpy arrays, read whole in every process; a mixture's tasks one after another, `one_epoch`),
`DeterministicBatches` (the global batch of step `s` is a pure function of `(seed, s)`, each
process takes its rows, so a resumed or differently sharded run reads the same examples) and
`without_autograph`. No gin registration;
SeqIO/TensorFlow are imported lazily.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import logging
from typing import Any, Callable, Iterable, Mapping, Optional, TypeVar

import numpy as np

from mcwq_t5x.data import packing


@dataclasses.dataclass
class DatasetConfig:
  """Which data to read and how to batch it (T5X `utils.DatasetConfig` names).

  `task_feature_lengths` {"inputs", "targets"} (tokens, EOS included; None: each split's longest);
  `batch_size` is GLOBAL; `seed` None = 0; `use_cached`: T5X's USE_CACHED_TASKS; `pack` (training
  only, `data.packing`) with `packing_method` "first_fit" (more examples per row on MCWQ) or
  "greedy" (SeqIO's rows); `module`: T5X's MIXTURE_OR_TASK_MODULE ("tasks.mcwq") or None.
  """
  mixture_or_task_name: str
  task_feature_lengths: Optional[Mapping[str, int]]
  split: str
  batch_size: int
  shuffle: bool = True
  seed: Optional[int] = 0
  use_cached: bool = False
  pack: bool = False
  module: Optional[str] = None
  packing_method: str = "first_fit"


class UnknownTaskError(ValueError):
  """No SeqIO task or mixture of the name is registered (the message names the closest)."""


def import_task_module(module: Optional[str]) -> None:
  """Imports the task-registering module (T5X `utils.import_module`); ModuleNotFoundError names
  it."""
  if not module:
    return
  try:
    importlib.import_module(module)
  except ModuleNotFoundError as e:
    raise ModuleNotFoundError(f"task module {module!r} (MIXTURE_OR_TASK_MODULE) cannot be "
                              f"imported: {e}") from e


def get_mixture_or_task(name: str, module: Optional[str] = None):
  """The registered SeqIO task or mixture `name` (`module` imported first); UnknownTaskError names
  the closest registered names."""
  import seqio  # pylint: disable=g-import-not-at-top
  import_task_module(module)
  try:
    return seqio.get_mixture_or_task(name)
  except ValueError as e:
    known = list(seqio.TaskRegistry.names()) + list(seqio.MixtureRegistry.names())
    close = difflib.get_close_matches(name, known, n=8, cutoff=0.5)
    raise UnknownTaskError(f"unknown task or mixture {name!r} (MIXTURE_OR_TASK_NAME; task module "
                           f"{module or 'imported by the gin files'}); {len(known)} registered" +
                           (f", closest: {', '.join(close)}" if close else "")) from e


def output_vocabulary(name: str, module: Optional[str] = None):
  """The `targets` vocabulary of task/mixture `name`."""
  task = get_mixture_or_task(name, module)
  return task.output_features["targets"].vocabulary


def input_prefix_of(task: Any) -> Optional[str]:
  """The `prefix` keyword of a SeqIO task's first preprocessor that has one (tasks/mcwq.py's
  `to_inputs_and_targets`: "" for none), or None (a mixture, another kind of task)."""
  for p in getattr(task, "preprocessors", None) or ():
    keywords = getattr(p, "keywords", None) or {}
    if "prefix" in keywords:
      return str(keywords["prefix"])
  return None


def input_prefixes(task_or_mixture: Any) -> dict[str, Optional[str]]:
  """{task name: `input_prefix_of(task)`} of a task, or of each task of a mixture."""
  import seqio  # pylint: disable=g-import-not-at-top
  return {t.name: input_prefix_of(t) for t in seqio.get_subtasks(task_or_mixture)}


def check_vocab_size(vocabulary: Any, model_vocab_size: int, where: str = "") -> None:
  """ValueError (naming both sizes and their sources) unless the model's embedding size equals the
  vocabulary's, or is it rounded up to a multiple of 128 (mT5: 250100 -> 250112, as T5X)."""
  n = int(vocabulary.vocab_size)
  padded = -(-n // 128) * 128
  if model_vocab_size not in (n, padded):
    raise ValueError(
        f"vocabulary/model mismatch{(' in ' + where) if where else ''}: the task vocabulary "
        f"{getattr(vocabulary, 'sentencepiece_model_file', vocabulary)!s} has {n} pieces but the "
        f"model's T5Config.vocab_size is {model_vocab_size} (expected {n} or {padded}); set "
        "network.T5Config.vocab_size or the vocabulary (MCWQ_VOCAB) so that they agree")


_F = TypeVar("_F", bound=Callable[..., Any])


def without_autograph(fn: _F) -> _F:
  """Decorator: `fn` traces its tf.data functions with AutoGraph off (`do_not_convert`)."""

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    try:
      # why: AutoGraph's AST rewrite of every mapped function costs seconds of CPU per process.
      return tf.autograph.experimental.do_not_convert(fn)(*args, **kwargs)
    # The same datasets (MCWQ's preprocessors have no Python control flow on tensors); one that
    # needs AutoGraph runs again with it, as SeqIO runs it.
    except tf.errors.OperatorNotAllowedInGraphError as e:  # a Python if/for over a tensor
      logging.info("%s: a preprocessor needs AutoGraph (%s); building its datasets with AutoGraph",
                   fn.__qualname__,
                   str(e).splitlines()[0])
      return fn(*args, **kwargs)

  return wrapper  # type: ignore[return-value]


def one_epoch(task_or_mixture: Any, split: str, dataset_of: Callable[[Any], Any]) -> Any:
  """Every example of `split` once: `dataset_of(task)` (a one-epoch tf.data.Dataset of a SeqIO
  task) for a task; for a mixture, its subtasks' datasets one after another (SeqIO's order: by
  name), keeping the features all of them have (a subtask without `split` is left out with a
  warning).

  SeqIO's own `Mixture.get_dataset` samples its tasks by rate and stops at the first that runs
  out, so one epoch of it leaves out the other tasks' last examples. ValueError: no subtask has
  `split`.
  """
  import seqio  # pylint: disable=g-import-not-at-top
  if not isinstance(task_or_mixture, seqio.Mixture):
    return dataset_of(task_or_mixture)
  subtasks = []
  for sub in task_or_mixture.tasks:
    if split in sub.splits:
      subtasks.append(sub)
    else:
      logging.warning("%s: task %s has no split %r: left out", task_or_mixture.name, sub.name,
                      split)
  if not subtasks:
    raise ValueError(f"mixture {task_or_mixture.name!r}: no task has a split {split!r}")
  datasets = [dataset_of(sub) for sub in subtasks]
  common = set(datasets[0].element_spec)
  for ds in datasets[1:]:
    common &= set(ds.element_spec)
  out = None
  for ds in datasets:
    ds = ds.map(lambda ex: {k: ex[k] for k in sorted(common)})
    out = ds if out is None else out.concatenate(ds)
  return out


@without_autograph
def load_feature_arrays(cfg: DatasetConfig,
                        shard_index: int = 0,
                        num_shards: int = 1,
                        num_examples: Optional[int] = None) -> dict[str, np.ndarray]:
  """feature -> int32 [N, length] (`seqio.EncDecFeatureConverter`'s, plus segment/position features
  when packed) of one process's shard of `cfg`'s split: every example once (a mixture's tasks one
  after another, `one_epoch`).

  `num_examples`: the first N (source order, before packing); `shuffle` is the iterator's.
  Raises ValueError (unknown task, an empty split), paths.DataNotFoundError.
  """
  import seqio  # pylint: disable=g-import-not-at-top
  task = get_mixture_or_task(cfg.mixture_or_task_name, cfg.module)
  ds = one_epoch(
      task, cfg.split, lambda sub: seqio.get_dataset(
          sub.name,
          task_feature_lengths=dict(cfg.task_feature_lengths),
          dataset_split=cfg.split,
          shuffle=False,
          num_epochs=1,
          use_cached=cfg.use_cached,
          seed=cfg.seed,
          shard_info=seqio.ShardInfo(index=shard_index, num_shards=num_shards),
          feature_converter=seqio.EncDecFeatureConverter(pack=False)))
  if num_examples is not None:
    ds = ds.take(num_examples)
  warn_truncated(cfg, count_truncated(cfg, shard_index, num_shards, num_examples))
  arrays = dataset_to_arrays(ds.batch(1024).as_numpy_iterator())
  if cfg.pack and arrays:
    arrays = packing.pack(arrays, cfg.task_feature_lengths["inputs"],
                          cfg.task_feature_lengths["targets"], cfg.packing_method)
  if not arrays:
    raise ValueError(f"task {cfg.mixture_or_task_name!r} split {cfg.split!r} (shard {shard_index} "
                     f"of {num_shards}) has no examples")
  logging.info("loaded %s/%s shard %d/%d: %d rows, features %s", cfg.mixture_or_task_name,
               cfg.split, shard_index, num_shards, len(next(iter(arrays.values()))), {
                   k: v.shape[1:] for k, v in arrays.items()
               })
  return arrays


@without_autograph
def count_truncated(cfg: DatasetConfig,
                    shard_index: int = 0,
                    num_shards: int = 1,
                    num_examples: Optional[int] = None) -> dict[str, dict[str, int]]:
  """feature -> {"truncated", "examples", "longest", "length"} of the examples
  `cfg.task_feature_lengths` cuts short ({} when None), reading the split once more unbounded;
  ValueError for an unknown task."""
  if not cfg.task_feature_lengths:
    return {}
  import seqio  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  task = get_mixture_or_task(cfg.mixture_or_task_name, cfg.module)
  features = [k for k in ("inputs", "targets") if k in cfg.task_feature_lengths]
  ds = one_epoch(
      task, cfg.split, lambda sub: sub.get_dataset(
          sequence_length=None,
          split=cfg.split,
          use_cached=cfg.use_cached,
          shuffle=False,
          num_epochs=1,
          seed=cfg.seed,
          shard_info=seqio.ShardInfo(index=shard_index, num_shards=num_shards)))
  if num_examples is not None:
    ds = ds.take(num_examples)
  # Lengths computed in the graph and fetched in batches: one Python step per example cost
  # seconds per split.
  ds = ds.map(
      lambda ex: {
          k: tf.size(ex[k]) for k in features
      },
      num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=True).batch(8192)
  lengths: dict[str, list[np.ndarray]] = {k: [] for k in features}
  for batch in ds.as_numpy_iterator():
    for k in features:
      lengths[k].append(batch[k])
  out = {}
  for k in features:
    limit = int(cfg.task_feature_lengths[k])
    arr = np.concatenate(lengths[k]).astype(np.int64) if lengths[k] else np.zeros([0], np.int64)
    out[k] = {
        "truncated": int((arr > limit).sum()),
        "examples": int(arr.size),
        "longest": int(arr.max()) if arr.size else 0,
        "length": limit
    }
  return out


def warn_truncated(cfg: DatasetConfig, counts: Mapping[str, Mapping[str, int]]) -> None:
  """Logs a warning with the numbers when `count_truncated` found truncated examples."""
  parts = [
      f"{c['truncated']:,} of {c['examples']:,} {k} (longest {c['longest']} > {c['length']} "
      "tokens)" for k, c in counts.items() if c["truncated"]
  ]
  if parts:
    logging.warning(
        "TRUNCATED: TASK_FEATURE_LENGTHS %s cut %s of %s/%s; the model never sees their ends "
        "(raise TASK_FEATURE_LENGTHS; `python -m mcwq_t5x.inspect_task %s` prints the length "
        "percentiles)", dict(cfg.task_feature_lengths), " and ".join(parts),
        cfg.mixture_or_task_name, cfg.split, cfg.mixture_or_task_name)
  elif counts:
    logging.info("%s/%s: no example exceeds TASK_FEATURE_LENGTHS %s", cfg.mixture_or_task_name,
                 cfg.split, dict(cfg.task_feature_lengths))


def dataset_to_arrays(batches: Iterable[Mapping[str, Any]]) -> dict[str, np.ndarray]:
  """feature -> int32 [N, ...] concatenated from batches of feature dicts ({} without a batch)."""
  chunks: dict[str, list[np.ndarray]] = {}
  for batch in batches:
    for k, v in batch.items():
      chunks.setdefault(k, []).append(np.asarray(v, np.int32))
  return {k: np.concatenate(v) for k, v in chunks.items()}


class DeterministicBatches:
  """Endless batches where batch `s` depends only on (seed, s): a resume needs only `s`.

  Batch `s` is items [s*B, (s+1)*B) of epoch 0's permutation, then epoch 1's, ...
  (`np.random.default_rng([seed, e])`; `shuffle` False: source order). `arrays`: feature -> [N,
  ...]. ValueError: no rows, or `batch_size` < 1.
  """

  def __init__(self,
               arrays: Mapping[str, np.ndarray],
               batch_size: int,
               seed: int = 0,
               shuffle: bool = True):
    self.arrays = dict(arrays)
    self.num_rows = len(next(iter(self.arrays.values())))
    if self.num_rows == 0:
      raise ValueError("no rows to batch")
    self.batch_size = int(batch_size)
    if self.batch_size < 1:
      raise ValueError(f"batch size must be positive, got {batch_size}")
    self.seed = int(seed or 0)
    self.shuffle = shuffle
    self._perms: dict[int, np.ndarray] = {}

  def _perm(self, epoch: int) -> np.ndarray:
    if epoch not in self._perms:
      if len(self._perms) > 4:
        self._perms.clear()
      self._perms[epoch] = (
          np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)
          if self.shuffle else np.arange(self.num_rows))
    return self._perms[epoch]

  def indices(self, step: int) -> np.ndarray:
    """Row indices of batch `step` (int64 [batch_size])."""
    pos = np.arange(step * self.batch_size, (step + 1) * self.batch_size, dtype=np.int64)
    epochs, offsets = np.divmod(pos, self.num_rows)
    return np.array([self._perm(int(e))[o] for e, o in zip(epochs, offsets)])

  def batch(self, step: int, rows: Optional[slice] = None) -> dict[str, np.ndarray]:
    """Batch `step`: feature -> [batch_size, ...], or only its `rows` (e.g. `slice(8, 16)`, this
    process's share: feature -> [len(rows), ...]; only those rows are gathered)."""
    idx = self.indices(step)
    # Multi-process: every process holds the whole split and gathers its rows, so the global batch
    # is a single process's.
    if rows is not None:
      idx = idx[rows]
    return {k: v[idx] for k, v in self.arrays.items()}


def pad_batch(batch: Mapping[str, np.ndarray],
              batch_size: int) -> tuple[dict[str, np.ndarray], int]:
  """Pads a (last, short) batch with zero rows to `batch_size`; returns (batch, number of real rows)."""
  n = len(next(iter(batch.values())))
  if n == batch_size:
    return dict(batch), n
  return {
      k: np.concatenate([v, np.zeros((batch_size - n,) + v.shape[1:], v.dtype)])
      for k, v in batch.items()
  }, n


def to_jsonable(x: Any) -> Any:
  """Converts numpy/jax scalars inside dicts/lists to plain Python for json.dump."""
  if isinstance(x, Mapping):
    return {str(k): to_jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [to_jsonable(v) for v in x]
  if hasattr(x, "item") and np.ndim(x) == 0:
    return x.item()
  if isinstance(x, np.ndarray):
    return x.tolist()
  return x
