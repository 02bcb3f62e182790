"""What a training run was: `MODEL_DIR/run.json`, written by `mcwq_t5x.train`, read by the others.

run.json records the network config, the task and its input prefix, lengths, steps and the
vocabulary (path, SHA-256, `extra_ids`, a byte copy at `MODEL_DIR/vocab/spm.model`); docs/t5x.md
shows the format.
Vocabulary rule of `eval`, `infer` and a resumed `train`: with `$MCWQ_VOCAB` unset,
`adopt_recorded_vocabulary` points it at the run's copy before tasks and model are built; the
vocabulary used is then compared with the record (`check_vocabulary`, `VocabularyMismatchError`
naming both files and hashes); a checkpoint without run.json loads unchecked, with a warning.
No TensorFlow or gin import (a `gs://` vocabulary is read through `data.paths.read_bytes`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import pathlib
import tempfile
from typing import Any, Mapping, Optional, Union

from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import run_folder
from mcwq_t5x.data import paths
from mcwq_t5x.data import pipeline
from mcwq_t5x.engine import network

PathLike = Union[str, os.PathLike]

RUN_JSON = run_folder.RUN_JSON
VOCAB_COPY = "vocab/spm.model"
FORMAT_VERSION = 1
ENGINE = "mcwq_t5x"
VOCAB_ENV = "MCWQ_VOCAB"  # = mcwq_t5x.data.vocab.VOCAB_ENV (not imported: vocab imports seqio)


class VocabularyMismatchError(ValueError):
  """The vocabulary about to be used is not the one the checkpoint was trained with (the message
  names both files and their SHA-256)."""


def engine_version() -> str:
  """The installed `mcwq-t5x` version, else the one in setup.py ("0.1.0")."""
  try:
    from importlib import metadata  # pylint: disable=g-import-not-at-top
    return metadata.version("mcwq-t5x")
  except Exception:  # pylint: disable=broad-except  # not installed: a source checkout
    return "0.1.0"


def network_fields(config: network.T5Config) -> dict[str, Any]:
  """The `T5Config` as JSON-able fields (dtype as its name, activations as a list)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  out = {}
  for f in dataclasses.fields(config):
    value = getattr(config, f.name)
    if f.name == "dtype":
      value = np.dtype(value).name
    elif isinstance(value, (tuple, list)):
      value = list(value)
    out[f.name] = value
  return out


def network_config(run: Mapping[str, Any], source: PathLike = RUN_JSON) -> network.T5Config:
  """The `T5Config` of a run.json dict; ValueError (naming `source`): no "network", unknown
  fields."""
  fields = run.get("network")
  if not isinstance(fields, dict):
    raise ValueError(f"{source}: no \"network\" object (the model config)")
  fields = dict(fields)
  if isinstance(fields.get("mlp_activations"), list):
    fields["mlp_activations"] = tuple(fields["mlp_activations"])
  try:
    return network.T5Config(**fields)
  except TypeError as e:
    raise ValueError(f"{source}: \"network\" does not fit network.T5Config: {e}") from e


def vocabulary_identity(vocabulary: Any) -> Optional[dict[str, Any]]:
  """{"path", "sha256", "extra_ids"} of a SentencePiece vocabulary, None for another kind; OSError /
  DataNotFoundError when the model file cannot be read."""
  path = getattr(vocabulary, "sentencepiece_model_file", None)
  if vocabulary is None or path is None:
    return None
  if hasattr(vocabulary, "_model_context") and (paths.is_url(path) or not os.path.isfile(path)):
    vocabulary._model_context()  # pylint: disable=protected-access  # raises, naming the file
  return {
      "path": str(path),
      "sha256": hashlib.sha256(paths.read_bytes(str(path))).hexdigest(),
      "extra_ids": int(getattr(vocabulary, "extra_ids", 0) or 0),
  }


def _atomic_write(path: pathlib.Path, data: bytes) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.replace(tmp, path)
  except BaseException:
    pathlib.Path(tmp).unlink(missing_ok=True)
    raise


