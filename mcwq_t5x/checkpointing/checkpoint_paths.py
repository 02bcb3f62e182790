"""Checkpoint paths and formats: where a checkpoint lies and which format it is in.

The leaf of the checkpoint code (T5X's `checkpoints_utils.py`): directory listings and file names
only, never a checkpoint's contents, and no import of this project. Formats (`detect_format`,
`locate`): `FORMAT_ORBAX` (a MODEL_DIR's `checkpoint_<step>/state/`, `mcwq_t5x.train` or
`t5x.train`), `FORMAT_T5X` (msgpack `checkpoint` + TensorStore zarr, as published under
gs://t5-data/pretrained_models/t5x/) and `FORMAT_HF` (`save_pretrained`: `config.json` + safetensors
or `pytorch_model.bin`). Inside a MODEL_DIR each finished step has one item format
(`checkpoint_format`): `ITEM_FORMAT_MCWQ`, `ITEM_FORMAT_T5X_ORBAX` or `ITEM_FORMAT_T5X_MSGPACK`.
"""
from __future__ import annotations

import os
import pathlib
import re
from typing import Optional, Sequence

PathLike = str | os.PathLike

CHECKPOINT_PREFIX = "checkpoint"  # T5X: `checkpoints_utils.get_checkpoint_prefix()`
STATE_ITEM = "state"  # T5X's Orbax item name (`checkpoints._STATE_KEY`)
OPTIMIZER_ITEM = "optimizer"  # ours
DATA_ITEM = "data"  # ours
T5X_MSGPACK_FILE = "checkpoint"  # T5X-native: the msgpack file of a checkpoint folder
# T5X-native: a msgpack leaf `PLACEHOLDER://<zarr folder>` stands for an array stored beside it.
T5X_PLACEHOLDER = "PLACEHOLDER://"
# Hugging Face weight files, any of which makes a folder a Hugging Face checkpoint.
HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")

# Item formats of a finished `checkpoint_<step>` folder (`checkpoint_format`).
ITEM_FORMAT_MCWQ = "mcwq_t5x"
ITEM_FORMAT_T5X_ORBAX = "t5x-orbax"
ITEM_FORMAT_T5X_MSGPACK = "t5x-msgpack"

# Checkpoint formats of any path (`detect_format`).
FORMAT_HF = "hf"
FORMAT_T5X = "t5x"
FORMAT_ORBAX = "orbax"

FORMAT_DESCRIPTIONS = {
    FORMAT_ORBAX:
        "an Orbax checkpoint of mcwq_t5x.train or t5x.train (MODEL_DIR holding "
        f"{CHECKPOINT_PREFIX}_<step>/ folders, one such folder, or its '{STATE_ITEM}' item)",
    FORMAT_T5X: f"a T5X checkpoint_N directory with a '{T5X_MSGPACK_FILE}' msgpack file",
    FORMAT_HF: "a Hugging Face directory with model.safetensors / pytorch_model.bin",
}

_STEP_DIR_RE = re.compile(rf"^{CHECKPOINT_PREFIX}_(\d+)$")


class NotACheckpointError(FileNotFoundError):
  """A path holds no finished checkpoint of ours or of T5X."""


class CheckpointMismatchError(ValueError):
  """A checkpoint's parameter names or shapes do not match the model."""


def step_of(name: str) -> Optional[int]:
  """The step of a `checkpoint_<step>` folder name, or None for any other name."""
  m = _STEP_DIR_RE.match(name)
  return int(m.group(1)) if m else None


class CheckpointOutsideFolderError(ValueError):
  """A checkpoint names data outside its folder or a non-local store (`http`/`gcs`/`s3`/`memory`,
  `../x`); never read, never skipped for an older checkpoint. The message names file and entry."""


class UnreadableCheckpointFileError(ValueError):
  """A checkpoint's file is malformed (pickle, safetensors, msgpack, index JSON); the message
  names the file and the problem."""


