"""Exports a checkpoint to a Hugging Face Transformers folder (the inverse of `checkpoint_import`;
the command line is `python -m mcwq_t5x.export_hf`).

The network config, vocabulary and decoding length come from the run's `run.json` (`run_info`),
a Hugging Face folder's own files, or arguments (`model_config`, `vocab`, `max_new_tokens`; the
error names those missing); an argument overrides the checkpoint, except a vocabulary other than
run.json's, an error naming both. The folder loads with transformers'
`(M)T5ForConditionalGeneration` and `AutoTokenizer` (docs/export_hf.md) and imports back through
`checkpoint_loaders.load_params` to the exported params bit for bit.
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import logging
import os
import pathlib
import shutil
import socket
import tempfile
from typing import Any, Mapping, Optional

from flax import traverse_util
import flax.linen as nn
import numpy as np

from mcwq_t5x.checkpointing import checkpoint_import
from mcwq_t5x.checkpointing import checkpoint_loaders
from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import run_info
from mcwq_t5x.engine import network

PathLike = str | os.PathLike

PAD_ID, EOS_ID, DECODER_START_ID = 0, 1, 0  # T5 convention, used by `model.EncoderDecoderModel`

# (mlp_activations) -> HF `feed_forward_proj`. HF's "gated-gelu" and "gelu_new" are the tanh
# approximation of GELU, as `network._ACTIVATIONS["gelu"]`; HF's plain "gelu" is the exact one.
_FEED_FORWARD_PROJ = {
    ("gelu", "linear"): "gated-gelu",
    ("silu", "linear"): "gated-silu",
    ("relu", "linear"): "gated-relu",
    ("relu",): "relu",
    ("gelu",): "gelu_new",
    ("silu",): "silu",
}


# ------------------------------------------------------------------------------------------------
# Weights and config.json
# ------------------------------------------------------------------------------------------------
def hf_config(config: network.T5Config) -> dict[str, Any]:
  """The Hugging Face `config.json` dict of a `network.T5Config` (inverse of
  `checkpoint_import.config_from_hf`).

  emb_dim -> d_model, head_dim -> d_kv, mlp_dim -> d_ff, num_encoder_layers -> num_layers,
  mlp_activations -> feed_forward_proj, the others by name. `logits_via_embedding` False: "mt5"
  untied; True: "t5" tied (transformers scales the decoder output by d_model**-0.5, as T5 1.0).
  ValueError: activations transformers' T5 cannot express (("gelu", "gelu")).
  """
  acts = tuple(config.mlp_activations)
  if acts not in _FEED_FORWARD_PROJ:
    raise ValueError(f"mlp_activations {acts} have no Hugging Face feed_forward_proj; "
                     f"exportable: {sorted(_FEED_FORWARD_PROJ)}")
  tied = bool(config.logits_via_embedding)
  return {
      "architectures": ["T5ForConditionalGeneration" if tied else "MT5ForConditionalGeneration"],
      "model_type": "t5" if tied else "mt5",
      "vocab_size": int(config.vocab_size),
      "d_model": int(config.emb_dim),
      "d_kv": int(config.head_dim),
      "d_ff": int(config.mlp_dim),
      "num_layers": int(config.num_encoder_layers),
      "num_decoder_layers": int(config.num_decoder_layers),
      "num_heads": int(config.num_heads),
      "relative_attention_num_buckets": int(config.relative_attention_num_buckets),
      "relative_attention_max_distance": int(config.relative_attention_max_distance),
      "dropout_rate": float(config.dropout_rate),
      "layer_norm_epsilon": float(config.layer_norm_epsilon),
      "initializer_factor": 1.0,
      "feed_forward_proj": _FEED_FORWARD_PROJ[acts],
      "tie_word_embeddings": tied,
      "is_encoder_decoder": True,
      "use_cache": True,
      "pad_token_id": PAD_ID,
      "eos_token_id": EOS_ID,
      "decoder_start_token_id": DECODER_START_ID,
      "dtype": "float32",
  }


def to_hf_state_dict(params: Mapping[str, Any],
                     config: network.T5Config,
                     source: str = "params") -> dict[str, np.ndarray]:
  """{HF key: C-contiguous float32 numpy} of `params` (T5X names) via
  `checkpoint_import.hf_name_map`.

  Kernels [in, out] -> torch [out, in], relative position tables [heads, buckets] -> [buckets,
  heads]; no `lm_head.weight` when tied. CheckpointMismatchError names every offending parameter.
  """
  params = nn.unbox(dict(params))
  checkpoint_import.check_params(params, config, source)
  flat = traverse_util.flatten_dict(params, sep="/")
  state = {}
  for name, (key, transpose) in checkpoint_import.hf_name_map(config).items():
    value = np.asarray(flat[name], dtype=np.float32)
    state[key] = np.ascontiguousarray(value.T if transpose else value)
  return state


# ------------------------------------------------------------------------------------------------
# Tokenizer files
# ------------------------------------------------------------------------------------------------
def _sentencepiece_proto(path: pathlib.Path):
  from sentencepiece import sentencepiece_model_pb2  # pylint: disable=g-import-not-at-top
  try:
    proto = sentencepiece_model_pb2.ModelProto.FromString(path.read_bytes())
  except Exception as e:  # protobuf raises DecodeError; OSError for unreadable files.
    raise ValueError(f"{path}: not a SentencePiece model: {e}") from e
  if not proto.pieces:
    raise ValueError(f"{path}: not a SentencePiece model (no pieces)")
  return proto


def _hf_extra_ids(path: pathlib.Path) -> Optional[int]:
  """Sentinel count of a HF `tokenizer_config.json`: `extra_ids`, else the number of
  `<extra_id_N>` special tokens it lists (as this module writes it); None if it says neither."""
  try:
    cfg = json.loads(path.read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise ValueError(f"{path}: cannot read tokenizer config: {e}") from e
  if cfg.get("extra_ids") is not None:
    return int(cfg["extra_ids"])
  listed = (cfg.get("additional_special_tokens") or []) + (cfg.get("extra_special_tokens") or [])
  sentinels = {t for t in listed if isinstance(t, str) and t.startswith("<extra_id_")}
  return len(sentinels) if sentinels else None


def write_tokenizer(out_dir: PathLike, spm_path: PathLike, extra_ids: int,
                    model_vocab_size: int) -> int:
  """The tokenizer's size (pieces + `extra_ids`), after writing spiece.model, tokenizer.json,
  tokenizer_config.json and special_tokens_map.json into `out_dir`.

  `spm_path`: pad 0, eos 1 as T5; `model_vocab_size`: the embedding's rows. ValueError: not a
  SentencePiece model, other pad/eos ids, more ids than rows, word/char models, no transformers.
  """
  out_dir, spm_path = pathlib.Path(out_dir), pathlib.Path(spm_path)
  proto = _sentencepiece_proto(spm_path)
  spec = proto.trainer_spec
  num_pieces = len(proto.pieces)
  size = num_pieces + int(extra_ids)
  if spec.pad_id != PAD_ID or spec.eos_id != EOS_ID:
    raise ValueError(f"{spm_path}: pad id {spec.pad_id} and eos id {spec.eos_id}; T5 models "
                     f"need pad {PAD_ID} and eos {EOS_ID}")
  if size > model_vocab_size:
    raise ValueError(f"{spm_path}: {num_pieces} pieces + {extra_ids} extra ids = {size} ids, "
                     f"more than the model's {model_vocab_size} embedding rows (wrong "
                     "vocabulary for this checkpoint?)")
  try:
    from tokenizers import AddedToken  # pylint: disable=g-import-not-at-top
    from tokenizers import processors  # pylint: disable=g-import-not-at-top
    from transformers.convert_slow_tokenizer import (  # pylint: disable=g-import-not-at-top
        SpmConverter)
  except ImportError as e:
    raise ValueError(f"writing tokenizer.json needs transformers and tokenizers: {e}") from e
  build = getattr(SpmConverter, "build_tokenizer_from_spm_proto", None)
  if build is None:
    raise ValueError("writing tokenizer.json needs transformers' "
                     "SpmConverter.build_tokenizer_from_spm_proto (transformers 5)")
  if spec.model_type == 2:  # BPE: {piece: id}; merges derived from the piece scores
    vocab: Any = {p.piece: i for i, p in enumerate(proto.pieces)}
  elif spec.model_type == 1:  # unigram: [(piece, score)]
    vocab = [(p.piece, p.score) for p in proto.pieces]
  else:
    raise ValueError(f"{spm_path}: SentencePiece model type {spec.model_type} (word/char) is "
                     "not supported; expected unigram or BPE")
  # Legacy dummy-prefix handling encodes as `SentencePieceProcessor.encode` does.
  tokenizer = build(proto, vocab, legacy=True)
  if tokenizer is None:
    raise ValueError(f"{spm_path}: transformers could not convert this SentencePiece model")
  # `<extra_id_N>` gets id pieces + extra_ids - 1 - N: seqio's and HF's order.
  sentinels = [f"<extra_id_{extra_ids - 1 - k}>" for k in range(extra_ids)]
  tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in sentinels])
  for k, s in enumerate(sentinels):
    if tokenizer.token_to_id(s) != num_pieces + k:
      raise ValueError(f"{spm_path}: sentinel {s} would get id {tokenizer.token_to_id(s)}, "
                       f"expected {num_pieces + k} (the model already has a piece {s}?)")
  eos, pad, unk = spec.eos_piece or "</s>", spec.pad_piece or "<pad>", spec.unk_piece or "<unk>"
  # seqio/T5 append EOS to every sequence.
  tokenizer.post_processor = processors.TemplateProcessing(
      single=["$A", eos], pair=["$A", eos, "$B", eos], special_tokens=[(eos, EOS_ID)])
  shutil.copyfile(spm_path, out_dir / "spiece.model")
  tokenizer.save(str(out_dir / "tokenizer.json"))
  special = {"eos_token": eos, "pad_token": pad, "unk_token": unk}
  if sentinels:
    special["additional_special_tokens"] = sentinels[::-1]  # <extra_id_0> first
  # why not `T5Tokenizer`: it rebuilds unigram models only and would re-tokenise a BPE model such as
  # our small one.
  tokenizer_config = {
      "tokenizer_class": "PreTrainedTokenizerFast",
      **special, "clean_up_tokenization_spaces": False,
      "model_max_length": 1 << 30
  }
  _write_json(out_dir / "tokenizer_config.json", tokenizer_config)
  _write_json(out_dir / "special_tokens_map.json", special)
  return size


def _write_json(path: pathlib.Path, obj: Any) -> None:
  path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


# The files `export_params` writes: a folder holding nothing else is a previous export, the only
# kind of folder `overwrite` replaces.
EXPORT_FILES = ("config.json", "model.safetensors", "generation_config.json", "spiece.model",
                "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def check_replaceable(out_dir: pathlib.Path, overwrite: bool) -> None:
  """Raises ValueError unless `out_dir` is absent, empty, or (with `overwrite`) a folder holding
  only `EXPORT_FILES`; the message names what else is there."""
  if not out_dir.exists() and not out_dir.is_symlink():
    return
  if out_dir.is_symlink() or not out_dir.is_dir():  # why: never replace a file or a link's target
    raise ValueError(f"{out_dir}: exists and is not a folder; choose another --out")
  entries = sorted(out_dir.iterdir())
  if not entries:
    return
  if not overwrite:
    raise ValueError(f"{out_dir}: exists and is not empty (pass --overwrite to replace a "
                     "previous export)")
  other = [
      e.name + ("/" if e.is_dir() else "")
      for e in entries
      if e.name not in EXPORT_FILES or e.is_symlink() or not e.is_file()
  ]
  if other:
    shown = ", ".join(other[:10]) + (f", ... and {len(other) - 10} more" if len(other) > 10 else "")
    raise ValueError(f"{out_dir}: --overwrite replaces only a previous export (a folder holding "
                     f"nothing but {', '.join(EXPORT_FILES)}), but it also holds {len(other)} "
                     f"other entr{'y' if len(other) == 1 else 'ies'}: {shown}; nothing was "
                     "changed. Choose another --out, or remove them yourself")


def _tmp_prefix(out_dir: pathlib.Path) -> str:
  """Prefix of this process's temporary export folders beside `out_dir`: the host and process id
  name their owner, so that `remove_stale_tmp` knows when a killed export left one."""
  return f".{out_dir.name}.tmp-{socket.gethostname()}-{os.getpid()}-"


def remove_stale_tmp(out_dir: pathlib.Path) -> list[pathlib.Path]:
  """The temporary folders beside `out_dir` a killed export on this host left (names from
  `_tmp_prefix`, their process gone), removed."""
  removed = []
  prefix = f".{out_dir.name}.tmp-{socket.gethostname()}-"
  for tmp in out_dir.parent.glob(glob.escape(prefix) + "*"):
    pid = tmp.name[len(prefix):].split("-", 1)[0]
    if not pid.isdigit() or not tmp.is_dir() or tmp.is_symlink():
      continue
    try:
      os.kill(int(pid), 0)  # why: signal 0 only asks whether the process exists
      continue
    except ProcessLookupError:
      pass
    except PermissionError:  # another user's live process
      continue
    shutil.rmtree(tmp, ignore_errors=True)
    logging.info("removed %s, left by export process %s that no longer runs", tmp, pid)
    removed.append(tmp)
  return removed


def _normal_permissions(folder: pathlib.Path) -> None:
  """Gives `folder` and its files the modes of ordinary `mkdir` and `open` (0777 / 0666 less the
  umask: 0755 / 0644 under the usual 022) instead of `mkdtemp`'s 0700 and safetensors' 0600."""
  umask = os.umask(0)
  os.umask(umask)
  for path in [folder, *folder.rglob("*")]:
    path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


# ------------------------------------------------------------------------------------------------
# Export
# ------------------------------------------------------------------------------------------------
def export_params(params: Mapping[str, Any],
                  config: network.T5Config,
                  out_dir: PathLike,
                  spm_path: PathLike,
                  extra_ids: int = 0,
                  *,
                  max_new_tokens: int,
                  overwrite: bool = False) -> pathlib.Path:
  """`out_dir`, a Hugging Face folder for `params` of `network.Transformer(config)`, written whole
  (a temporary sibling renamed; modes 0644/0755 less the umask).

  Files: config.json (`hf_config`), model.safetensors (float32, `checkpoint_import.hf_name_map`),
  generation_config.json (decoder_start 0, eos 1, pad 0, greedy, `max_new_tokens`: `generate`
  decodes as our `infer`), spiece.model, tokenizer.json and its configs (`write_tokenizer`).
  `overwrite` replaces a previous export (`EXPORT_FILES` only). Activations are float32 in
  transformers (bfloat16 runs differ by rounding). Raises CheckpointMismatchError, ValueError
  (`out_dir` not empty or not an export, bad vocabulary or activations, `max_new_tokens` < 1).
  """
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  out_dir = pathlib.Path(out_dir)
  if isinstance(max_new_tokens,
                bool) or int(max_new_tokens) != max_new_tokens or max_new_tokens < 1:
    raise ValueError(f"max_new_tokens {max_new_tokens!r}: expected a positive integer")
  check_replaceable(out_dir, overwrite)
  config_json = hf_config(config)  # fails early on activations HF cannot express
  state = to_hf_state_dict(params, config)
  out_dir.parent.mkdir(parents=True, exist_ok=True)
  remove_stale_tmp(out_dir)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=_tmp_prefix(out_dir), dir=out_dir.parent))
  try:
    write_tokenizer(tmp, spm_path, extra_ids, config.vocab_size)
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    del state
    _write_json(tmp / "config.json", config_json)
    _write_json(
        tmp / "generation_config.json", {
            "decoder_start_token_id": DECODER_START_ID,
            "eos_token_id": EOS_ID,
            "pad_token_id": PAD_ID,
            "max_new_tokens": int(max_new_tokens),
            "num_beams": 1,
            "do_sample": False
        })
    _normal_permissions(tmp)
    check_replaceable(out_dir, overwrite)  # why: again, a file may have appeared meanwhile
    if out_dir.exists():
      old = pathlib.Path(tempfile.mkdtemp(prefix=_tmp_prefix(out_dir), dir=out_dir.parent))
      os.replace(out_dir, old)  # why: the previous export stays whole until the new one is in
      os.replace(tmp, out_dir)
      shutil.rmtree(old)
    else:
      os.replace(tmp, out_dir)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return out_dir


@dataclasses.dataclass(frozen=True)
class Sources:
  """What an export writes besides the weights: `config`, `spm_path`, `extra_ids`, `max_new_tokens`,
  and `notes` saying where each came from ("model config from .../run.json; ...")."""
  config: network.T5Config
  spm_path: pathlib.Path
  extra_ids: int
  max_new_tokens: int
  notes: str


def model_config_argument(value: str) -> network.T5Config:
  """The `T5Config` `--model_config` names: a preset of `network.CONFIGS`, or a JSON file of
  `T5Config` fields or a run.json. ValueError names the file or lists the presets."""
  if value in network.CONFIGS:
    return network.CONFIGS[value]
  path = pathlib.Path(value)
  if not path.is_file():
    raise ValueError(f"--model_config {value!r}: neither a preset of network.CONFIGS "
                     f"({', '.join(sorted(network.CONFIGS))}) nor a JSON file")
  try:
    obj = json.loads(path.read_text(encoding="utf-8"))
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"--model_config {path}: cannot read the JSON: {e}") from e
  if not isinstance(obj, dict):
    raise ValueError(f"--model_config {path}: expected a JSON object of network.T5Config fields")
  return run_info.network_config(obj if "network" in obj else {"network": obj}, path)


def _check_against_run(spm_path: pathlib.Path, extra_ids: int, run_path: pathlib.Path,
                       run: Mapping[str, Any]) -> None:
  """ValueError (naming both files) if the chosen vocabulary's SHA-256 or extra ids differ from
  run.json's."""
  rec = run.get("vocabulary")
  if not rec:
    return
  digest = hashlib.sha256(spm_path.read_bytes()).hexdigest()
  if not run_info.same_vocabulary({"sha256": digest, "extra_ids": extra_ids}, rec):
    raise ValueError(
        f"--vocab {spm_path} (sha256 {digest}, extra_ids {extra_ids}) is not the vocabulary the "
        f"checkpoint was trained with: {rec['path']} (sha256 {rec['sha256']}, extra_ids "
        f"{rec.get('extra_ids', 0)}), recorded in {run_path}; omit --vocab to use the run's copy "
        f"{run_path.parent / rec.get('copy', run_info.VOCAB_COPY)}")


