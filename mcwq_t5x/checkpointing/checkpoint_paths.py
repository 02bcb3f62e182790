"""Checkpoint paths and formats: where a checkpoint lies and which format it is in.

The leaf of the checkpoint code (T5X's `checkpoints_utils.py`): directory listings and file names
(and a file's bytes, for the readers), never what a checkpoint holds, and no import of this
project. Formats (`detect_format`,
`locate`): `FORMAT_ORBAX` (a MODEL_DIR's `checkpoint_<step>/state/`, `mcwq_t5x.train` or
`t5x.train`), `FORMAT_T5X` (msgpack `checkpoint` + TensorStore zarr, as published under
gs://t5-data/pretrained_models/t5x/) and `FORMAT_HF` (`save_pretrained`: `config.json` + safetensors
or `pytorch_model.bin`). Inside a MODEL_DIR each finished step has one item format
(`checkpoint_format`): `ITEM_FORMAT_MCWQ`, `ITEM_FORMAT_T5X_ORBAX` or `ITEM_FORMAT_T5X_MSGPACK`.

Every path is local (`pathlib.Path`) or an object-store URL (`StorePath`: `gs://bucket/key`,
`s3://bucket/key`), as `as_path` makes it; both answer the same `pathlib` calls (`/`, `name`,
`parent`, `is_dir`, `is_file`, `iterdir`, `read_bytes`), so the layout rules here hold for both.
A `StorePath` lists and reads through TensorStore's `gcs`/`s3` key-value stores (the transport
T5X and Orbax read checkpoint arrays with), with `STORE_RETRIES` (`store_context`); a folder is
a key prefix ending in "/".
"""
from __future__ import annotations

import functools
import os
import pathlib
import posixpath
import re
from typing import Any, Optional, Sequence

PathLike = str | os.PathLike

# Object-store URL schemes read, and their TensorStore key-value store drivers.
STORE_DRIVERS = {"gs": "gcs", "s3": "s3"}
# Retries of one object-store request (TensorStore's default, 32 retries up to 32 s apart, waits
# a quarter of an hour before it says that a store cannot be reached): about 8 s in all.
STORE_RETRIES = {"max_retries": 4, "initial_delay": "0.5s", "max_delay": "4s"}

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


class ObjectStoreError(OSError):
  """An object-store URL cannot be listed or read (no network, no access, no such bucket); the
  one-line message names the URL, the store's error and what to do."""


