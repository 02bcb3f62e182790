"""Export a checkpoint to a Hugging Face Transformers folder (inverse of `checkpoint_import`;
the command line is `python -m mcwq_t5x.export_hf`).

Input: any checkpoint `checkpoint_loaders.load_params` reads (this engine's Orbax checkpoints, T5X
native `checkpoint_N` folders, Hugging Face folders). The model config comes from, in order,
`--model_config` (a preset of `network.CONFIGS`) or `--gin_file`; the Hugging Face folder's
`config.json`; the run's `run.json` found at or above the checkpoint (a MODEL_DIR written by
`mcwq_t5x.train`, see `mcwq_t5x.checkpointing.run_info`); for runs from before run.json, the run's
`config.gin` (with a warning). The SentencePiece vocabulary comes from `--vocab`; the Hugging Face
folder's `spiece.model`; `--gin_file`; the vocabulary run.json records (its copy
MODEL_DIR/vocab/spm.model, checked against the recorded SHA-256); for older runs, their
config.gin (`EncoderDecoderModel.output_vocabulary`, else the `VOCABULARY` macro:
`vocab.get_vocabulary` / `vocab.mt5_vocabulary` / `seqio.SentencePieceVocabulary`; a `gs://`
path needs a local copy passed with `--vocab`). An explicit vocabulary (`--vocab`, `--gin_file`)
other than the one run.json records is an error naming both. The gin reader below
(`read_gin_config`) serves only `--gin_file` and those older runs.

Output folder, loadable with `transformers.MT5ForConditionalGeneration.from_pretrained(out)` for
the untied T5.1.1/mT5 layout and `transformers.T5ForConditionalGeneration` for T5 1.0's tied,
1/sqrt(d_model)-scaled output layer, and with `transformers.AutoTokenizer.from_pretrained(out)`:

  config.json             `hf_config` (model_type "mt5" untied / "t5" tied)
  model.safetensors       float32 state dict, names and transposes from the one table
                          `checkpoint_import.hf_name_map`
  generation_config.json  decoder_start_token_id 0, eos_token_id 1, pad_token_id 0 (T5), greedy,
                          max_new_tokens = the run's target feature length
                          (TASK_FEATURE_LENGTHS['targets'] of its config.gin; --max_new_tokens),
                          so a plain `model.generate(**inputs)` decodes as our `infer` does
  spiece.model            the SentencePiece model, unchanged
  tokenizer.json          the same tokenizer for the `tokenizers` library (transformers'
                          `SpmConverter`, which follows the model's own normalizer and BPE/unigram
                          settings) with `</s>` appended and the `<extra_id_N>` sentinels at the
                          ids seqio gives them (vocab_size - 1 - N)
  tokenizer_config.json, special_tokens_map.json

Files get ordinary modes (0644, folders 0755, less the umask). Loading and generating with
transformers 5 (no `text2text-generation` pipeline there):

  tok = transformers.AutoTokenizer.from_pretrained(out)
  model = transformers.MT5ForConditionalGeneration.from_pretrained(out)
  batch = tok(["Did M0 direct M1"], return_tensors="pt", padding=True)
  print(tok.batch_decode(model.generate(**batch), skip_special_tokens=True))

Importing the folder again (`checkpoint_loaders.load_params`) gives the exported params bit for
bit. Activations are float32 in transformers; a run trained with `dtype='bfloat16'` differs from
its export by bfloat16 rounding only.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import shutil
import tempfile
from typing import Any, Mapping, NamedTuple, Optional

from flax import traverse_util
import flax.linen as nn
import numpy as np

from mcwq_t5x.checkpointing import checkpoint_import
from mcwq_t5x.checkpointing import checkpoint_loaders
from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import run_info
from mcwq_t5x.engine import network

PathLike = str | os.PathLike

RUN_GIN_FILE = "config.gin"  # what `mcwq_t5x.train` writes into MODEL_DIR
PAD_ID, EOS_ID, DECODER_START_ID = 0, 1, 0  # T5 convention, used by `model.EncoderDecoderModel`
#: generation_config.json's max_new_tokens when no run config gives a target length (the paper's).
DEFAULT_MAX_NEW_TOKENS = 512

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
  """The Hugging Face `config.json` dict of a `network.T5Config`.

  Field mapping (inverse of `checkpoint_import.config_from_hf`): emb_dim->d_model,
  head_dim->d_kv, mlp_dim->d_ff, num_encoder_layers->num_layers, num_decoder_layers,
  num_heads, vocab_size, mlp_activations->feed_forward_proj, dropout_rate, layer_norm_epsilon,
  relative_attention_{num_buckets,max_distance}. `logits_via_embedding=False` -> model_type
  "mt5" / `MT5ForConditionalGeneration` with `tie_word_embeddings: false`; True -> "t5" /
  `T5ForConditionalGeneration` with `tie_word_embeddings: true` (transformers then ties
  `lm_head` to `shared` and scales the decoder output by d_model**-0.5, as T5 1.0).

  Raises:
    ValueError: activations transformers' T5 cannot express (e.g. ("gelu", "gelu")).
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
  """Hugging Face T5/mT5 state dict of `network.Transformer(config)` params.

  Inverse of `checkpoint_import.load_hf_checkpoint` through the same table
  (`checkpoint_import.hf_name_map`): kernels [in, out] become torch `Linear` weights [out, in],
  relative position tables [heads, buckets] become [buckets, heads]. No `lm_head.weight` for a
  tied config.

  Args:
    params: nested dict of arrays (T5X names, boxed or plain), shapes of
      `checkpoint_import.expected_param_shapes(config)`.
    config: the model config.
    source: name used in error messages.

  Returns:
    {HF key: C-contiguous float32 numpy array}.

  Raises:
    CheckpointMismatchError: params do not fit `config` (every offending parameter named).
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
# A gin config read without executing it (`--gin_file`, and runs from before run.json)
# ------------------------------------------------------------------------------------------------
class _Ref(NamedTuple):
  name: str  # e.g. "vocab.get_vocabulary" (scope included when given)
  evaluate: bool


class _Macro(NamedTuple):
  name: str


_REQUIRED = object()  # `%gin.REQUIRED`: a value a gin file leaves to the file including it


@dataclasses.dataclass(frozen=True)
class VocabularySpec:
  """Which SentencePiece model a run used.

  Attributes:
    path: the `.model` file (local path or URL), or None for the small offline model of
      `mcwq_t5x.data.vocab` (`$MCWQ_VOCAB` when set, as `vocab.get_vocabulary` does).
    extra_ids: sentinel ids appended after the model's pieces (seqio `extra_ids`).
    source: where the spec came from, for messages.
  """
  path: Optional[str]
  extra_ids: int
  source: str


@dataclasses.dataclass(frozen=True)
class RunConfig:
  """What a gin config says about the model and its vocabulary (None when it says nothing)."""
  model: Optional[network.T5Config]
  vocabulary: Optional[VocabularySpec]
  source: str
  target_length: Optional[int] = None  # TASK_FEATURE_LENGTHS['targets']: the decoding length


def _gin_statements(path: pathlib.Path, seen: tuple[pathlib.Path, ...] = ()) -> list[Any]:
  """Binding statements of a gin file and its includes, in order (imports are not executed)."""
  from gin import config_parser  # pylint: disable=g-import-not-at-top

  class Delegate(config_parser.ParserDelegate):

    def configurable_reference(self, scoped_configurable_name, evaluate):
      return _Ref(scoped_configurable_name, evaluate)

    def macro(self, macro_name):
      return _Macro(macro_name)

  path = path.resolve()
  if path in seen:
    raise ValueError(f"{path}: gin include cycle ({' -> '.join(map(str, seen + (path,)))})")
  try:
    text = path.read_text()
  except OSError as e:
    raise ValueError(f"{path}: cannot read gin file: {e}") from e
  out = []
  try:
    for statement in config_parser.ConfigParser(text, Delegate()):
      if isinstance(statement, config_parser.IncludeStatement):
        candidates = [pathlib.Path(statement.filename)]
        candidates += [d / statement.filename for d in [path.parent, *path.parents]]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
          raise ValueError(f"{path}: included gin file {statement.filename!r} not found "
                           f"(looked in the working directory and above {path.parent})")
        out.extend(_gin_statements(found, seen + (path,)))
      elif isinstance(statement, config_parser.BindingStatement):
        out.append(statement)
  except SyntaxError as e:
    raise ValueError(f"{path}: cannot parse gin config: {e}") from e
  return out


def _short(name: str) -> str:
  """'network.T5Config' -> 'T5Config' (gin's `config_str` writes the shortest unique name)."""
  return name.rsplit("/", 1)[-1].rsplit(".", 1)[-1]


def read_gin_config(path: PathLike) -> RunConfig:
  """Model config and vocabulary of a gin config (a run's `config.gin` or a gin file).

  Only the statements are parsed (gin's own parser): nothing is imported or executed, so any
  gin file of this project or T5X can be read without registering its configurables. Unscoped
  bindings count; later ones override earlier ones; `include`s are followed.

  Model: the configurable `Transformer.config` refers to (or the one bound): `T5Config` fields
  (`network.T5Config.emb_dim = 512` ...) or `get_config` (`name` = preset of `network.CONFIGS`,
  other arguments override its fields). Vocabulary: `EncoderDecoderModel.output_vocabulary`,
  else the `VOCABULARY` macro: `get_vocabulary(path=None, extra_ids=0)`,
  `mt5_vocabulary(path=vocab.MT5_VOCAB_PATH)` or
  `SentencePieceVocabulary(sentencepiece_model_file, extra_ids=0)`.

  Args:
    path: the gin file.

  Returns:
    A `RunConfig`; `model` / `vocabulary` are None when the file does not say.

  Raises:
    ValueError: unreadable or unparsable file, an undefined macro, a T5Config field or preset
      that does not exist, or a vocabulary configurable not listed above.
  """
  path = pathlib.Path(path)
  bindings: dict[tuple[str, str], Any] = {}  # (configurable short name, arg) -> value
  macros: dict[str, Any] = {}
  for st in _gin_statements(path):
    if st.scope:
      continue
    if not st.arg_name and "." not in st.selector:
      macros[st.selector] = st.value
    else:
      bindings[(_short(st.selector), st.arg_name)] = st.value

  def resolve(value: Any, depth: int = 0) -> Any:
    if depth > 50:
      raise ValueError(f"{path}: macro references nest too deep (a cycle?)")
    if isinstance(value, _Macro):
      if value.name == "gin.REQUIRED":
        return _REQUIRED
      if value.name not in macros:
        raise ValueError(f"{path}: macro %{value.name} is not defined")
      return resolve(macros[value.name], depth + 1)
    if isinstance(value, (list, tuple)) and not isinstance(value, _Ref):
      return type(value)(resolve(v, depth + 1) for v in value)
    if isinstance(value, dict):
      return {k: resolve(v, depth + 1) for k, v in value.items()}
    return value

  def args_of(configurable: str) -> dict[str, Any]:
    """Bound arguments of a configurable; those still `%gin.REQUIRED` keep their defaults."""
    out = {}
    for (name, arg), value in bindings.items():
      if name == configurable and arg:
        value = resolve(value)
        if value is not _REQUIRED:
          out[arg] = value
    return out

  # --- model ---
  ref = resolve(bindings.get(("Transformer", "config")))
  kind = _short(ref.name) if isinstance(ref, _Ref) else None
  t5_args, preset_args = args_of("T5Config"), args_of("get_config")
  model = None
  try:
    if kind == "get_config" or (kind is None and preset_args and not t5_args):
      if "name" not in preset_args:
        raise ValueError(f"{path}: get_config is used without a preset `name`")
      model = network.get_config(preset_args.pop("name"), **preset_args)
    elif kind == "T5Config" or t5_args:
      model = network.T5Config(**t5_args)
    elif kind is not None:
      raise ValueError(f"{path}: Transformer.config refers to {ref.name}, not a T5Config or "
                       "get_config")
  except (TypeError, KeyError) as e:
    raise ValueError(f"{path}: the model config does not fit network.T5Config: {e}") from e

  # --- vocabulary ---
  vocab_ref = resolve(
      bindings.get(("EncoderDecoderModel", "output_vocabulary"), macros.get("VOCABULARY")))
  vocabulary = None
  if isinstance(vocab_ref, _Ref):
    fn = _short(vocab_ref.name)
    args = args_of(fn)
    source = f"{path} ({vocab_ref.name})"
    if fn == "get_vocabulary":
      vocabulary = VocabularySpec(args.get("path"), int(args.get("extra_ids", 0)), source)
    elif fn == "mt5_vocabulary":
      from mcwq_t5x.data import vocab  # pylint: disable=g-import-not-at-top
      vocabulary = VocabularySpec(args.get("path") or vocab.MT5_VOCAB_PATH, 0, source)
    elif fn == "SentencePieceVocabulary":
      if "sentencepiece_model_file" not in args:
        raise ValueError(f"{source}: no sentencepiece_model_file bound")
      vocabulary = VocabularySpec(args["sentencepiece_model_file"], int(args.get("extra_ids", 0)),
                                  source)
    else:
      raise ValueError(f"{source}: unknown vocabulary configurable {vocab_ref.name!r} "
                       "(expected get_vocabulary, mt5_vocabulary or SentencePieceVocabulary)")
  elif vocab_ref is not None:
    raise ValueError(f"{path}: the output vocabulary is {vocab_ref!r}, not a configurable "
                     "reference")
  lengths = resolve(macros.get("TASK_FEATURE_LENGTHS"))
  target_length = lengths.get("targets") if isinstance(lengths, dict) else None
  if target_length is not None and not isinstance(target_length, int):
    raise ValueError(f"{path}: TASK_FEATURE_LENGTHS['targets'] is {target_length!r}, not an int")
  return RunConfig(model, vocabulary, str(path), target_length)


def find_run_gin(checkpoint: PathLike, levels: int = 3) -> Optional[pathlib.Path]:
  """The run's `config.gin` at the checkpoint path or up to `levels` folders above it.

  MODEL_DIR/config.gin covers MODEL_DIR, MODEL_DIR/checkpoints/<step>/state (ours) and
  MODEL_DIR/checkpoint_<step> (T5X).
  """
  p = pathlib.Path(checkpoint).absolute()
  for folder in [p, *p.parents][:levels + 1]:
    if (folder / RUN_GIN_FILE).is_file():
      return folder / RUN_GIN_FILE
  return None


# ------------------------------------------------------------------------------------------------
# Vocabulary and tokenizer files
# ------------------------------------------------------------------------------------------------
def vocabulary_file(spec: VocabularySpec) -> pathlib.Path:
  """The local SentencePiece model file of a `VocabularySpec`.

  The small offline model (path None) is located, and trained if it is not cached, exactly as
  `mcwq_t5x.data.vocab.get_vocabulary()` does for a run (`$MCWQ_VOCAB` first).

  Raises:
    ValueError: a remote (`gs://`...) or missing file (message says to pass `--vocab`).
  """
  path = spec.path
  if path is None:
    path = os.environ.get("MCWQ_VOCAB") or None
    if path is None:
      from mcwq_t5x.data import vocab  # pylint: disable=g-import-not-at-top
      return vocab.small_vocab_path()
  if "://" in str(path):
    raise ValueError(f"{spec.source}: vocabulary {path} is not a local file; pass --vocab "
                     "with a local copy of it")
  p = pathlib.Path(path)
  if not p.is_file():
    raise ValueError(f"{spec.source}: vocabulary file {p} does not exist; pass --vocab")
  return p


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
  """Writes spiece.model, tokenizer.json, tokenizer_config.json, special_tokens_map.json.

  `tokenizer.json` is built with transformers' `SpmConverter.build_tokenizer_from_spm_proto`
  (legacy dummy-prefix handling, which encodes as `SentencePieceProcessor.encode` does), then
  `</s>` is appended to every sequence (seqio/T5 add EOS) and sentinel `<extra_id_N>` gets id
  `pieces + extra_ids - 1 - N` (seqio's and HF's order). The tokenizer class is the generic
  `PreTrainedTokenizerFast` over `tokenizer.json`: transformers' own `T5Tokenizer` can only
  rebuild unigram models and would re-tokenise a BPE model such as the project's small one.

  Args:
    out_dir: existing output folder.
    spm_path: SentencePiece `.model` file (pad 0, eos 1, as T5).
    extra_ids: sentinels appended after the model's pieces.
    model_vocab_size: rows of the model's embedding.

  Returns:
    The tokenizer's size (pieces + extra_ids).

  Raises:
    ValueError: not a SentencePiece model, pad/eos ids other than 0/1, more ids than the
      embedding has rows, an unsupported model type, or transformers missing.
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
  tokenizer = build(proto, vocab, legacy=True)
  if tokenizer is None:
    raise ValueError(f"{spm_path}: transformers could not convert this SentencePiece model")
  sentinels = [f"<extra_id_{extra_ids - 1 - k}>" for k in range(extra_ids)]
  tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in sentinels])
  for k, s in enumerate(sentinels):
    if tokenizer.token_to_id(s) != num_pieces + k:
      raise ValueError(f"{spm_path}: sentinel {s} would get id {tokenizer.token_to_id(s)}, "
                       f"expected {num_pieces + k} (the model already has a piece {s}?)")
  eos, pad, unk = spec.eos_piece or "</s>", spec.pad_piece or "<pad>", spec.unk_piece or "<unk>"
  tokenizer.post_processor = processors.TemplateProcessing(
      single=["$A", eos], pair=["$A", eos, "$B", eos], special_tokens=[(eos, EOS_ID)])
  shutil.copyfile(spm_path, out_dir / "spiece.model")
  tokenizer.save(str(out_dir / "tokenizer.json"))
  special = {"eos_token": eos, "pad_token": pad, "unk_token": unk}
  if sentinels:
    special["additional_special_tokens"] = sentinels[::-1]  # <extra_id_0> first
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
                  max_new_tokens: Optional[int] = DEFAULT_MAX_NEW_TOKENS,
                  overwrite: bool = False) -> pathlib.Path:
  """Writes a Hugging Face folder for `params` of `network.Transformer(config)`.

  Everything is written into a temporary sibling folder that is renamed to `out_dir` at the
  end, so a failed export leaves no partial folder.

  Args:
    params: nested dict of arrays (T5X names).
    config: the model config.
    out_dir: folder to create.
    spm_path: SentencePiece model of the vocabulary.
    extra_ids: sentinels appended after its pieces.
    max_new_tokens: decoding length written to generation_config.json (the run's target feature
      length), so that a plain `generate()` decodes as far as the run did.
    overwrite: replace an existing non-empty `out_dir`.

  Returns:
    `out_dir` as a Path.

  Raises:
    CheckpointMismatchError: params do not fit `config`.
    ValueError: `out_dir` exists and is not empty (without `overwrite`), bad vocabulary,
      activations transformers cannot express.
  """
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  out_dir = pathlib.Path(out_dir)
  if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())) and not overwrite:
    raise ValueError(f"{out_dir}: exists and is not empty (pass --overwrite to replace it)")
  config_json = hf_config(config)  # fails early on activations HF cannot express
  state = to_hf_state_dict(params, config)
  out_dir.parent.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
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
    if out_dir.exists():
      shutil.rmtree(out_dir) if out_dir.is_dir() else out_dir.unlink()
    os.replace(tmp, out_dir)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return out_dir


def _check_against_run(spm_path: pathlib.Path, extra_ids: Optional[int],
                       run_path: Optional[pathlib.Path], run: Optional[Mapping[str, Any]],
                       flag: str) -> None:
  """An explicitly chosen vocabulary must be the one the run recorded (run.json).

  Raises:
    ValueError: another SHA-256 or other extra ids than recorded (names both files).
  """
  rec = (run or {}).get("vocabulary")
  if not rec:
    return
  import hashlib  # pylint: disable=g-import-not-at-top
  digest = hashlib.sha256(spm_path.read_bytes()).hexdigest()
  n_extra = int(rec.get("extra_ids", 0)) if extra_ids is None else int(extra_ids)
  if digest != rec["sha256"] or n_extra != int(rec.get("extra_ids", 0)):
    raise ValueError(
        f"{flag} {spm_path} (sha256 {digest}, extra_ids {n_extra}) is not the vocabulary the "
        f"checkpoint was trained with: {rec['path']} (sha256 {rec['sha256']}, extra_ids "
        f"{rec.get('extra_ids', 0)}), recorded in {run_path}; omit {flag} to use the run's copy "
        f"{run_path.parent / rec.get('copy', run_info.VOCAB_COPY)}")


def resolve_sources(
    checkpoint: PathLike,
    *,
    gin_file: Optional[PathLike] = None,
    model_config: Optional[str] = None,
    vocab: Optional[PathLike] = None,
    extra_ids: Optional[int] = None) -> tuple[network.T5Config, pathlib.Path, int, str]:
  """(model config, SentencePiece file, extra ids, where they came from) for a checkpoint.

  The decoding length comes from `decoding_length`.

  Order (see the module docstring): explicit arguments; the Hugging Face folder's own files;
  the run's `run.json` at or up to 3 folders above the checkpoint (`mcwq_t5x.checkpointing.run_info`: network
  config, the recorded vocabulary's copy); for older runs without it, the run's `config.gin`
  (with a warning). An explicit `--vocab` (or a `--gin_file` vocabulary) that differs from the
  one run.json records is an error.

  Raises:
    ValueError: not a checkpoint; no model config or no vocabulary found (the message says
      which flag to pass); a preset name that does not exist; an explicit vocabulary other than
      the recorded one; an unreadable run.json or a missing recorded vocabulary.
  """
  fmt, where = checkpoint_paths.locate(checkpoint)
  # A Hugging Face folder describes itself; other checkpoints have the run's run.json, or (runs
  # from before it) the run's gin config.
  run_path = None if fmt == checkpoint_paths.FORMAT_HF else run_info.find(where)
  run = run_info.read(run_path) if run_path is not None else None
  legacy_gin = None
  if fmt != checkpoint_paths.FORMAT_HF and run_path is None:
    legacy_gin = find_run_gin(where)
    if legacy_gin is not None:
      logging.warning(
          "%s: no %s (a run from before runs recorded themselves): reading the model config and "
          "vocabulary from %s", checkpoint, run_info.RUN_JSON, legacy_gin)
  gin_path = pathlib.Path(gin_file) if gin_file is not None else legacy_gin
  gin_run = read_gin_config(gin_path) if gin_path is not None else None
  gin_note = f"{gin_path} says nothing about it" if gin_path else (
      f"no {run_info.RUN_JSON} or {RUN_GIN_FILE} at or up to 3 folders above the checkpoint")
  notes = []
  if model_config is not None:
    if model_config not in network.CONFIGS:
      raise ValueError(f"--model_config {model_config!r}: not a preset; known: "
                       f"{sorted(network.CONFIGS)}")
    config, notes = network.CONFIGS[model_config], [f"model config preset {model_config}"]
  elif gin_file is not None and gin_run.model is not None:
    config, notes = gin_run.model, [f"model config from {gin_path}"]
  elif fmt == checkpoint_paths.FORMAT_HF:
    config = checkpoint_import.config_from_hf(where / "config.json")
    notes = [f"model config from {where / 'config.json'}"]
  elif run is not None:
    config, notes = run_info.network_config(run, run_path), [f"model config from {run_path}"]
  elif gin_run is not None and gin_run.model is not None:
    config, notes = gin_run.model, [f"model config from {gin_path}"]
  else:
    raise ValueError(f"{checkpoint}: no model config found ({gin_note}); pass --gin_file or "
                     "--model_config")
  hf_tokenizer_config = where / "tokenizer_config.json"
  recorded = (run or {}).get("vocabulary")
  if vocab is not None:
    spm_path, n_extra = pathlib.Path(vocab), extra_ids
    if not spm_path.is_file():
      raise ValueError(f"--vocab {spm_path}: no such file")
    if n_extra is None and recorded:
      n_extra = int(recorded.get("extra_ids", 0))
    elif n_extra is None and gin_run is not None and gin_run.vocabulary is not None:
      n_extra = gin_run.vocabulary.extra_ids
    _check_against_run(spm_path, n_extra, run_path, run, "--vocab")
    notes.append(f"vocabulary {spm_path}")
  elif fmt == checkpoint_paths.FORMAT_HF and (where / "spiece.model").is_file():
    spm_path, n_extra = where / "spiece.model", extra_ids
    if n_extra is None and hf_tokenizer_config.is_file():
      n_extra = _hf_extra_ids(hf_tokenizer_config)
    notes.append(f"vocabulary {spm_path}")
  elif gin_file is not None and gin_run.vocabulary is not None:
    spm_path = vocabulary_file(gin_run.vocabulary)
    n_extra = gin_run.vocabulary.extra_ids if extra_ids is None else extra_ids
    _check_against_run(spm_path, n_extra, run_path, run, f"--gin_file {gin_path}: vocabulary")
    notes.append(f"vocabulary {spm_path} (from {gin_run.vocabulary.source})")
  elif recorded:
    spm_path = run_info.recorded_vocabulary_file(run_path, run)
    n_extra = int(recorded.get("extra_ids", 0)) if extra_ids is None else extra_ids
    notes.append(f"vocabulary {spm_path} (recorded in {run_path})")
  elif gin_run is not None and gin_run.vocabulary is not None:
    spm_path = vocabulary_file(gin_run.vocabulary)
    n_extra = gin_run.vocabulary.extra_ids if extra_ids is None else extra_ids
    notes.append(f"vocabulary {spm_path} (from {gin_run.vocabulary.source})")
  else:
    where_looked = ("the Hugging Face folder has no spiece.model"
                    if fmt == checkpoint_paths.FORMAT_HF else
                    f"{run_path} records none" if run_path is not None else gin_note)
    raise ValueError(f"{checkpoint}: no vocabulary found ({where_looked}); pass --vocab PATH, "
                     "the SentencePiece model the checkpoint was trained with")
  return config, spm_path, int(n_extra or 0), "; ".join(notes)


def decoding_length(checkpoint: PathLike, gin_file: Optional[PathLike] = None) -> tuple[int, str]:
  """(max_new_tokens, where it came from) for the export of `checkpoint`: the run's target
  feature length (TASK_FEATURE_LENGTHS['targets'] of `gin_file` or the run's config.gin), a
  Hugging Face folder's own generation_config.json, else `DEFAULT_MAX_NEW_TOKENS`.

  Raises:
    ValueError: not a checkpoint, or an unreadable gin file.
  """
  fmt, where = checkpoint_paths.locate(checkpoint)
  gin_path = (
      pathlib.Path(gin_file) if gin_file is not None else
      None if fmt == checkpoint_paths.FORMAT_HF else find_run_gin(where))
  if gin_path is not None:
    length = read_gin_config(gin_path).target_length
    if length is not None:
      return length, f"TASK_FEATURE_LENGTHS['targets'] of {gin_path}"
  gen = where / "generation_config.json"
  if fmt == checkpoint_paths.FORMAT_HF and gen.is_file():
    length = json.loads(gen.read_text()).get("max_new_tokens")
    if isinstance(length, int):
      return length, str(gen)
  return DEFAULT_MAX_NEW_TOKENS, "the paper's target length (no run config says; --max_new_tokens)"


def export_checkpoint(checkpoint: PathLike,
                      out_dir: PathLike,
                      *,
                      gin_file: Optional[PathLike] = None,
                      model_config: Optional[str] = None,
                      vocab: Optional[PathLike] = None,
                      extra_ids: Optional[int] = None,
                      max_new_tokens: Optional[int] = None,
                      overwrite: bool = False) -> pathlib.Path:
  """Exports any checkpoint `checkpoint_loaders.load_params` reads to a Hugging Face folder.

  Args:
    checkpoint: checkpoint path (see `checkpoint_paths.locate`).
    out_dir: folder to create; must not be, contain or lie inside the checkpoint.
    gin_file, model_config, vocab, extra_ids: override the discovered sources
      (`resolve_sources`).
    max_new_tokens: decoding length for generation_config.json (default `decoding_length`).
    overwrite: replace an existing non-empty `out_dir`.

  Returns:
    `out_dir` as a Path.

  Raises:
    ValueError: bad input (message names the file/flag); CheckpointMismatchError: the
      checkpoint's params do not fit the model config (another architecture or size);
      IncompleteCheckpointError: a checkpoint array lacks data.
  """
  fmt, where = checkpoint_paths.locate(checkpoint)
  # The whole checkpoint: an Orbax state item lives in a step folder with other items.
  src = (where.parent if fmt == checkpoint_paths.FORMAT_ORBAX else where).resolve()
  dst = pathlib.Path(out_dir).resolve()
  if dst == src or dst in src.parents or src in dst.parents:
    raise ValueError(f"--out {out_dir}: must not be, contain or lie inside the checkpoint "
                     f"{src}")
  config, spm_path, n_extra, notes = resolve_sources(
      checkpoint, gin_file=gin_file, model_config=model_config, vocab=vocab, extra_ids=extra_ids)
  length_note = "--max_new_tokens"
  if max_new_tokens is None:
    max_new_tokens, length_note = decoding_length(checkpoint, gin_file)
  logging.info("exporting %s checkpoint %s: %s; generate() decodes up to %d tokens (%s)", fmt,
               where, notes, max_new_tokens, length_note)
  params = checkpoint_loaders.load_params(where, config).params
  out = export_params(
      params,
      config,
      out_dir,
      spm_path,
      n_extra,
      max_new_tokens=max_new_tokens,
      overwrite=overwrite)
  logging.info(
      "wrote %s (%s, %d parameters)", out,
      hf_config(config)["architectures"][0],
      sum(int(np.prod(s)) for s in checkpoint_import.expected_param_shapes(config).values()))
  return out