def resolve_sources(checkpoint: PathLike,
                    *,
                    model_config: Optional[str] = None,
                    vocab: Optional[PathLike] = None,
                    extra_ids: Optional[int] = None,
                    max_new_tokens: Optional[int] = None) -> Sources:
  """The `Sources` of `checkpoint`: the arguments, else a Hugging Face folder's own files, else the
  run.json at or up to 3 folders above it (`run_info.find`).

  `extra_ids` default: as recorded, else 0. Raises ValueError (a part neither given nor recorded:
  one line naming the flags; another vocabulary than recorded; an unreadable run.json or a missing
  recorded vocabulary; a bad `model_config`), NotACheckpointError.
  """
  fmt, where = checkpoint_paths.locate(checkpoint)
  hf_folder = fmt == checkpoint_paths.FORMAT_HF
  run_path = None if hf_folder else run_info.find(where)
  run = run_info.read(run_path) if run_path is not None else {}
  notes = []
  missing = []  # (flag to pass, what the checkpoint's own files lack)

  config = None
  if model_config is not None:
    config = model_config_argument(model_config)
    notes.append(f"model config {model_config}")
  elif hf_folder:
    config = checkpoint_import.config_from_hf(where / "config.json")
    notes.append(f"model config from {where / 'config.json'}")
  elif run:
    config = run_info.network_config(run, run_path)
    notes.append(f"model config from {run_path}")
  else:
    missing.append(("--model_config (a preset or a JSON file of network.T5Config fields)", ""))

  spm_path, recorded = None, run.get("vocabulary")
  if vocab is not None:
    spm_path = pathlib.Path(vocab)
    if not spm_path.is_file():
      raise ValueError(f"--vocab {spm_path}: no such file")
    if extra_ids is None:
      extra_ids = int(recorded.get("extra_ids", 0)) if recorded else 0
    if run:
      _check_against_run(spm_path, extra_ids, run_path, run)
    notes.append(f"vocabulary {spm_path}")
  elif hf_folder and (where / "spiece.model").is_file():
    spm_path = where / "spiece.model"
    if extra_ids is None and (where / "tokenizer_config.json").is_file():
      extra_ids = _hf_extra_ids(where / "tokenizer_config.json")
    notes.append(f"vocabulary {spm_path}")
  elif recorded:
    spm_path = run_info.recorded_vocabulary_file(run_path, run)
    if extra_ids is None:
      extra_ids = int(recorded.get("extra_ids", 0))
    notes.append(f"vocabulary {spm_path} (recorded in {run_path})")
  else:
    missing.append(("--vocab (the SentencePiece model the checkpoint was trained with)",
                    "spiece.model" if hf_folder else "vocabulary"))

  length_note = "--max_new_tokens"
  if max_new_tokens is None:
    generation = where / "generation_config.json"
    recorded_lengths = run.get("feature_lengths") or {}
    if recorded_lengths.get("targets"):
      max_new_tokens = int(recorded_lengths["targets"])
      length_note = f"feature_lengths['targets'] of {run_path}"
    elif hf_folder and generation.is_file():
      try:
        max_new_tokens = json.loads(generation.read_text()).get("max_new_tokens")
      except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{generation}: cannot read the generation config: {e}") from e
      length_note = str(generation)
    if max_new_tokens is None:
      missing.append(("--max_new_tokens (the decoding length, e.g. the run's target length)",
                      "max_new_tokens in generation_config.json"
                      if hf_folder else "feature_lengths['targets']"))
  notes.append(f"generate() decodes up to {max_new_tokens} tokens ({length_note})")

  if missing:
    lacking = " or ".join(what for _, what in missing)
    if hf_folder:
      why = f"the Hugging Face folder has no {lacking}"
    elif run_path is not None:
      why = f"{run_path} records no {lacking}"
    else:
      why = (f"no {run_info.RUN_JSON} at or up to 3 folders above it (a run of mcwq_t5x.train "
             "writes one) says how it was trained")
    raise ValueError(f"{checkpoint}: {why}; pass {', '.join(flag for flag, _ in missing)}")
  return Sources(config, spm_path, int(extra_ids or 0), int(max_new_tokens), "; ".join(notes))