def write(model_dir: PathLike,
          *,
          model: Any,
          task: Optional[str] = None,
          split: Optional[str] = None,
          feature_lengths: Optional[Mapping[str, int]] = None,
          train_steps: Optional[int] = None,
          batch_size: Optional[int] = None,
          pack: Optional[bool] = None,
          input_prefix: Optional[Mapping[str, Optional[str]]] = None) -> dict[str, Any]:
  """The dict written to MODEL_DIR/run.json, with MODEL_DIR/vocab/spm.model, atomically: `model`'s
  network config and `output_vocabulary`, and the training data (task, split, lengths, steps,
  batch size, pack, and `input_prefix`: {task: the text before each question}, one entry per
  task of a mixture)."""
  model_dir = pathlib.Path(model_dir)
  ident = vocabulary_identity(getattr(model, "output_vocabulary", None))
  if ident is not None:
    data = paths.read_bytes(ident["path"])
    copy = model_dir / VOCAB_COPY
    if not copy.is_file() or copy.read_bytes() != data:
      _atomic_write(copy, data)
    ident["copy"] = VOCAB_COPY
  run = {
      "format": FORMAT_VERSION,
      "engine": ENGINE,
      "engine_version": engine_version(),
      "network": network_fields(model.module.config),
      "vocabulary": ident,
      "task": task,
      "split": split,
      "feature_lengths": None if feature_lengths is None else dict(feature_lengths),
      "train_steps": train_steps,
      "batch_size": batch_size,
      "pack": pack,
      "input_prefix": None if input_prefix is None else dict(input_prefix),
  }
  _atomic_write(model_dir / RUN_JSON, (json.dumps(run, indent=2, sort_keys=True) + "\n").encode())
  return run


def find(checkpoint_path: PathLike, levels: int = 3) -> Optional[pathlib.Path]:
  """The run.json at `checkpoint_path` or up to `levels` folders above it (MODEL_DIR,
  MODEL_DIR/checkpoint_<step>, MODEL_DIR/checkpoint_<step>/state; local or in an object store);
  None if there is none."""
  p = checkpoint_paths.as_path(checkpoint_path).absolute()
  for folder in [p, *p.parents][:levels + 1]:
    if (folder / RUN_JSON).is_file():
      return folder / RUN_JSON
  return None


def read(path: PathLike) -> dict[str, Any]:
  """The run.json dict; ValueError (naming the file): not a JSON object, or a newer format."""
  path = checkpoint_paths.as_path(path)
  try:
    run = json.loads(path.read_text())
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"{path}: cannot read the run description: {e}") from e
  if not isinstance(run, dict):
    raise ValueError(f"{path}: expected a JSON object")
  if not isinstance(run.get("format"), int) or run["format"] > FORMAT_VERSION:
    raise ValueError(f"{path}: format {run.get('format')!r}; this engine reads format "
                     f"{FORMAT_VERSION} or older")
  return run


def recorded_vocabulary_file(
    run_path: PathLike,
    run: Optional[Mapping[str, Any]] = None,
) -> Optional[pathlib.Path]:
  """The file of the recorded vocabulary with the recorded SHA-256 (the run's copy
  MODEL_DIR/vocab/spm.model, else the recorded path; either may be in an object store); None if
  none was recorded; ValueError (naming both and the hash) if neither matches."""
  run_path = checkpoint_paths.as_path(run_path)
  run = read(run_path) if run is None else run
  rec = run.get("vocabulary")
  if not rec:
    return None
  candidates = []
  if rec.get("copy"):
    candidates.append(run_path.parent / rec["copy"])
  if rec.get("path"):
    candidates.append(checkpoint_paths.as_path(rec["path"]))
  for c in candidates:
    if c.is_file() and hashlib.sha256(c.read_bytes()).hexdigest() == rec["sha256"]:
      return c
  raise ValueError(
      f"{run_path}: the run's vocabulary (sha256 {rec['sha256']}) is not available: "
      f"{' and '.join(str(c) for c in candidates) or 'no file recorded'} "
      f"{'is' if len(candidates) == 1 else 'are'} missing or different; restore "
      f"{run_path.parent / VOCAB_COPY} or set ${VOCAB_ENV} to a copy of the run's vocabulary")


