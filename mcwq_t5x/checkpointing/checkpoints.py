"""Checkpoints in T5X's layout: save/resume our train state, read T5X's, let T5X read ours.

`MODEL_DIR/checkpoint_<step>/` holds Orbax items `state/` ({'target': params, 'state': {'step'}},
what T5X's `InferenceState.state_dict()` holds), `optimizer/` (optax state) and `data/` (the data
position); T5X reads `state/` and ignores the rest (docs/t5x.md: the layout and how `t5x.train`
starts from ours). Reading accepts ours, T5X's Orbax and T5X's legacy msgpack checkpoints (a
fresh optimizer state for T5X's). The counterpart of T5X's `t5x/checkpoints.py` and of
`RestoreCheckpointConfig`'s `strict` / `fallback_to_scratch`; imports no T5X, TensorFlow or SeqIO.
Names and formats are in `checkpoint_paths`; loading from any format in `checkpoint_loaders`.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import pathlib
import sys
import time
from typing import Any, Mapping, Optional, Sequence

from flax import serialization
from flax import traverse_util
import flax.core
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from mcwq_t5x.checkpointing import best_checkpoint
from mcwq_t5x.checkpointing import checkpoint_import
from mcwq_t5x.checkpointing import checkpoint_paths

PyTree = Any

_OPT_METADATA_KEY = "mcwq_t5x_optimizer_state"


class NoUsableCheckpointError(RuntimeError):
  """Checkpoints exist but every one of them is unreadable (corrupt or incomplete files)."""


class UnreadableCheckpointError(NoUsableCheckpointError):
  """A checkpoint named by its `checkpoint_<step>` folder cannot be read (corrupt or incomplete
  files); the message names the folder and the underlying error."""


class CheckpointSaveError(RuntimeError):
  """Writing a checkpoint failed (e.g. the disk is full); the message names the checkpoint, the
  cause and the last good checkpoint."""


class OptimizerStateMismatchError(ValueError):
  """The checkpoint's optimizer state was written by a different optimizer than the run's."""


class MissingOptimizerError(ValueError):
  """A fresh optimizer state is needed but no optax optimizer was given to create it."""


class KeepCheckpointsError(ValueError):
  """`max_to_keep` (KEEP_CHECKPOINTS) below 1: a run keeps at least its newest checkpoint."""


#: How the training main's users ask for `params_only=True` (`RestoreCheckpointConfig`).
PARAMS_ONLY_HINT = "params_only=True (mcwq_t5x.train: --gin.RESUME_PARAMS_ONLY=True)"
#: The Orbax file of a finished checkpoint that lists its items (`item_handlers`).
_ORBAX_METADATA = "_CHECKPOINT_METADATA"


def check_max_to_keep(max_to_keep: Optional[int]) -> None:
  """Raises KeepCheckpointsError unless `max_to_keep` is None (keep all) or at least 1 (Orbax
  keeps none at all for 0: the run would end without a checkpoint)."""
  if max_to_keep is not None and int(max_to_keep) < 1:
    raise KeepCheckpointsError(
        f"KEEP_CHECKPOINTS = {max_to_keep}: a run keeps at least its newest checkpoint (to resume "
        "from, and the one its final evaluation decodes); set KEEP_CHECKPOINTS to 1 or more, or "
        "None to keep every checkpoint")


# Errors that say "this checkpoint does not fit this run" rather than "this checkpoint is
# corrupt": `restore_latest` raises them at once instead of falling back to an older checkpoint.
_INCOMPATIBLE = (checkpoint_paths.CheckpointMismatchError, OptimizerStateMismatchError,
                 MissingOptimizerError)


# ------------------------------------------------------------------------------------------------
# Parameters
# ------------------------------------------------------------------------------------------------
def _flat(tree: Mapping[str, Any]) -> dict[tuple[str, ...], Any]:
  return traverse_util.flatten_dict(flax.core.unfreeze(tree))


def _name(key: tuple[str, ...]) -> str:
  return "/".join(key)


def place(value: Any, abstract: Any, may_alias: bool = False) -> Any:
  """`value` as an array of `abstract`'s dtype, on `abstract.sharding` when it has one.

  `may_alias`: a numpy `value` of that dtype may become the array's memory (no copy on the CPU
  when its data is 64-byte aligned); only for arrays nobody writes to afterwards.
  """
  sharding = getattr(abstract, "sharding", None)
  if may_alias and not isinstance(value, jax.Array):
    return jax.device_put(np.asarray(value, dtype=abstract.dtype), sharding, may_alias=True)
  arr = np.asarray(value, dtype=abstract.dtype) if not isinstance(value, jax.Array) else value
  if sharding is None:
    return jnp.asarray(arr, abstract.dtype)
  return jax.device_put(jnp.asarray(arr, abstract.dtype), sharding)


def _restore_args(abstract: Any) -> ocp.RestoreArgs:
  sharding = getattr(abstract, "sharding", None)
  if sharding is None:
    return ocp.RestoreArgs(restore_type=np.ndarray, dtype=abstract.dtype)
  return ocp.ArrayRestoreArgs(sharding=sharding, dtype=abstract.dtype)


def _check_params(folder: pathlib.Path, ckpt_shapes: Mapping[tuple[str, ...], tuple],
                  flat_abstract: Mapping[tuple[str, ...],
                                         Any], allow_missing: bool) -> list[tuple[str, ...]]:
  """Compares names/shapes; returns the missing keys (only when `allow_missing`)."""
  missing = sorted(set(flat_abstract) - set(ckpt_shapes))
  extra = sorted(set(ckpt_shapes) - set(flat_abstract))
  wrong = [
      f"{_name(key)} has shape {tuple(ckpt_shapes[key])}, the model expects "
      f"{tuple(flat_abstract[key].shape)}"
      for key in sorted(set(flat_abstract) & set(ckpt_shapes))
      if tuple(ckpt_shapes[key]) != tuple(flat_abstract[key].shape)
  ]
  if wrong:
    raise checkpoint_paths.CheckpointMismatchError(
        f"{folder}: {len(wrong)} parameter(s) differ from the model "
        f"(checkpoint vs model): " + "; ".join(wrong))
  if missing and not allow_missing:
    raise checkpoint_paths.CheckpointMismatchError(
        f"{folder}: {len(missing)} parameter(s) missing from the checkpoint: " +
        ", ".join(f"{_name(k)} (shape {tuple(flat_abstract[k].shape)})" for k in missing) +
        "; give fallback_params to initialise missing parameters from scratch (T5X "
        "fallback_to_scratch)")
  if extra:
    logging.warning("%s: ignoring %d checkpoint parameter(s) the model does not have: %s", folder,
                    len(extra), [_name(k) for k in extra[:5]])
  return missing


def _read_t5x_msgpack(folder: pathlib.Path) -> dict[str, Any]:
  """The msgpack tree of a legacy T5X checkpoint, `optimizer` level removed."""
  f = folder / checkpoint_paths.T5X_MSGPACK_FILE
  try:
    tree = serialization.msgpack_restore(f.read_bytes())
  except checkpoint_paths.ObjectStoreError:
    raise
  except Exception as e:  # msgpack raises several error types
    raise checkpoint_paths.UnreadableCheckpointFileError(
        f"{f}: cannot read T5X msgpack: {e}") from e
  if isinstance(tree, dict) and "optimizer" in tree:
    tree = tree["optimizer"]
  return tree


def _restore_target(folder: pathlib.Path, fmt: str, abstract_params: PyTree,
                    fallback_params: Optional[PyTree]) -> tuple[dict, Optional[int]]:
  """(params placed like `abstract_params`, the checkpoint's step or None)."""
  flat_abstract = _flat(abstract_params)
  if fmt == checkpoint_paths.ITEM_FORMAT_T5X_MSGPACK:
    arrays = _flat(checkpoint_import.load_t5x_checkpoint(folder))
    missing = _check_params(folder, {
        k: np.shape(v) for k, v in arrays.items()
    }, flat_abstract, fallback_params is not None)
    flat = {k: place(arrays[k], a) for k, a in flat_abstract.items() if k in arrays}
    step = _read_t5x_msgpack(folder).get("state", {}).get("step")
    step = None if step is None else int(np.asarray(step))
  else:
    item_dir = folder / checkpoint_paths.STATE_ITEM
    if checkpoint_paths.is_url(item_dir):
      item_dir = str(item_dir)  # why: Orbax reads a URL itself (etils.epath and TensorStore)
    meta = ocp.PyTreeCheckpointHandler().metadata(item_dir).tree
    if not isinstance(meta, Mapping) or "target" not in meta:
      keys = sorted(meta) if isinstance(meta, Mapping) else type(meta).__name__
      raise checkpoint_paths.CheckpointMismatchError(
          f"{item_dir}: no 'target' parameter tree (top-level keys: "
          f"{keys})")
    ckpt_shapes = {k: tuple(v.shape) for k, v in _flat(meta["target"]).items()}
    missing = _check_params(folder, ckpt_shapes, flat_abstract, fallback_params is not None)
    present = {k: a for k, a in flat_abstract.items() if k in ckpt_shapes}
    item = {"target": traverse_util.unflatten_dict(present)}
    has_step = isinstance(meta.get("state"), Mapping) and "step" in meta["state"]
    if has_step:
      item["state"] = {"step": jax.ShapeDtypeStruct((), np.int32)}
    restore_args = jax.tree_util.tree_map(_restore_args, item)
    restored = ocp.PyTreeCheckpointer().restore(
        item_dir,
        args=ocp.args.PyTreeRestore(item=item, restore_args=restore_args, partial_restore=True))
    flat = _flat(restored["target"])
    step = int(np.asarray(restored["state"]["step"])) if has_step else None
  if missing:
    flat_fallback = _flat(fallback_params)
    for key in missing:
      if key not in flat_fallback:
        raise checkpoint_paths.CheckpointMismatchError(
            f"{folder}: parameter {_name(key)} is missing from both the "
            "checkpoint and fallback_params")
      flat[key] = place(flat_fallback[key], flat_abstract[key])
    logging.warning(
        "%s: %d parameter(s) missing from the checkpoint initialised from "
        "fallback_params (T5X fallback_to_scratch): %s", folder, len(missing),
        [_name(k) for k in missing])
  return traverse_util.unflatten_dict(flat), step


def _unreadable(folder: pathlib.Path, e: BaseException) -> str:
  """One line: why `folder` cannot be read (Orbax's and TensorStore's messages span lines)."""
  return " ".join(f"checkpoint {folder} is unreadable ({type(e).__name__}: {e})".split())


def restore_params_and_step(
    path: str | pathlib.Path,
    abstract_params: PyTree,
    *,
    fallback_params: Optional[PyTree] = None) -> tuple[dict, pathlib.Path, int]:
  """(params, MODEL_DIR, step): `restore_params` and where the parameters came from.

  A MODEL_DIR gives its newest READABLE checkpoint (a corrupt newer one skipped with a warning); a
  named `checkpoint_<step>` is read or raises `UnreadableCheckpointError`. Raises as
  `restore_params`.
  """
  p = checkpoint_paths.as_path(path).absolute()
  directory, step = checkpoint_paths.resolve_checkpoint(p)
  folder = checkpoint_paths.checkpoint_dir(directory, step)
  named = p in (folder, folder / checkpoint_paths.STATE_ITEM,
                folder / checkpoint_paths.T5X_MSGPACK_FILE)
  steps = [step] if named else [
      s for s in reversed(checkpoint_paths.finished_steps(directory)) if s <= step
  ]
  # why before the reads: a failed read's other reads call back into its closed loop at once,
  # from TensorStore's threads, before an `except` here could install anything
  quiet_failed_save_noise()
  errors = []
  for s in steps:
    folder = checkpoint_paths.checkpoint_dir(directory, s)
    try:
      params, _ = _restore_target(folder, checkpoint_paths.checkpoint_format(folder),
                                  abstract_params, fallback_params)
      jax.block_until_ready(params)  # corrupt chunks fail here, not later
    except (checkpoint_paths.CheckpointMismatchError, checkpoint_paths.CheckpointOutsideFolderError,
            checkpoint_paths.ObjectStoreError):  # why: never fall back past these
      raise
    except Exception as e:  # pylint: disable=broad-except  (Orbax/TensorStore raise many types)
      msg = _unreadable(folder, e)
      if named:
        raise UnreadableCheckpointError(
            f"{msg}; name another {checkpoint_paths.CHECKPOINT_PREFIX}_<step> folder, or the MODEL_DIR {directory} "
            "to use its newest readable checkpoint") from e
      logging.warning("%s; falling back to the previous checkpoint", msg)
      errors.append(msg)
      continue
    if errors:
      logging.warning("using checkpoint %s: the newer checkpoint(s) are unreadable: %s", folder,
                      "; ".join(errors))
    logging.info("restored the parameters of %s", folder)
    return params, directory, s
  raise NoUsableCheckpointError(
      f"no checkpoint in {directory} could be read: {'; '.join(errors)}; name a readable "
      f"{checkpoint_paths.CHECKPOINT_PREFIX}_<step> folder")


def restore_params(path: str | pathlib.Path,
                   abstract_params: PyTree,
                   *,
                   fallback_params: Optional[PyTree] = None) -> dict:
  """Parameters of a checkpoint of ours or of T5X, whatever optimizer wrote it.

  Reads the `target` tree only (T5X's `RestoreCheckpointConfig(strict=False)`, as `t5x.eval`)
  and builds no CheckpointManager: safe while a training job writes into the same MODEL_DIR.
  `path`: a MODEL_DIR (its newest readable checkpoint), `checkpoint_<step>/` or its `state/`.
  Returns a nested dict of jax arrays with `abstract_params`' (T5X-named `ShapeDtypeStruct`s)
  shardings and dtypes; parameters missing are taken from `fallback_params` (T5X's
  `fallback_to_scratch`), each named in a warning. Raises NotACheckpointError,
  CheckpointMismatchError, UnreadableCheckpointError or NoUsableCheckpointError.
  """
  return restore_params_and_step(path, abstract_params, fallback_params=fallback_params)[0]


# ------------------------------------------------------------------------------------------------
# Optimizer state
# ------------------------------------------------------------------------------------------------
def _describe(node: Any, params_def: Any) -> str:
  """Short structural description of an optax state: namedtuple types and field names."""
  if isinstance(node, tuple) and hasattr(node, "_fields"):
    fields = ", ".join(node._fields)
    return f"{type(node).__name__}({fields})" if fields else type(node).__name__
  if isinstance(node, (tuple, list)):
    return "(" + ", ".join(_describe(c, params_def) for c in node) + ")"
  if isinstance(node, Mapping):
    if jax.tree_util.tree_structure(node) == params_def:
      return "{params}"
    return "{" + ", ".join(f"{k}: {_describe(v, params_def)}" for k, v in node.items()) + "}"
  return "*"


def optimizer_state_signature(opt_state: PyTree, params: PyTree) -> dict[str, Any]:
  """{"description", "num_arrays", "fingerprint"} of an optax state (arrays or ShapeDtypeStructs).

  `description` names the state types ("(FactoredState(count, v_row, v_col, v), EmptyState,
  ...)"); `fingerprint`, a SHA-256 of structure, shapes and dtypes, is equal exactly when two
  states restore into each other.
  """
  params_def = jax.tree_util.tree_structure(params)
  leaves, treedef = jax.tree_util.tree_flatten(opt_state)
  h = hashlib.sha256(str(treedef).encode())
  for leaf in leaves:
    h.update(f"{tuple(np.shape(leaf))}:{np.dtype(leaf.dtype).name};".encode())
  return {
      "description": _describe(opt_state, params_def),
      "num_arrays": len(leaves),
      "fingerprint": h.hexdigest()
  }


def _signature_text(sig: Mapping[str, Any]) -> str:
  return f"{sig['description']} with {sig['num_arrays']} arrays"


def _fresh_opt_state(optimizer: Any, params: PyTree, abstract_opt_state: PyTree,
                     folder: pathlib.Path, why: str) -> PyTree:
  if optimizer is None:
    raise MissingOptimizerError(
        f"{folder}: {why}, so a fresh optimizer state is needed: pass the run's optax optimizer "
        "(optimizer=trainer.optimizer) to create it")
  shardings = [getattr(a, "sharding", None) for a in jax.tree_util.tree_leaves(abstract_opt_state)]
  treedef = jax.tree_util.tree_structure(abstract_opt_state)
  if shardings and all(s is not None for s in shardings):
    init = jax.jit(optimizer.init, out_shardings=jax.tree_util.tree_unflatten(treedef, shardings))
  else:
    init = jax.jit(optimizer.init)
  opt_state = init(params)
  if jax.tree_util.tree_structure(opt_state) != treedef:
    raise ValueError(f"{folder}: the optimizer given to create a fresh optimizer state makes "
                     f"{jax.tree_util.tree_structure(opt_state)}, the run's state is {treedef}")
  return opt_state


def _saved_items(folder: pathlib.Path) -> Optional[set[str]]:
  """The item names Orbax recorded for the checkpoint `folder` (its `_CHECKPOINT_METADATA`), or
  None when that file is missing or unreadable."""
  try:
    items = json.loads((folder / _ORBAX_METADATA).read_text()).get("item_handlers")
  except (OSError, ValueError, AttributeError):
    return None
  return set(items) if isinstance(items, dict) else None


def _step_array(step: int, like: Any) -> jax.Array:
  """`step` as an int32 scalar `jax.Array` placed like `like` (the train state's step), else
  plain."""
  value = jnp.asarray(int(step), jnp.int32)
  sharding = getattr(like, "sharding", None) if isinstance(like, jax.Array) else None
  if sharding is None or sharding.is_fully_addressable:
    return value
  # why: Orbax saves only global arrays in a multi-process run (a one-process array is "host local",
  # refused).
  return jax.device_put(np.asarray(int(step), np.int32), sharding)


# ------------------------------------------------------------------------------------------------
# A failed save's messages
# ------------------------------------------------------------------------------------------------
# How a full disk reads: OSError(ENOSPC/EDQUOT) from Python's writes, and TensorStore's
# `ValueError("RESOURCE_EXHAUSTED: ... No space left on device [os_error_code='28']")` from the
# array writes (its memory errors are RESOURCE_EXHAUSTED too, hence the OS error text).
_DISK_FULL_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}
_DISK_FULL_TEXT = {
    marker: why for n, why in _DISK_FULL_ERRNOS.items()
    for marker in (os.strerror(n), f"os_error_code='{n}'")
}