# A checkpoint path that is not one, or one that cannot be read: each message names the file or
# folder and the problem; the mains print it as one line (`console.one_line_exit`).
INPUT_ERRORS = (NotACheckpointError, CheckpointMismatchError, CheckpointOutsideFolderError,
                UnreadableCheckpointFileError)


def inside_folder(folder: PathLike, entry: str, roots: Sequence[PathLike] = ()) -> pathlib.Path:
  """`folder/entry` resolved (symlinks, `..`) if it lies inside `folder` (or one of `roots`),
  else raises `CheckpointOutsideFolderError` naming `entry` (the caller adds the file)."""
  base = pathlib.Path(folder).resolve()
  target = (base / entry).resolve()  # why: an absolute entry replaces base; both are checked
  for root in [base, *(pathlib.Path(r).resolve() for r in roots)]:
    if target == root or root in target.parents:
      return target
  raise CheckpointOutsideFolderError(f"entry {entry!r} resolves to {target}, outside the "
                                     f"checkpoint's folder {base}")


def checkpoint_dir(directory: PathLike, step: int) -> pathlib.Path:
  """`directory/checkpoint_<step>` (T5X `checkpoints_utils.get_checkpoint_dir`)."""
  return pathlib.Path(directory) / f"{CHECKPOINT_PREFIX}_{int(step)}"


def checkpoint_format(folder: PathLike) -> str:
  """The item format of a finished `checkpoint_<step>`: ITEM_FORMAT_MCWQ (`state/` plus our `data/`
  or `optimizer/`), ITEM_FORMAT_T5X_ORBAX (`state/` only) or ITEM_FORMAT_T5X_MSGPACK (T5X's legacy
  `checkpoint` file). NotACheckpointError for none (e.g. an unfinished Orbax temporary folder)."""
  folder = pathlib.Path(folder)
  if (folder / STATE_ITEM).is_dir():
    if (folder / DATA_ITEM).is_dir() or (folder / OPTIMIZER_ITEM).is_dir():
      return ITEM_FORMAT_MCWQ
    return ITEM_FORMAT_T5X_ORBAX
  if (folder / T5X_MSGPACK_FILE).is_file():
    return ITEM_FORMAT_T5X_MSGPACK
  raise NotACheckpointError(
      f"{folder}: not a finished checkpoint (expected a '{STATE_ITEM}/' Orbax item or a "
      f"'{T5X_MSGPACK_FILE}' msgpack file)")


def _is_finished(folder: pathlib.Path) -> bool:
  try:
    checkpoint_format(folder)
    return True
  except NotACheckpointError:
    return False


def finished_steps(directory: PathLike) -> list[int]:
  """Ascending steps of the finished `checkpoint_<step>` folders in `directory` ([] if missing)."""
  d = pathlib.Path(directory)
  if not d.is_dir():
    return []
  steps = []
  for child in d.iterdir():
    # Orbax's `checkpoint_<step>.orbax-checkpoint-tmp-*` and T5X's `.tmp-*` do not match: a half-
    # written checkpoint is never listed.
    m = _STEP_DIR_RE.match(child.name)
    if m and child.is_dir() and _is_finished(child):
      steps.append(int(m.group(1)))
  return sorted(steps)


def resolve_checkpoint(path: PathLike) -> tuple[pathlib.Path, int]:
  """(absolute MODEL_DIR, step) of `MODEL_DIR` (its newest finished step, also under
  `MODEL_DIR/checkpoints/`), `MODEL_DIR/checkpoint_<step>`, or its `state` / `checkpoint` item, as
  T5X `checkpoints.find_checkpoint`. NotACheckpointError (a FileNotFoundError) for anything else."""
  p = pathlib.Path(path).absolute()
  if p.name in (STATE_ITEM, T5X_MSGPACK_FILE) and _STEP_DIR_RE.match(p.parent.name):
    p = p.parent
  m = _STEP_DIR_RE.match(p.name)
  if m and p.is_dir():
    checkpoint_format(p)  # raises NotACheckpointError for an unfinished folder
    return p.parent, int(m.group(1))
  for folder in (p, p / "checkpoints"):  # also MODEL_DIR/checkpoints/checkpoint_<step>/
    steps = finished_steps(folder)
    if steps:
      return folder, steps[-1]
  hint = ""
  if (p / "checkpoints").is_dir() and any(c.name.isdigit() for c in (p / "checkpoints").iterdir()):
    hint = (" (MODEL_DIR/checkpoints/<step>/ is not a checkpoint layout this engine reads; "
            "checkpoints are T5X's MODEL_DIR/checkpoint_<step>/)")
  raise NotACheckpointError(
      f"{p}: no checkpoint: expected MODEL_DIR holding {CHECKPOINT_PREFIX}_<step>/ folders, a "
      f"{CHECKPOINT_PREFIX}_<step>/ folder or its '{STATE_ITEM}' item, written by mcwq_t5x.train "
      f"or T5X (Orbax or msgpack+zarr){hint}")