def adopt_recorded_vocabulary(checkpoint_path: Optional[PathLike]) -> Optional[pathlib.Path]:
  """The file $MCWQ_VOCAB now names, or None: with the variable unset and a run.json at or above
  `checkpoint_path`, the run's vocabulary becomes the default of `vocab` and the SeqIO tasks.

  Call before the model and tasks are built. ValueError as `recorded_vocabulary_file`.
  """
  if checkpoint_path is None or os.environ.get(VOCAB_ENV):
    return None
  run_path = find(checkpoint_path)
  if run_path is None:
    return None
  path = recorded_vocabulary_file(run_path)
  if path is not None:
    logging.info("vocabulary: %s (recorded in %s; $%s was unset)", path, run_path, VOCAB_ENV)
    os.environ[VOCAB_ENV] = str(path)
    try:
      from mcwq_t5x.data import vocab  # pylint: disable=g-import-not-at-top
      vocab.clear_vocabulary_cache()
    except ImportError:  # no seqio: nothing cached either
      pass
  return path


def recorded_input_prefix(run: Mapping[str, Any]) -> Optional[dict[str, Optional[str]]]:
  """{task: input prefix} of a run.json dict (`write`'s `input_prefix`), None when it records none
  (a run.json written before the field existed)."""
  value = run.get("input_prefix")
  return dict(value) if isinstance(value, dict) else None


def same_vocabulary(identity: Mapping[str, Any], record: Mapping[str, Any]) -> bool:
  """True iff a `vocabulary_identity` is the vocabulary a run.json `record` names (the SHA-256 of
  the file and the extra ids)."""
  return (identity["sha256"] == record["sha256"] and
          int(identity["extra_ids"]) == int(record.get("extra_ids", 0)))


def check_model_vocabulary(vocabulary: Any,
                           model: Any,
                           where: str,
                           checkpoint_path: Optional[PathLike] = None) -> None:
  """Checks `vocabulary` fits the model's `T5Config.vocab_size` (`pipeline.check_vocab_size`) and,
  with `checkpoint_path`, is the one its run.json records (`check_vocabulary`).

  Raises:
    ValueError: vocabulary/model size mismatch (names both sizes and `where`).
    VocabularyMismatchError: not the recorded vocabulary (names both files).
  """
  size = getattr(getattr(getattr(model, "module", None), "config", None), "vocab_size", None)
  if size is not None:
    pipeline.check_vocab_size(vocabulary, size, where=where)
  if checkpoint_path is not None:
    check_vocabulary(vocabulary, checkpoint_path, where)


def check_vocabulary(vocabulary: Any, checkpoint_path: PathLike, where: str) -> None:
  """VocabularyMismatchError unless `vocabulary` (a seqio SentencePiece one; others unchecked) is
  the one the run.json at or above `checkpoint_path` records; it names both files, their SHA-256
  and how to use the recorded one. `where` says who asks."""
  run_path = find(checkpoint_path)
  if run_path is None:
    if checkpoint_paths.as_path(checkpoint_path).exists():
      logging.warning(
          "%s: no %s at or above %s (not a run of mcwq_t5x.train, or copied without it): "
          "cannot check that the vocabulary is the one it was trained with", where, RUN_JSON,
          checkpoint_path)
    return
  rec = read(run_path).get("vocabulary")
  ident = vocabulary_identity(vocabulary)
  if not rec or ident is None:
    return
  if same_vocabulary(ident, rec):
    return
  copy = run_path.parent / rec.get("copy", VOCAB_COPY)
  raise VocabularyMismatchError(
      f"{where}: the vocabulary {ident['path']} (sha256 {ident['sha256']}, extra_ids "
      f"{ident['extra_ids']}) is not the one {run_path.parent} was trained with: {rec['path']} "
      f"(sha256 {rec['sha256']}, extra_ids {rec.get('extra_ids', 0)}), recorded in {run_path} "
      f"and copied to {copy}. Its outputs would be nonsense. Unset ${VOCAB_ENV} (the mains then "
      f"use the recorded copy) or set {VOCAB_ENV}={copy}")
