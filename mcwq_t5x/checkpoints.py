"""Orbax checkpointing of the train state and the data position, with resume and fallback.

Counterpart of T5X's `t5x/checkpoints.py`, built on `orbax.checkpoint.CheckpointManager`:

* periodic saves (`save_interval_steps`), keep the last `max_to_keep`, atomic (Orbax writes into a
  temporary folder and renames it when complete, so a killed run never leaves a half checkpoint
  that looks finished);
* each checkpoint `MODEL_DIR/checkpoints/<step>/` holds `state/` (the `TrainState`, sharded arrays)
  and `data/` (JSON: step, data seed, batch size: the data iterator is a function of (seed, step),
  so this is the complete data position);
* `restore_latest()` restores the newest readable checkpoint; if the newest is corrupt (unreadable
  files) it logs a warning and falls back to the previous one.

Nothing here imports TensorFlow or SeqIO.
"""
from __future__ import annotations

import logging
import pathlib
from typing import Any, Mapping, Optional

import jax
import orbax.checkpoint as ocp

PyTree = Any


class NoUsableCheckpointError(RuntimeError):
  """Raised when checkpoints exist but none of them can be restored."""


class CheckpointManager:
  """Saves/restores (train state, data position) under `directory` with Orbax.

  Args:
    directory: folder for the checkpoints (created if missing), e.g. MODEL_DIR/checkpoints.
    save_interval_steps: save only on steps that are multiples of this (forced saves always happen).
    max_to_keep: number of most recent checkpoints to keep (None = all).
    async_save: write in a background thread (call `wait()`/`close()` before exiting).
  """

  def __init__(self, directory: str | pathlib.Path, save_interval_steps: int = 1000,
               max_to_keep: Optional[int] = 3, async_save: bool = True):
    self.directory = pathlib.Path(directory).absolute()
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=max(int(save_interval_steps), 1),
        max_to_keep=max_to_keep,
        create=True,
        enable_async_checkpointing=async_save,
    )
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def all_steps(self) -> list[int]:
    """Steps of the finished checkpoints, ascending."""
    self._manager.reload()
    return sorted(self._manager.all_steps())

  def latest_step(self) -> Optional[int]:
    """Newest finished checkpoint step, or None."""
    steps = self.all_steps()
    return steps[-1] if steps else None

  def save(self, step: int, state: PyTree, data_state: Optional[Mapping[str, Any]] = None,
           force: bool = False) -> bool:
    """Saves `state` (any pytree of jax arrays) and the JSON-able `data_state` at `step`.

    Returns:
      True if a checkpoint was (started to be) written, False when skipped by the interval.
    """
    data_state = dict(data_state or {})
    data_state.setdefault("step", int(step))
    saved = self._manager.save(
        int(step),
        args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                data=ocp.args.JsonSave(data_state)),
        force=force)
    if saved:
      logging.info("checkpoint for step %d %s in %s", step,
                   "being written" if self._manager._options.enable_async_checkpointing
                   else "written", self.directory)
    return bool(saved)

  def restore(self, step: int, abstract_state: PyTree) -> tuple[PyTree, dict[str, Any]]:
    """Restores checkpoint `step` into the shardings/dtypes of `abstract_state`.

    Args:
      step: checkpoint step.
      abstract_state: pytree of `jax.ShapeDtypeStruct` with `sharding` (e.g. `Trainer.state_shapes`).

    Returns:
      (state, data_state).

    Raises:
      Any Orbax/TensorStore error for unreadable files.
    """
    restored = self._manager.restore(
        int(step),
        args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                data=ocp.args.JsonRestore()))
    return restored["state"], dict(restored["data"] or {})

  def restore_params(self, step: int, abstract_params: PyTree) -> PyTree:
    """Restores only the parameters (`state.params`) of checkpoint `step` (evaluation/inference:
    no optimizer state needed, whatever optimizer trained it).

    Args:
      step: checkpoint step.
      abstract_params: pytree of `jax.ShapeDtypeStruct` with `sharding`.
    """
    item = {"params": abstract_params}
    restore_args = jax.tree_util.tree_map(
        lambda s: ocp.ArrayRestoreArgs(sharding=s.sharding, dtype=s.dtype), item)
    restored = self._manager.restore(
        int(step),
        args=ocp.args.Composite(state=ocp.args.PyTreeRestore(
            item=item, restore_args=restore_args, partial_restore=True)))
    return restored["state"]["params"]

  def restore_latest(self, abstract_state: PyTree
                     ) -> Optional[tuple[int, PyTree, dict[str, Any]]]:
    """Restores the newest readable checkpoint, falling back to older ones if it is corrupt.

    Returns:
      (step, state, data_state), or None when there is no checkpoint at all.

    Raises:
      NoUsableCheckpointError: if checkpoints exist but none can be read.
    """
    steps = self.all_steps()
    errors = []
    for step in reversed(steps):
      try:
        state, data_state = self.restore(step, abstract_state)
        # Force reading every array now so that corrupt chunks fail here, not later.
        jax.block_until_ready(state)
        if errors:
          logging.warning("resumed from checkpoint %d after skipping corrupt newer checkpoint(s): %s",
                          step, "; ".join(errors))
        return step, state, data_state
      except Exception as e:  # pylint: disable=broad-except
        msg = f"checkpoint {self.directory / str(step)} is unreadable ({type(e).__name__}: {e})"
        logging.warning("%s; falling back to the previous checkpoint", msg)
        errors.append(msg)
    if steps:
      raise NoUsableCheckpointError("no checkpoint in %s could be restored:\n%s"
                                    % (self.directory, "\n".join(errors)))
    return None

  def wait(self) -> None:
    """Blocks until an asynchronous save has finished."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases the manager."""
    self._manager.wait_until_finished()
    self._manager.close()


def resolve_checkpoint(path: str | pathlib.Path) -> tuple[pathlib.Path, int]:
  """Finds (checkpoints folder, step) for a MODEL_DIR, a checkpoints folder or a step folder.

  Accepted: `MODEL_DIR` (newest step of MODEL_DIR/checkpoints), `MODEL_DIR/checkpoints` (newest
  step), `MODEL_DIR/checkpoints/<step>`.

  Raises:
    FileNotFoundError: when no finished checkpoint is found at `path`.
  """
  p = pathlib.Path(path).absolute()
  if p.name.isdigit() and (p / "state").is_dir():
    return p.parent, int(p.name)
  for folder in (p / "checkpoints", p):
    if folder.is_dir():
      steps = sorted(int(d.name) for d in folder.iterdir()
                     if d.is_dir() and d.name.isdigit() and (d / "state").is_dir())
      if steps:
        return folder, steps[-1]
  raise FileNotFoundError(f"no checkpoint found at {p} (expected MODEL_DIR, MODEL_DIR/checkpoints "
                          "or MODEL_DIR/checkpoints/<step> written by mcwq_t5x.train)")