def hf_folder(path: PathLike) -> Optional[pathlib.Path]:
  """`path` if it is a folder holding one of `HF_WEIGHT_FILES`, else None."""
  p = pathlib.Path(path)
  if p.is_dir() and any((p / f).is_file() for f in HF_WEIGHT_FILES):
    return p
  return None


def t5x_native_folder(path: PathLike) -> Optional[pathlib.Path]:
  """The T5X-native checkpoint folder `path` designates (the folder of a `checkpoint` msgpack
  file, or a folder holding one), else None."""
  p = pathlib.Path(path)
  if p.is_file() and p.name == T5X_MSGPACK_FILE:
    return p.parent
  if p.is_dir() and (p / T5X_MSGPACK_FILE).is_file():
    return p
  return None


def locate(path: PathLike) -> tuple[str, pathlib.Path]:
  """(format, folder) of the checkpoint at `path`; the project's one format detection.

  Tried in order: T5X's MODEL_DIR layout (FORMAT_ORBAX, or FORMAT_T5X for msgpack steps), a
  Hugging Face folder, a standalone T5X-native checkpoint. Raises NotACheckpointError (a
  FileNotFoundError): no such path, or none of the formats (the message names what `path` holds
  and what was looked for).
  """
  p = pathlib.Path(path)
  try:
    directory, step = resolve_checkpoint(p)
  except NotACheckpointError:
    if not p.exists() and "://" not in str(path):
      raise
  else:
    folder = checkpoint_dir(directory, step)
    item_format = checkpoint_format(folder)
    return (FORMAT_T5X if item_format == ITEM_FORMAT_T5X_MSGPACK else FORMAT_ORBAX), folder
  hf = hf_folder(p)
  if hf is not None:
    return FORMAT_HF, hf
  native = t5x_native_folder(p)
  if native is not None:
    return FORMAT_T5X, native
  if step_of(p.name) is not None and p.is_dir():  # why: a step folder's items are all it can hold
    looked_for = (f"its '{STATE_ITEM}/' Orbax item (mcwq_t5x.train, t5x.train) or a "
                  f"'{T5X_MSGPACK_FILE}' msgpack file (T5X)")
  else:
    looked_for = "; or ".join(FORMAT_DESCRIPTIONS[f] for f in (FORMAT_HF, FORMAT_T5X, FORMAT_ORBAX))
  raise NotACheckpointError(f"{p}: not a checkpoint: {_holding(p)}; expected {looked_for}")


def _holding(p: pathlib.Path, shown: int = 5) -> str:
  """What `p` holds, in a few words: "the folder is empty", "the folder holds no checkpoint
  files (it has: a, b)", "a file" or "no such file or folder"."""
  if p.is_dir():
    names = sorted(c.name + ("/" if c.is_dir() else "") for c in p.iterdir())
    if not names:
      return "the folder is empty"
    more = f", and {len(names) - shown} more" if len(names) > shown else ""
    return f"the folder holds no checkpoint files (it has: {', '.join(names[:shown])}{more})"
  return "a file" if p.exists() else "no such file or folder"


def detect_format(path: PathLike) -> str:
  """FORMAT_HF, FORMAT_T5X or FORMAT_ORBAX: the format `locate` finds at `path` (raises as it
  does)."""
  return locate(path)[0]