def export_checkpoint(checkpoint: PathLike,
                      out_dir: PathLike,
                      *,
                      model_config: Optional[str] = None,
                      vocab: Optional[PathLike] = None,
                      extra_ids: Optional[int] = None,
                      max_new_tokens: Optional[int] = None,
                      overwrite: bool = False) -> pathlib.Path:
  """`out_dir` (a Path): any checkpoint `checkpoint_loaders.load_params` reads, exported to Hugging
  Face.

  `out_dir` must not be, contain or lie inside the checkpoint; the other arguments override it
  (`resolve_sources`, `export_params`). Raises ValueError (names the file or flag),
  CheckpointMismatchError, IncompleteCheckpointError, NotACheckpointError.
  """
  fmt, where = checkpoint_paths.locate(checkpoint)
  # The whole checkpoint: an Orbax state item lives in a step folder with other items.
  src = (where.parent if fmt == checkpoint_paths.FORMAT_ORBAX else where).resolve()
  dst = pathlib.Path(out_dir).resolve()
  if dst == src or dst in src.parents or src in dst.parents:
    raise ValueError(f"--out {out_dir}: must not be, contain or lie inside the checkpoint "
                     f"{src}")
  check_replaceable(pathlib.Path(out_dir), overwrite)  # why: before the checkpoint is loaded
  sources = resolve_sources(
      checkpoint,
      model_config=model_config,
      vocab=vocab,
      extra_ids=extra_ids,
      max_new_tokens=max_new_tokens)
  logging.info("exporting %s checkpoint %s: %s", fmt, where, sources.notes)
  params = checkpoint_loaders.load_params(where, sources.config).params
  return export_params(
      params,
      sources.config,
      out_dir,
      sources.spm_path,
      sources.extra_ids,
      max_new_tokens=sources.max_new_tokens,
      overwrite=overwrite)


def summary(out_dir: PathLike) -> str:
  """One line on an exported folder ("wrote exported/tiny: MT5ForConditionalGeneration (1,234,567
  parameters), its tokenizer, generation_config.json (greedy, up to 64 new tokens)").

  Raises ValueError (no T5/mT5 config.json), OSError / json.JSONDecodeError.
  """
  out_dir = pathlib.Path(out_dir)
  config = checkpoint_import.config_from_hf(out_dir / "config.json")
  parameters = sum(
      int(np.prod(s)) for s in checkpoint_import.expected_param_shapes(config).values())
  generation = json.loads((out_dir / "generation_config.json").read_text())
  return (f"wrote {out_dir}: {hf_config(config)['architectures'][0]} ({parameters:,} parameters), "
          f"its tokenizer, generation_config.json (greedy, up to "
          f"{generation['max_new_tokens']} new tokens)")