@functools.lru_cache(maxsize=None)
def store_context() -> Any:
  """The process's `tensorstore.Context` for object stores: `STORE_RETRIES` for gcs and s3."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  return ts.Context({"gcs_request_retries": STORE_RETRIES, "s3_request_retries": STORE_RETRIES})


class StorePath:
  """A file or folder `scheme://bucket/key` in an object store (`STORE_DRIVERS`), with the
  `pathlib.Path` calls this project makes on checkpoint paths.

  `key` is normalised ("a//b/" -> "a/b"; `..` is kept until `resolve`). `is_dir`: some object's
  name starts with `key/`; `is_file`: an object named `key`. Network and access errors raise
  `ObjectStoreError` naming the URL; `read_bytes` of a missing object FileNotFoundError.
  """

  def __init__(self, url: str):
    scheme, sep, rest = str(url).partition("://")
    if not sep or scheme not in STORE_DRIVERS:
      raise NotACheckpointError(f"{url}: not a local path or an object-store URL this engine reads "
                                f"({', '.join(s + '://' for s in STORE_DRIVERS)})")
    bucket, _, key = rest.partition("/")
    if not bucket:
      raise NotACheckpointError(f"{url}: the URL names no bucket")
    self.scheme, self.bucket = scheme, bucket
    self.key = "/".join(part for part in key.split("/") if part not in ("", "."))

  def __str__(self) -> str:
    return f"{self.scheme}://{self.bucket}/{self.key}".rstrip("/")

  def __repr__(self) -> str:
    return f"StorePath({str(self)!r})"

  def __eq__(self, other: Any) -> bool:
    return isinstance(other, StorePath) and str(self) == str(other)

  def __hash__(self) -> int:
    return hash(str(self))

  def __truediv__(self, name: PathLike) -> StorePath:
    name = os.fspath(name)
    key = name if name.startswith("/") else f"{self.key}/{name}"  # why: as pathlib's `/`
    return StorePath(f"{self.scheme}://{self.bucket}/{key}")

  @property
  def name(self) -> str:
    return self.key.rsplit("/", 1)[-1]

  @property
  def parent(self) -> StorePath:
    return StorePath(f"{self.scheme}://{self.bucket}/{self.key.rpartition('/')[0]}")

  @property
  def parents(self) -> list[StorePath]:
    out, p = [], self
    while p.key:
      p = p.parent
      out.append(p)
    return out

  def absolute(self) -> StorePath:
    return self

  def resolve(self) -> StorePath:
    """`..` and `.` resolved inside the bucket (never above its root)."""
    key = posixpath.normpath("/" + self.key).lstrip("/")
    return StorePath(f"{self.scheme}://{self.bucket}/{key}")

  def kvstore_spec(self) -> dict[str, Any]:
    """The TensorStore key-value store spec of this object (or folder prefix)."""
    return {"driver": STORE_DRIVERS[self.scheme], "bucket": self.bucket, "path": self.key}

  def _store(self) -> Any:
    return _open_store(STORE_DRIVERS[self.scheme], self.bucket)

  def _call(self, what: str, call: Any) -> Any:
    try:
      return call().result()
    except Exception as e:  # why: TensorStore raises ValueError/OSError variants alike
      first = (str(e).strip().splitlines() or [type(e).__name__])[0]
      raise ObjectStoreError(
          f"{self}: the object store's {what} failed ({first}); check the network and "
          f"the credentials, or copy it to this machine (e.g. `gsutil cp -r {self} .`) and name "
          "the copy") from None

  def _keys(self, lo: str, hi: str) -> list[str]:
    import tensorstore as ts  # pylint: disable=g-import-not-at-top
    rng = ts.KvStore.KeyRange(lo.encode(), hi.encode())
    return [k.decode() for k in self._call("listing", lambda: self._store().list(rng))]

  def _children(self) -> list[str]:
    prefix = f"{self.key}/" if self.key else ""
    hi = prefix[:-1] + "0" if prefix else ""  # why: "0" follows "/": the end of the prefix
    return [k[len(prefix):] for k in self._keys(prefix, hi) if len(k) > len(prefix)]

  def is_dir(self) -> bool:
    return bool(self._children())

  def is_file(self) -> bool:
    return bool(self.key) and self.key in self._keys(self.key, self.key + "\0")

  def exists(self) -> bool:
    return self.is_file() or self.is_dir()

  def iterdir(self) -> list[StorePath]:
    return [self / n for n in sorted({c.split("/", 1)[0] for c in self._children()})]

  def read_bytes(self) -> bytes:
    result = self._call("read", lambda: self._store().read(self.key.encode()))
    if result.state != "value":
      raise FileNotFoundError(f"{self}: no such object")
    return bytes(result.value)

  def read_text(self, encoding: str = "utf-8") -> str:
    return self.read_bytes().decode(encoding)


def _open_store(driver: str, bucket: str) -> Any:
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  return ts.KvStore.open({"driver": driver, "bucket": bucket}, context=store_context()).result()


def is_url(path: Any) -> bool:
  """True for a `StorePath` or a string with `://` (an object store, or a URL refused)."""
  return isinstance(path, StorePath) or (isinstance(path, str) and "://" in path)


def as_path(path: PathLike | StorePath) -> pathlib.Path | StorePath:
  """`path` as a `StorePath` (a URL; NotACheckpointError for a scheme not in `STORE_DRIVERS`)
  or a `pathlib.Path` (`file://` URLs included): never `pathlib.Path("gs://b")` ("gs:/b")."""
  if isinstance(path, (StorePath, pathlib.Path)):
    return path
  path = os.fspath(path)
  if path.startswith("file://"):
    return pathlib.Path(path[len("file://"):])
  return StorePath(path) if "://" in path else pathlib.Path(path)


def kvstore_spec(path: pathlib.Path | StorePath) -> dict[str, Any]:
  """The TensorStore key-value store spec of a local file or folder (`file`) or an object."""
  if isinstance(path, StorePath):
    return path.kvstore_spec()
  return {"driver": "file", "path": str(path)}


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
                UnreadableCheckpointFileError, ObjectStoreError)


def inside_folder(folder: PathLike | StorePath, entry: str,
                  roots: Sequence[PathLike] = ()) -> pathlib.Path | StorePath:
  """`folder/entry` resolved (symlinks, `..`) if it lies inside `folder` (or one of `roots`),
  else raises `CheckpointOutsideFolderError` naming `entry` (the caller adds the file). In an
  object store `folder/entry` stays in `folder`'s bucket (an absolute entry starts at its root)."""
  base = as_path(folder).resolve()
  target = (base / entry).resolve()  # why: an absolute entry replaces base; both are checked
  for root in [base, *(as_path(r).resolve() for r in roots)]:
    if target == root or root in target.parents:
      return target
  raise CheckpointOutsideFolderError(f"entry {entry!r} resolves to {target}, outside the "
                                     f"checkpoint's folder {base}")