def disk_full_reason(error: BaseException) -> Optional[str]:
  """"no space left on device" or "disk quota exceeded" when `error` or an exception it was raised
  from says so (module comment above `_DISK_FULL_ERRNOS`), else None."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS:
      return _DISK_FULL_ERRNOS[error.errno]
    text = str(error)
    for marker, why in _DISK_FULL_TEXT.items():
      if marker in text:
        return why
    error = error.__cause__ or error.__context__
  return None


class _FailedSaveNoiseFilter(logging.Filter):
  """Drops Orbax's and asyncio's error records of a save that failed on a full disk: each write
  in flight logs the same error with a traceback (hundreds of lines), some at interpreter exit,
  after the one `CheckpointSaveError` that says it all. Other records pass."""

  def filter(self, record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    if record.levelno < logging.ERROR or error is None or disk_full_reason(error) is None:
      return True
    return not (record.name == "asyncio" or _raised_in_orbax(record.exc_info[2]))


def _raised_in_orbax(tb: Any) -> bool:
  """Whether a traceback passes through Orbax (absl's records name absl's file, not the caller)."""
  while tb is not None:
    if f"{os.sep}orbax{os.sep}" in tb.tb_frame.f_code.co_filename:
      return True
    tb = tb.tb_next
  return False


def _closed_loop_callback(unraisable: Any) -> bool:
  """Whether an unraisable exception is TensorStore calling back into the asyncio loop of an Orbax
  save or restore that already ended on an error (`RuntimeError: Event loop is closed`, from
  `call_soon_threadsafe`): printed as a bare traceback once for every write still in flight."""
  error, tb = unraisable.exc_value, unraisable.exc_traceback
  if not isinstance(error, RuntimeError) or str(error) != "Event loop is closed" or tb is None:
    return False
  while tb.tb_next is not None:
    tb = tb.tb_next
  return pathlib.Path(tb.tb_frame.f_code.co_filename).parent.name == "asyncio"


def quiet_failed_save_noise() -> None:
  """Installs, once per process, `_FailedSaveNoiseFilter` on the `absl` (Orbax's) and `asyncio`
  loggers and a `sys.unraisablehook` that drops `_closed_loop_callback`s (passing the rest on), so
  that a save failing on a full disk ends with its `CheckpointSaveError` alone, and a restore
  failing on corrupt files with its own error (TensorStore's reads in flight call back alike)."""
  for name in ("absl", "asyncio"):
    logger = logging.getLogger(name)
    if not any(isinstance(f, _FailedSaveNoiseFilter) for f in logger.filters):
      logger.addFilter(_FailedSaveNoiseFilter())
  previous = sys.unraisablehook
  if getattr(previous, "_mcwq_quiet", False):
    return

  def hook(unraisable: Any) -> None:
    if not _closed_loop_callback(unraisable):
      previous(unraisable)

  hook._mcwq_quiet = True  # pylint: disable=protected-access
  sys.unraisablehook = hook


# ------------------------------------------------------------------------------------------------
# Manager
# ------------------------------------------------------------------------------------------------
class CheckpointManager:
  """Saves/restores (train state, data position) as `directory/checkpoint_<step>/` with Orbax.

  T5X's `OrbaxCheckpointManagerInterface`: saves on multiples of `save_interval_steps` and at a
  multi-process preemption sync point (forced saves always; no Orbax first-step save), keeps the
  last `max_to_keep` (with `metric_name_to_monitor`: that many BEST plus the newest, T5X
  `SaveBestCheckpointer`), `async_save`, atomic finalisation. Beyond T5X: falls back to an older
  checkpoint when the newest is corrupt, and says clearly when the optimizer changed or a save
  failed (naming the last good one). Metrics go into the `data/` item. ValueError: bad
  `metric_mode`; KeepCheckpointsError: `max_to_keep` below 1.
  """

  def __init__(self,
               directory: str | pathlib.Path,
               save_interval_steps: int = 1000,
               max_to_keep: Optional[int] = 3,
               async_save: bool = True,
               metric_name_to_monitor: Optional[str] = None,
               metric_mode: str = "min"):
    if metric_mode not in ("min", "max"):
      raise ValueError(f"metric_mode must be 'min' or 'max', got {metric_mode!r}")
    check_max_to_keep(max_to_keep)
    self.directory = pathlib.Path(directory).absolute()
    self._async = bool(async_save)
    self.metric_name_to_monitor = metric_name_to_monitor
    self.metric_mode = metric_mode
    self._keep = max_to_keep
    self._metrics: dict[int, float] = {}
    self._pending: Optional[int] = None  # step of an asynchronous save not yet awaited
    self._closed = False
    policies = ocp.checkpoint_managers
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=policies.AnySavePolicy([
            policies.FixedIntervalPolicy(max(int(save_interval_steps), 1)),
            policies.PreemptionCheckpointingPolicy()
        ]),
        max_to_keep=None if metric_name_to_monitor else max_to_keep,
        step_prefix=checkpoint_paths.CHECKPOINT_PREFIX,
        create=True,
        cleanup_tmp_directories=True,
        enable_async_checkpointing=self._async,
    )
    self._manager = ocp.CheckpointManager(self.directory, options=options)
    quiet_failed_save_noise()
    if metric_name_to_monitor:
      for step in self.all_steps():
        value = self._read_data(step).get("metrics", {}).get(metric_name_to_monitor)
        if value is not None:
          self._metrics[step] = float(value)

  def _read_data(self, step: int) -> dict[str, Any]:
    folder = checkpoint_paths.checkpoint_dir(self.directory, step)
    if not (folder / checkpoint_paths.DATA_ITEM).is_dir():
      return {}
    try:
      data = ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(
          folder / checkpoint_paths.DATA_ITEM, args=ocp.args.JsonRestore())
    except Exception as e:  # pylint: disable=broad-except
      logging.warning("%s: cannot read %s (%s)", folder, checkpoint_paths.DATA_ITEM, e)
      return {}
    return dict(data or {})

  def metric(self, step: int) -> Optional[float]:
    """The `metric_name_to_monitor` value saved with checkpoint `step`, or None."""
    return self._metrics.get(int(step))

  def best_step(self) -> Optional[int]:
    """The kept checkpoint with the best `metric_name_to_monitor` value (ties: the earlier), or
    None (no metric monitored, or no kept checkpoint has a value)."""
    if not self.metric_name_to_monitor:
      return None
    return best_checkpoint.best_of(self._metrics, self.metric_mode, self.all_steps())

  def _remove_all_but_best(self) -> None:
    """Deletes every finished checkpoint except the newest and the `max_to_keep` best."""
    steps = self.all_steps()
    if not steps or self._keep is None:
      return
    keep = {steps[-1]}
    candidates = {s: v for s, v in self._metrics.items() if s in steps}
    for _ in range(max(int(self._keep), 0)):
      best = best_checkpoint.best_of(candidates, self.metric_mode)
      if best is None:
        break
      keep.add(best)
      candidates.pop(best)
    for step in steps:
      if step not in keep:
        self._manager.delete(step)
        logging.info("deleted checkpoint %s (kept: the newest and the %s best by %s: %s)",
                     checkpoint_paths.checkpoint_dir(self.directory, step), self._keep,
                     self.metric_name_to_monitor, sorted(keep))

  def _save_error(self, step: int, e: BaseException) -> CheckpointSaveError:
    """A `CheckpointSaveError` naming checkpoint `step`, the cause and the last good checkpoint."""
    last = [s for s in self.all_steps() if s != step]
    good = (
        f"the last good checkpoint is {checkpoint_paths.checkpoint_dir(self.directory, last[-1])}"
        if last else f"no checkpoint of this run in {self.directory} was written")
    full = disk_full_reason(e)
    why = f": {full}" if full else ""
    hint = "; free disk space, then rerun the same command to resume" if full else ""
    cause = " ".join(f"{type(e).__name__}: {e}".split())  # why: one line
    return CheckpointSaveError(
        f"writing checkpoint {checkpoint_paths.checkpoint_dir(self.directory, step)} failed"
        f"{why} ({cause}); {good}{hint}")

  def _await_pending(self) -> None:
    """Waits for the pending asynchronous save; raises its failure as a `CheckpointSaveError`."""
    step, self._pending = self._pending, None
    try:
      self._manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except  (whatever the writer raised)
      self._drain_failed_save()
      if step is None:
        raise
      raise self._save_error(step, e) from e

  def _drain_failed_save(self) -> None:
    """Waits for the other writes of a failed asynchronous save to end (their failures not
    re-raised)."""
    checkpointer = getattr(self._manager, "_checkpointer", None)
    # why: Orbax stops waiting at the first failed item; the others, left running, fail at shutdown
    # with thousands of lines after the real error.
    futures = getattr(getattr(checkpointer, "_async_manager", None), "_commit_futures", None)
    for f in futures or ():
      try:
        f.result()
      except Exception:  # pylint: disable=broad-except
        pass

  def all_steps(self) -> list[int]:
    """Steps of the finished checkpoints (ours and T5X's), ascending."""
    return checkpoint_paths.finished_steps(self.directory)

  def latest_step(self) -> Optional[int]:
    """Newest finished checkpoint step, or None."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def save(self,
           step: int,
           state: Any,
           data_state: Optional[Mapping[str, Any]] = None,
           force: bool = False,
           metrics: Optional[Mapping[str, float]] = None) -> bool:
    """True if `checkpoint_<step>/` was (started to be) written, False when off the interval.

    `state`: `.params` (T5X names) and `.opt_state` (optax); `data_state`: JSON-able position
    ("step" added); `metrics` ({"training_eval/loss": 0.3}) go into `data/`. Raises TypeError (no
    params/opt_state), CheckpointSaveError (this or the previous asynchronous save failed; names it,
    the cause, e.g. "No space left on device", and the last good checkpoint).
    """
    if not (hasattr(state, "params") and hasattr(state, "opt_state")):
      raise TypeError(f"CheckpointManager.save needs a TrainState (params, opt_state), got "
                      f"{type(state).__name__}")
    data = dict(data_state or {})
    data.setdefault("step", int(step))
    if metrics:
      data["metrics"] = {k: float(v) for k, v in metrics.items()}
    items = {
        checkpoint_paths.STATE_ITEM:
            ocp.args.PyTreeSave({
                "target": flax.core.unfreeze(state.params),
                "state": {
                    "step": _step_array(step, getattr(state, "step", None))
                }
            }),
        checkpoint_paths.DATA_ITEM:
            ocp.args.JsonSave(data),
    }
    if jax.tree_util.tree_leaves(state.opt_state):
      sig = optimizer_state_signature(state.opt_state, state.params)
      items[checkpoint_paths.OPTIMIZER_ITEM] = ocp.args.StandardSave(
          state.opt_state, custom_metadata={_OPT_METADATA_KEY: sig})
    self._await_pending()
    try:
      saved = self._manager.save(int(step), args=ocp.args.Composite(**items), force=force)
    except Exception as e:  # pylint: disable=broad-except  (whatever the writer raised)
      raise self._save_error(int(step), e) from e
    if saved and self._async:
      self._pending = int(step)
    if saved:
      logging.info("checkpoint %s %s", checkpoint_paths.checkpoint_dir(self.directory, step),
                   "being written" if self._async else "written")
      if self.metric_name_to_monitor:
        if metrics and self.metric_name_to_monitor in metrics:
          self._metrics[int(step)] = float(metrics[self.metric_name_to_monitor])
        self._await_pending()
        self._remove_all_but_best()
    return bool(saved)

  def _check_optimizer(self, folder: pathlib.Path, abstract_state: Any) -> bool:
    """True if the checkpoint holds an optax state that fits; raises when it holds another one."""
    run_sig = optimizer_state_signature(abstract_state.opt_state, abstract_state.params)
    item_dir = folder / checkpoint_paths.OPTIMIZER_ITEM
    if not item_dir.is_dir():
      if run_sig["num_arrays"] == 0:
        return True
      if _saved_items(folder) != {checkpoint_paths.STATE_ITEM, checkpoint_paths.DATA_ITEM}:
        # why: saved with an optimizer state that is gone (or unknown): a damaged checkpoint, so
        # `restore_latest` goes on to an older one instead of stopping
        raise UnreadableCheckpointError(
            f"{folder}: its {checkpoint_paths.OPTIMIZER_ITEM}/ item is missing (the checkpoint "
            "was saved with an optimizer state)")
      raise OptimizerStateMismatchError(
          f"{folder}: the optimizer state differs (checkpoint has none, the run uses "
          f"{_signature_text(run_sig)}); restore with {PARAMS_ONLY_HINT} to continue from this "
          "checkpoint with a fresh optimizer state")
    meta = ocp.PyTreeCheckpointHandler().metadata(item_dir).custom_metadata or {}
    ckpt_sig = meta.get(_OPT_METADATA_KEY)
    if ckpt_sig is None or ckpt_sig.get("fingerprint") == run_sig["fingerprint"]:
      return True
    same = ckpt_sig.get("description") == run_sig["description"]
    raise OptimizerStateMismatchError(
        f"{folder}: the optimizer state differs (checkpoint has {_signature_text(ckpt_sig)}, the "
        f"run uses {_signature_text(run_sig)}" +
        ("; same optax state types, other array shapes, dtypes or parameter tree" if same else "") +
        f"); restore with {PARAMS_ONLY_HINT} (and optimizer=) to continue from this "
        "checkpoint's parameters with a fresh optimizer state")

  def restore(self,
              step: int,
              abstract_state: Any,
              *,
              params_only: bool = False,
              optimizer: Any = None,
              fallback_params: Optional[PyTree] = None) -> tuple[Any, dict[str, Any]]:
    """(state like `abstract_state`, data_state: the saved JSON, {"step"} for T5X's) of `step`.

    `params_only`, or a T5X checkpoint (its Adafactor state is not optax's), gets a fresh state from
    `optimizer`. Raises OptimizerStateMismatchError, MissingOptimizerError, CheckpointMismatchError,
    NotACheckpointError, Orbax/TensorStore errors for unreadable files.
    """
    folder = checkpoint_paths.checkpoint_dir(self.directory, step)
    fmt = checkpoint_paths.checkpoint_format(folder)
    restore_opt = fmt == checkpoint_paths.ITEM_FORMAT_MCWQ and not params_only
    if restore_opt:
      self._check_optimizer(folder, abstract_state)
    params, ckpt_step = _restore_target(folder, fmt, abstract_state.params, fallback_params)
    if restore_opt:
      if jax.tree_util.tree_leaves(abstract_state.opt_state):
        restored = ocp.Checkpointer(ocp.StandardCheckpointHandler()).restore(
            folder / checkpoint_paths.OPTIMIZER_ITEM,
            args=ocp.args.StandardRestore(abstract_state.opt_state))
        opt_state = restored
      else:
        opt_state = abstract_state.opt_state
    else:
      why = ("params_only=True" if params_only else
             f"it was written by T5X ({fmt}): its Adafactor state is not optax's")
      opt_state = _fresh_opt_state(optimizer, params, abstract_state.opt_state, folder, why)
      logging.warning(
          "%s: restored the parameters and step only; the optimizer state is created "
          "fresh (%s)", folder, why)
    if fmt == checkpoint_paths.ITEM_FORMAT_MCWQ and (folder / checkpoint_paths.DATA_ITEM).is_dir():
      data = ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(
          folder / checkpoint_paths.DATA_ITEM, args=ocp.args.JsonRestore())
      data = dict(data or {})
    else:
      data = {}
    step_value = int(step) if ckpt_step is None else ckpt_step
    data.setdefault("step", step_value)
    state = abstract_state.replace(
        step=place(np.int32(step_value), abstract_state.step), params=params, opt_state=opt_state)
    return state, data

  def restore_params(self, step: int, abstract_params: PyTree) -> dict:
    """Parameters of checkpoint `step` only (see the module-level `restore_params`)."""
    return restore_params(checkpoint_paths.checkpoint_dir(self.directory, step), abstract_params)

  def restore_latest(
      self,
      abstract_state: Any,
      *,
      params_only: bool = False,
      optimizer: Any = None,
      fallback_params: Optional[PyTree] = None) -> Optional[tuple[int, Any, dict[str, Any]]]:
    """(step, state, data_state) of the newest readable checkpoint (older ones if it is corrupt), or
    None when there is none; arguments as `restore`.

    Raises at once OptimizerStateMismatchError, MissingOptimizerError, CheckpointMismatchError (an
    older one would not fit either); NoUsableCheckpointError when none can be read.
    """
    steps = self.all_steps()
    errors = []
    for step in reversed(steps):
      try:
        state, data_state = self.restore(
            step,
            abstract_state,
            params_only=params_only,
            optimizer=optimizer,
            fallback_params=fallback_params)
        # Read every array now so that corrupt chunks fail here, not later.
        jax.block_until_ready(state)
      except _INCOMPATIBLE:
        raise
      except Exception as e:  # pylint: disable=broad-except
        msg = _unreadable(checkpoint_paths.checkpoint_dir(self.directory, step), e)
        logging.warning("%s; falling back to the previous checkpoint", msg)
        errors.append(msg)
        continue
      if errors:
        logging.warning(
            "resumed from checkpoint %d after skipping corrupt newer checkpoint(s): "
            "%s", step, "; ".join(errors))
        self._move_aside([s for s in steps if s > step])
      return step, state, data_state
    if steps:
      raise NoUsableCheckpointError(
          f"no checkpoint in {self.directory} could be restored: {'; '.join(errors)}; move the "
          f"unreadable {checkpoint_paths.CHECKPOINT_PREFIX}_<step> folders out of it to train "
          "from the start, or train into another MODEL_DIR")
    return None

  def _move_aside(self, steps: Sequence[int]) -> None:
    """Renames the unreadable checkpoints `steps` to `checkpoint_<step>.corrupt-<time>` (process
    0)."""
    # Kept for inspection; the run rewrites those steps, and retention (counting finished
    # checkpoints) never deletes the restored one for an unreadable newer one.
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    if jax.process_index() == 0:
      for s in steps:
        folder = checkpoint_paths.checkpoint_dir(self.directory, s)
        aside = folder.with_name(f"{folder.name}.corrupt-{stamp}")
        folder.rename(aside)
        logging.warning(
            "moved the unreadable checkpoint %s aside to %s (the run goes on from an "
            "older one; delete it when no longer needed)", folder, aside)
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      multihost_utils.sync_global_devices("mcwq_t5x.checkpointing.checkpoints.move_aside")
    self._manager.reload()
    self._metrics = {k: v for k, v in self._metrics.items() if k not in set(steps)}

  def wait(self) -> None:
    """Blocks until an asynchronous save has finished; CheckpointSaveError once if it failed."""
    if not self._closed:
      self._await_pending()

  def close(self) -> None:
    """Waits for pending saves and releases the manager, also after a failure (idempotent);
    CheckpointSaveError if the pending save failed."""
    if self._closed:
      return
    try:
      self._await_pending()
    finally:
      self._closed = True
      self._manager.close()