def checkpoint_dir(directory: PathLike, step: int) -> pathlib.Path | StorePath:
  """`directory/checkpoint_<step>` (T5X `checkpoints_utils.get_checkpoint_dir`)."""
  return as_path(directory) / f"{CHECKPOINT_PREFIX}_{int(step)}"


def checkpoint_format(folder: PathLike) -> str:
  """The item format of a finished `checkpoint_<step>`: ITEM_FORMAT_MCWQ (`state/` plus our `data/`
  or `optimizer/`), ITEM_FORMAT_T5X_ORBAX (`state/` only) or ITEM_FORMAT_T5X_MSGPACK (T5X's legacy
  `checkpoint` file). NotACheckpointError for none (e.g. an unfinished Orbax temporary folder)."""
  folder = as_path(folder)
  if (folder / STATE_ITEM).is_dir():
    if (folder / DATA_ITEM).is_dir() or (folder / OPTIMIZER_ITEM).is_dir():
      return ITEM_FORMAT_MCWQ
    return ITEM_FORMAT_T5X_ORBAX
  if (folder / T5X_MSGPACK_FILE).is_file():
    return ITEM_FORMAT_T5X_MSGPACK
  raise NotACheckpointError(
      f"{folder}: not a finished checkpoint (expected a '{STATE_ITEM}/' Orbax item or a "
      f"'{T5X_MSGPACK_FILE}' msgpack file)")


def _is_finished(folder: pathlib.Path | StorePath) -> bool:
  try:
    checkpoint_format(folder)
    return True
  except NotACheckpointError:
    return False


def finished_steps(directory: PathLike) -> list[int]:
  """Ascending steps of the finished `checkpoint_<step>` folders in `directory` ([] if missing)."""
  d = as_path(directory)
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


def resolve_checkpoint(path: PathLike) -> tuple[pathlib.Path | StorePath, int]:
  """(absolute MODEL_DIR, step) of `MODEL_DIR` (its newest finished step, also under
  `MODEL_DIR/checkpoints/`), `MODEL_DIR/checkpoint_<step>`, or its `state` / `checkpoint` item, as
  T5X `checkpoints.find_checkpoint`. NotACheckpointError (a FileNotFoundError) for anything else."""
  p = as_path(path).absolute()
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


def hf_folder(path: PathLike) -> Optional[pathlib.Path | StorePath]:
  """`path` if it is a folder holding one of `HF_WEIGHT_FILES`, else None."""
  p = as_path(path)
  if p.is_dir() and any((p / f).is_file() for f in HF_WEIGHT_FILES):
    return p
  return None


def t5x_native_folder(path: PathLike) -> Optional[pathlib.Path | StorePath]:
  """The T5X-native checkpoint folder `path` designates (the folder of a `checkpoint` msgpack
  file, or a folder holding one), else None."""
  p = as_path(path)
  if p.is_file() and p.name == T5X_MSGPACK_FILE:
    return p.parent
  if p.is_dir() and (p / T5X_MSGPACK_FILE).is_file():
    return p
  return None


def locate(path: PathLike) -> tuple[str, pathlib.Path | StorePath]:
  """(format, folder) of the checkpoint at `path`; the project's one format detection.

  Tried in order: T5X's MODEL_DIR layout (FORMAT_ORBAX, or FORMAT_T5X for msgpack steps), a
  Hugging Face folder, a standalone T5X-native checkpoint. Raises NotACheckpointError (a
  FileNotFoundError): no such path, or none of the formats (the message names what `path` holds
  and what was looked for); ObjectStoreError: an object store that cannot be reached.
  """
  p = as_path(path)
  try:
    directory, step = resolve_checkpoint(p)
  except NotACheckpointError:
    if not isinstance(p, StorePath) and not p.exists():  # why: a URL says "no such ..." below
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


def _holding(p: pathlib.Path | StorePath, shown: int = 5) -> str:
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
