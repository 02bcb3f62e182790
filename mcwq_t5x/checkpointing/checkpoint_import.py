"""Readers of pre-trained T5/mT5 weights into the `network.Transformer` tree.

Both return float32 numpy arrays with T5X's names, checked against `expected_param_shapes`
(`CheckpointMismatchError` names every missing, unexpected or mis-shaped parameter).
`load_hf_checkpoint`: a Hugging Face `(M)T5ForConditionalGeneration` folder (safetensors, or
`pytorch_model.bin` with torch), through `hf_name_map`, no rescaling (neither scales attention
logits); safetensors are read a tensor at a time, optionally placed as each is read.
`load_t5x_checkpoint`: a T5X-native `checkpoint_N/` (msgpack + TensorStore zarr, as under
gs://t5-data/pretrained_models/t5x/), local or in an object store (`checkpoint_paths.StorePath`),
`target` only. Arrays are read only from inside the checkpoint's folder, in the store it was
given (`_folder_spec`). Hugging Face folders are read from local files. Imports only the leaf
`checkpoint_paths`.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import pathlib
from typing import Any, Callable, Iterator, Mapping, Optional

from flax import serialization
from flax import traverse_util
import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.engine import network

PathLike = str | os.PathLike
Params = dict[str, Any]


class IncompleteCheckpointError(ValueError):
  """A checkpoint array lacks stored data (e.g. a deleted TensorStore chunk file)."""


def _name_all(names: list[str], limit: int = 50) -> str:
  """'a, b, c' for up to `limit` names, then '... and N more'."""
  shown = ", ".join(names[:limit])
  if len(names) > limit:
    shown += f", ... and {len(names) - limit} more"
  return shown


# ---------------------------------------------------------------------------
# Expected shapes and validation.
# ---------------------------------------------------------------------------
def expected_param_shapes(config: network.T5Config) -> dict[str, tuple]:
  """Flat {'a/b/kernel': shape} of `network.Transformer(config)` params (`jax.eval_shape`,
  cached)."""
  return dict(_expected_param_shapes(config))


@functools.lru_cache(maxsize=16)
def _expected_param_shapes(config: network.T5Config) -> tuple:
  module = network.Transformer(config)
  tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  shapes = jax.eval_shape(lambda rng, x: module.init(rng, x, x, x, enable_dropout=False),
                          jax.random.PRNGKey(0), tokens)
  flat = traverse_util.flatten_dict(nn.unbox(shapes["params"]), sep="/")
  return tuple((k, tuple(v.shape)) for k, v in flat.items())


def check_params(params: Mapping[str, Any],
                 config: network.T5Config,
                 source: str = "checkpoint") -> None:
  """CheckpointMismatchError naming every missing, unexpected and mis-shaped parameter (the first 50
  of each, then a count) unless `params` (T5X names) match `config` exactly."""
  expected = expected_param_shapes(config)
  got = {k: tuple(np.shape(v)) for k, v in traverse_util.flatten_dict(dict(params), sep="/").items()}
  missing = sorted(set(expected) - set(got))
  extra = sorted(set(got) - set(expected))
  wrong = [
      f"{name} has shape {got[name]}, the model expects {expected[name]}"
      for name in sorted(set(expected) & set(got))
      if expected[name] != got[name]
  ]
  problems = []
  if missing:
    problems.append(f"{len(missing)} parameter(s) missing: " +
                    _name_all([f"{name} (shape {expected[name]})" for name in missing]))
  if extra:
    problems.append(f"{len(extra)} unexpected parameter(s): " +
                    _name_all([f"{name} (shape {got[name]})" for name in extra]))
  if wrong:
    problems.append(f"{len(wrong)} parameter(s) of the wrong shape: " + _name_all(wrong))
  if problems:
    raise checkpoint_paths.CheckpointMismatchError(f"{source}: " + "; ".join(problems))


# ---------------------------------------------------------------------------
# Hugging Face.
# ---------------------------------------------------------------------------
# `model_type` values of Hugging Face configs this network reproduces.
HF_MODEL_TYPES = frozenset({"t5", "mt5"})

# Tensors a Hugging Face T5/mT5 state dict may hold besides the parameters:
# copies of `shared.weight` (torch `.bin` files save the tied embeddings of both
# stacks) and the cross-attention relative position table that old T5
# checkpoints carry but never use. {key: key it must equal, or None}.
HF_REDUNDANT_TENSORS = {
    "encoder.embed_tokens.weight": "shared.weight",
    "decoder.embed_tokens.weight": "shared.weight",
    "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight": None,
}


def config_from_hf(config: PathLike | Mapping[str, Any], **overrides: Any) -> network.T5Config:
  """T5Config of a Hugging Face T5/mT5 `config.json` (path or dict).

  d_model -> emb_dim, num_layers -> num_encoder_layers, d_kv -> head_dim, d_ff -> mlp_dim,
  feed_forward_proj "gated-gelu" -> ("gelu", "linear"), "relu" -> ("relu",), "gated-silu" ->
  ("silu", "linear"), others by name. Tied, scaled logits for "t5" unless `tie_word_embeddings:
  false` (T5.1.1) or `scale_decoder_outputs: false`; mT5 never. ValueError: unreadable, missing
  field, bad activation, another `model_type` (BART, UMT5: per-layer relative position tables).
  """
  if isinstance(config, (str, os.PathLike)):
    path = pathlib.Path(config)
    if path.is_dir():
      path = path / "config.json"
    try:
      cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
      raise ValueError(f"{path}: cannot read Hugging Face config: {e}") from e
    source = str(path)
  else:
    cfg = dict(config)
    source = "config"
  model_type = cfg.get("model_type", "t5")
  if model_type not in HF_MODEL_TYPES:
    archs = cfg.get("architectures") or []
    raise ValueError(
        f"{source}: model_type {model_type!r} ({', '.join(archs) or 'no architectures'}) is "
        f"not a T5/mT5 encoder-decoder; supported model types: {sorted(HF_MODEL_TYPES)}")
  proj = cfg.get("feed_forward_proj", "relu")
  acts = {
      "gated-gelu": ("gelu", "linear"),
      "gated-gelu_new": ("gelu", "linear"),
      "relu": ("relu",),
      "gated-silu": ("silu", "linear"),
      "gated-relu": ("relu", "linear"),
      "gelu": ("gelu",),
      "gelu_new": ("gelu",)
  }
  if proj not in acts:
    raise ValueError(f"{source}: unsupported feed_forward_proj {proj!r}")
  if model_type == "mt5":
    tied = False
  elif "scale_decoder_outputs" in cfg:
    tied = bool(cfg["scale_decoder_outputs"])
  else:
    tied = bool(cfg.get("tie_word_embeddings", True))
  try:
    kwargs = dict(
        vocab_size=int(cfg["vocab_size"]),
        emb_dim=int(cfg["d_model"]),
        num_heads=int(cfg["num_heads"]),
        num_encoder_layers=int(cfg["num_layers"]),
        num_decoder_layers=int(cfg.get("num_decoder_layers") or cfg["num_layers"]),
        head_dim=int(cfg["d_kv"]),
        mlp_dim=int(cfg["d_ff"]),
        mlp_activations=acts[proj],
        dropout_rate=float(cfg.get("dropout_rate", 0.1)),
        logits_via_embedding=tied,
        relative_attention_num_buckets=int(cfg.get("relative_attention_num_buckets", 32)),
        relative_attention_max_distance=int(cfg.get("relative_attention_max_distance", 128)),
        layer_norm_epsilon=float(cfg.get("layer_norm_epsilon", 1e-6)))
  except KeyError as e:
    raise ValueError(f"{source}: missing field {e.args[0]!r}") from e
  kwargs.update(overrides)
  return network.T5Config(**kwargs)


def hf_name_map(config: network.T5Config) -> dict[str, tuple[str, bool]]:
  """{T5X flat name: (HF state-dict key, transpose?)}, one entry per parameter: the one table of the
  import and the export (`export_hf`), transformers `modeling_t5.py` names.

  Torch `Linear` [out, in] vs T5X kernels [in, out] and HF's relative position table [buckets,
  heads] vs [heads, buckets] are transposed; embeddings and norm scales are stored alike; a tied
  config has no `lm_head.weight`.
  """
  m: dict[str, tuple[str, bool]] = {
      "token_embedder/embedding": ("shared.weight", False),
      "encoder/relpos_bias/rel_embedding":
          ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias"
           ".weight", True),
      "decoder/relpos_bias/rel_embedding":
          ("decoder.block.0.layer.0.SelfAttention.relative_attention_bias"
           ".weight", True),
      "encoder/encoder_norm/scale": ("encoder.final_layer_norm.weight", False),
      "decoder/decoder_norm/scale": ("decoder.final_layer_norm.weight", False),
  }
  if not config.logits_via_embedding:
    m["decoder/logits_dense/kernel"] = ("lm_head.weight", True)
  wis = (["wi"] if len(config.mlp_activations) == 1 else
         [f"wi_{i}" for i in range(len(config.mlp_activations))])

  def attn(t5x: str, hf: str):
    for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o")):
      m[f"{t5x}/{ours}/kernel"] = (f"{hf}.{theirs}.weight", True)

  def mlp(t5x: str, hf: str):
    for wi in wis + ["wo"]:
      m[f"{t5x}/{wi}/kernel"] = (f"{hf}.DenseReluDense.{wi}.weight", True)

  # Sub-layers of one block in Hugging Face order: (T5X sub-layer, its pre-norm, HF attention
  # module or None for the MLP).
  stacks = {
      "encoder":
          (config.num_encoder_layers, [("attention", "pre_attention_layer_norm", "SelfAttention"),
                                       ("mlp", "pre_mlp_layer_norm", None)]),
      "decoder": (config.num_decoder_layers, [
          ("self_attention", "pre_self_attention_layer_norm", "SelfAttention"),
          ("encoder_decoder_attention", "pre_cross_attention_layer_norm", "EncDecAttention"),
          ("mlp", "pre_mlp_layer_norm", None)
      ]),
  }
  for stack, (num_layers, sublayers) in stacks.items():
    for i in range(num_layers):
      for j, (sublayer, norm, hf_attention) in enumerate(sublayers):
        t, h = f"{stack}/layers_{i}", f"{stack}.block.{i}.layer.{j}"
        if hf_attention is None:
          mlp(f"{t}/{sublayer}", h)
        else:
          attn(f"{t}/{sublayer}", f"{h}.{hf_attention}")
        m[f"{t}/{norm}/scale"] = (f"{h}.layer_norm.weight", False)
  return m


def _hf_file(directory: pathlib.Path, entry: str, source: pathlib.Path) -> pathlib.Path:
  """`directory/entry` if it is a file name inside `directory` (a Hugging Face hub snapshot's links
  into its repository's `blobs/` included), else CheckpointOutsideFolderError naming `source`."""
  hub_blobs = [directory.parent.parent / "blobs"] if directory.parent.name == "snapshots" else []
  if not isinstance(entry, str) or not entry:
    raise checkpoint_paths.CheckpointOutsideFolderError(
        f"{source}: entry {entry!r} is no file name")
  try:
    checkpoint_paths.inside_folder(directory, entry, hub_blobs)
  except checkpoint_paths.CheckpointOutsideFolderError as e:
    raise checkpoint_paths.CheckpointOutsideFolderError(f"{source}: {e}") from None
  return directory / entry


# safetensors dtypes read as float32 (the format stores little-endian values).
_SAFETENSORS_DTYPES = {
    "F64": "<f8",
    "F32": "<f4",
    "F16": "<f2",
    "BF16": ml_dtypes.bfloat16,
    "I64": "<i8",
    "I32": "<i4",
    "I16": "<i2",
    "I8": "i1",
    "U64": "<u8",
    "U32": "<u4",
    "U16": "<u2",
    "U8": "u1",
    "BOOL": "?",
}
_BLOCK_BYTES = 16 << 20  # rows read per step: the only transient copy of a tensor


class _HFWeights:
  """The tensors of a Hugging Face folder, by state-dict key, read one row block at a time.

  `shapes` {key: stored shape} comes from the files' headers (nothing else is read up front);
  `source` names the first weight file. Safetensors data is read with plain file reads into the
  destination array: no mmap (whose pages would count towards RSS until closed) and no copy of the
  whole file. `pytorch_model.bin` (needs torch) is loaded whole as float32 numpy.
  """

  def __init__(self, directory: pathlib.Path):
    """Raises CheckpointOutsideFolderError (a file outside `directory`),
    UnreadableCheckpointFileError (malformed file or index), ValueError (no weight file)."""
    self.shapes: dict[str, tuple[int, ...]] = {}
    self._entries: dict[str, tuple[pathlib.Path, str, int]] = {}  # key: (file, dtype, offset)
    self._state: Optional[dict[str, np.ndarray]] = None
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    files: list[pathlib.Path] = []
    if single.is_file():
      files = [_hf_file(directory, single.name, single)]
    elif index.is_file():
      try:
        weight_map = json.loads(index.read_text())["weight_map"]
        shards = set(weight_map.values())
      except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise checkpoint_paths.UnreadableCheckpointFileError(
            f"{index}: cannot read safetensors index: {type(e).__name__}: {e}") from e
      files = sorted({_hf_file(directory, f, index) for f in shards})
    if files:
      for f in files:  # why: a key in several shards takes the last one's, as dict.update did
        self._read_header(f)
      self.source = str(files[0])
      return
    binary = directory / "pytorch_model.bin"
    if not binary.is_file():
      raise ValueError(f"{directory}: no model.safetensors, "
                       "model.safetensors.index.json or pytorch_model.bin")
    _hf_file(directory, binary.name, binary)
    try:
      import torch  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ValueError(f"{binary}: reading pytorch_model.bin needs torch; "
                       "convert it to safetensors or install torch") from e
    try:
      sd = torch.load(str(binary), map_location="cpu", weights_only=True)
      self._state = {k: v.float().numpy() for k, v in sd.items()}
    except Exception as e:  # why: malformed or refused pickles raise many types (UnpicklingError...)
      raise checkpoint_paths.UnreadableCheckpointFileError(
          f"{binary}: cannot read pytorch_model.bin: {type(e).__name__}: "
          f"{str(e).splitlines()[0] if str(e) else ''}") from e
    self.shapes = {k: tuple(v.shape) for k, v in self._state.items()}
    self.source = str(binary)

  def _read_header(self, f: pathlib.Path) -> None:
    """Adds the tensors of the safetensors file `f` (header validated by `safetensors`)."""
    from safetensors import safe_open  # pylint: disable=g-import-not-at-top
    try:
      with safe_open(str(f), framework="numpy"):  # why: the library's checks of the header
        pass
      with open(f, "rb") as fh:
        size = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(size))
      header.pop("__metadata__", None)
      for key, entry in header.items():
        self.shapes[key] = tuple(int(d) for d in entry["shape"])
        self._entries[key] = (f, entry["dtype"], 8 + size + int(entry["data_offsets"][0]))
    except Exception as e:  # safetensors raises its own error types.
      raise checkpoint_paths.UnreadableCheckpointFileError(
          f"{f}: cannot read safetensors file: {e}") from e

  def blocks(self, key: str) -> Iterator[tuple[int, int, np.ndarray]]:
    """(first row, end row, rows [end - first, ...] in the stored dtype) covering tensor `key`;
    each block is overwritten by the next. UnreadableCheckpointFileError: a short read."""
    shape = self.shapes[key]
    if self._state is not None:
      yield 0, shape[0] if shape else 1, self._state[key]
      return
    f, name, offset = self._entries[key]
    if name not in _SAFETENSORS_DTYPES:
      raise checkpoint_paths.UnreadableCheckpointFileError(
          f"{f}: cannot read safetensors file: tensor {key} has dtype {name}, not readable as "
          "float32")
    dtype = np.dtype(_SAFETENSORS_DTYPES[name])
    rows = shape[0] if shape else 1
    row_shape = shape[1:]
    row_bytes = dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
    step = max(1, _BLOCK_BYTES // max(row_bytes, 1))
    buf = np.empty((min(step, rows), *row_shape), dtype)
    with open(f, "rb", buffering=0) as fh:
      for r0 in range(0, rows, step):
        r1 = min(r0 + step, rows)
        block = buf[:r1 - r0]
        fh.seek(offset + r0 * row_bytes)
        _read_into(fh, block, f)
        yield r0, r1, block.reshape(shape) if not shape else block

  def read(self, key: str, transpose: bool) -> np.ndarray:
    """Tensor `key` as a new C-contiguous float32 array, transposed when `transpose`."""
    shape = self.shapes[key]
    out = _aligned_empty(shape[::-1] if transpose else shape)
    for r0, r1, block in self.blocks(key):
      if transpose:
        out.T[r0:r1] = block
      elif shape:
        out[r0:r1] = block
      else:
        out[...] = block
    return out

  def equal(self, a: str, b: str) -> bool:
    """np.array_equal of tensors `a` and `b` in their stored dtypes, a row block at a time."""
    if self.shapes[a] != self.shapes[b]:
      return False
    for (_, _, x), (_, _, y) in zip(self.blocks(a), self.blocks(b)):
      if not np.array_equal(x, y):
        return False
    return True


def _aligned_empty(shape: tuple[int, ...], alignment: int = 64) -> np.ndarray:
  """An uninitialised float32 array of `shape` whose data starts at a multiple of `alignment`
  bytes: `jax.device_put(..., may_alias=True)` on the CPU then adopts it without a copy (it copies
  less aligned arrays, which large `np.empty` ones are: 16 bytes past a page)."""
  nbytes = 4 * int(np.prod(shape, dtype=np.int64))
  raw = np.empty(nbytes + alignment, np.uint8)
  start = -raw.ctypes.data % alignment
  return raw[start:start + nbytes].view(np.float32).reshape(shape)


def _read_into(fh: Any, block: np.ndarray, f: pathlib.Path) -> None:
  """Fills C-contiguous `block` with the next bytes of the raw file `fh`; a short read (truncated
  file) is UnreadableCheckpointFileError naming `f`."""
  view = memoryview(block.reshape(-1).view(np.uint8))
  done = 0
  while done < len(view):
    n = fh.readinto(view[done:])
    if not n:
      raise checkpoint_paths.UnreadableCheckpointFileError(
          f"{f}: cannot read safetensors file: it ends before its tensors' data")
    done += n


def _hf_config_ties_embeddings(directory: pathlib.Path) -> bool:
  """True iff `directory/config.json` says `tie_word_embeddings: true` (transformers 5 writes
  it for every T5/mT5; transformers 4 wrote false for untied models)."""
  try:
    return json.loads((directory / "config.json").read_text()).get("tie_word_embeddings") is True
  except (OSError, json.JSONDecodeError):
    return False


def load_hf_checkpoint(path: PathLike,
                       config: Optional[network.T5Config] = None,
                       place: Optional[Callable[[str, np.ndarray], Any]] = None) -> Params:
  """Nested float32 numpy params in T5X layout from a Hugging Face T5/mT5 `save_pretrained` folder
  (or what `place(T5X flat name, float32 array)` makes of each, e.g. a device array).

  `config` default `config_from_hf(path/config.json)`. Names and shapes are checked from the files'
  headers before any parameter is read; then one parameter at a time is read (safetensors: in
  16 MiB row blocks, transposed as they land) and placed, so that the host peak of a safetensors
  folder is the finished tree plus one block. CheckpointMismatchError names the HF key and T5X
  parameter of each tensor missing (`shared.weight` stands for `lm_head.weight` only with
  `tie_word_embeddings: true`, as transformers), mis-shaped, unexpected, or a stored embedding copy
  differing from `shared.weight`. ValueError: unreadable files, another architecture, an
  object-store URL (UnreadableCheckpointFileError).
  """
  if checkpoint_paths.is_url(path):
    raise checkpoint_paths.UnreadableCheckpointFileError(
        f"{path}: a Hugging Face folder is read from local files only; copy it to this machine "
        f"(e.g. `gsutil cp -r {path} .`) and name the copy")
  directory = pathlib.Path(path)
  if config is None:
    config = config_from_hf(directory / "config.json")
  weights = _HFWeights(directory)
  source = weights.source
  expected = expected_param_shapes(config)
  name_map = hf_name_map(config)
  keys, missing, wrong = {}, [], []
  for name, (key, transpose) in name_map.items():
    if (key == "lm_head.weight" and key not in weights.shapes and
        "shared.weight" in weights.shapes and _hf_config_ties_embeddings(directory)):
      # transformers ties `lm_head` to `shared` (unscaled, for mT5 / T5.1.1) when the config
      # says `tie_word_embeddings: true` and the file has no lm_head.weight.
      logging.info(
          "%s: no lm_head.weight and tie_word_embeddings is true: the output layer "
          "is shared.weight, as transformers loads it", source)
      key = "shared.weight"
    if key not in weights.shapes:
      missing.append(f"{key} (parameter {name}, shape {expected[name]})")
      continue
    shape = weights.shapes[key][::-1] if transpose else weights.shapes[key]
    if shape != expected[name]:
      wrong.append(f"{key} -> {name} has shape {shape}, the model "
                   f"expects {expected[name]}")
      continue
    keys[name] = (key, transpose)
  copies = dict(HF_REDUNDANT_TENSORS)
  if config.logits_via_embedding:
    copies["lm_head.weight"] = "shared.weight"  # ignored by HF when tied
  used = {key for key, _ in name_map.values()}
  unexpected, differing = [], []
  for key in sorted(set(weights.shapes) - used):
    if key not in copies:
      unexpected.append(f"{key} (shape {weights.shapes[key]})")
    elif (copies[key] is not None and copies[key] in weights.shapes and
          not weights.equal(key, copies[key])):
      differing.append(key)
  problems = []
  if missing:
    problems.append(f"{len(missing)} tensor(s) missing: " + _name_all(missing))
  if wrong:
    problems.append(f"{len(wrong)} tensor(s) of the wrong shape: " + _name_all(wrong))
  if unexpected:
    problems.append(f"{len(unexpected)} tensor(s) the model has no parameter for (a "
                    f"config with {config.num_encoder_layers}+{config.num_decoder_layers} "
                    f"layers, {'tied' if config.logits_via_embedding else 'untied'} "
                    "output layer): " + _name_all(unexpected))
  if differing:
    problems.append("tensor(s) that should be copies of shared.weight differ from it "
                    f"(the model would not use them): {_name_all(differing)}")
  if problems:
    raise checkpoint_paths.CheckpointMismatchError(f"{source}: " + "; ".join(problems))
  flat = {}
  for name, (key, transpose) in keys.items():
    value = weights.read(key, transpose)
    flat[name] = place(name, value) if place is not None else value
    del value  # why: with a copying `place`, the host array goes before the next is read
  params = traverse_util.unflatten_dict(flat, sep="/")
  check_params(params, config, source)
  return params


# ---------------------------------------------------------------------------
# T5X native (msgpack + TensorStore zarr).
# ---------------------------------------------------------------------------
def _ts_read(spec: dict[str, Any], source: str, name: str) -> np.ndarray:
  """The TensorStore array of `spec` as numpy (its stored dtype); `source` and `name` for messages.

  IncompleteCheckpointError: a missing chunk without fill value (TensorStore would read zeros) or a
  shape other than the msgpack's; ValueError: unreadable.
  """
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  recorded = (spec.get("metadata") or {}).get("shape")
  open_spec = {k: v for k, v in spec.items() if k != "metadata"}
  context = checkpoint_paths.store_context()  # why: an object store's bounded retries
  try:
    store = ts.open(open_spec, open=True, context=context).result()
    metadata = store.spec().to_json().get("metadata", {})
    if "fill_value" in metadata and metadata["fill_value"] is None:
      store = ts.open({
          **open_spec, "fill_missing_data_reads": False
      }, open=True, context=context).result()
    if recorded is not None and list(store.shape) != list(recorded):
      raise IncompleteCheckpointError(f"{source}: array {name} has shape {tuple(store.shape)}, the "
                                      f"checkpoint recorded {tuple(recorded)}")
    return np.asarray(store.read().result())
  except IncompleteCheckpointError:
    raise
  except Exception as e:  # tensorstore raises ValueError/OSError variants.
    if "NOT_FOUND" in str(e) and "chunk" in str(e):
      raise IncompleteCheckpointError(
          f"{source}: array {name} is incomplete, a chunk file is missing "
          f"({e})") from e
    raise ValueError(f"{source}: cannot read TensorStore array {name}: "
                     f"{e}") from e


# TensorStore drivers a checkpoint's array spec may name: arrays (`driver`) and the stores under
# them (`kvstore.driver`). `gcs`/`gfile` specs are T5X's own writer's on a bucket: their path is
# relative to the checkpoint folder (T5X `_update_ts_path_from_relative_to_absolute`) and is read
# from that folder, in the store the checkpoint was given (a local folder, or its bucket); the
# bucket a spec names is never contacted.
T5X_ARRAY_DRIVERS = frozenset({"zarr", "zarr3"})
T5X_FILE_KVSTORES = frozenset({"file", "gcs", "gfile"})
# Spec keys that name no store (`context` could configure a remote one; anything unknown is refused).
_T5X_SPEC_KEYS = frozenset({"driver", "dtype", "kvstore", "metadata", "path", "transform"})


def _folder_kvstore(kv: Any, directory: Any, what: str) -> dict[str, Any]:
  """The kvstore spec of a file kvstore spec's path (dict or `file://` URL) inside `directory`,
  in `directory`'s store (`file`, or the `gcs`/`s3` bucket of a `StorePath`); raises
  CheckpointOutsideFolderError for any other store or a path leaving `directory`."""
  if isinstance(kv, str):  # a kvstore URL ("file:///x", "http://h/x") or a plain path
    scheme, sep, rest = kv.partition("://")
    if "|" in kv or (sep and scheme != "file"):  # why: `a|ocdbt:` / `http://` are other stores
      raise checkpoint_paths.CheckpointOutsideFolderError(f"{what} names the kvstore {kv!r}")
    kv = {"driver": "file", "path": rest if sep else kv}
  driver = kv.get("driver") if isinstance(kv, dict) else None
  if driver not in T5X_FILE_KVSTORES:
    raise checkpoint_paths.CheckpointOutsideFolderError(
        f"{what} names the kvstore driver {driver!r}; only files of the checkpoint's folder "
        f"({', '.join(sorted(T5X_FILE_KVSTORES))} paths in it) or ocdbt over them are read")
  path = str(kv.get("path", ""))
  try:
    return checkpoint_paths.kvstore_spec(checkpoint_paths.inside_folder(directory, path))
  except checkpoint_paths.CheckpointOutsideFolderError as e:
    raise checkpoint_paths.CheckpointOutsideFolderError(f"{what}: {e}") from None


def _spec_path(kv: dict[str, Any], scheme: Optional[str]) -> str:
  """The file or URL a kvstore spec of `_folder_kvstore` names (for messages)."""
  return f"{scheme}://{kv['bucket']}/{kv['path']}" if "bucket" in kv else kv["path"]


def _folder_spec(leaf: Any, directory: Any, source: Any, name: str) -> tuple[dict[str, Any], str]:
  """(TensorStore spec reading only data inside `directory`, the array's path) of a msgpack leaf.

  CheckpointOutsideFolderError (naming `source` and the array): another driver, an unknown spec
  key, or a path outside `directory` (symlinks and `..` resolved; in an object store, outside the
  folder of the bucket it was given).
  """
  what = f"{source}: array {name}"
  scheme = getattr(directory, "scheme", None)
  if isinstance(leaf, str):
    rel = leaf[len(checkpoint_paths.T5X_PLACEHOLDER):]
    kv = _folder_kvstore({"driver": "file", "path": rel}, directory, what)
    return {"driver": "zarr", "kvstore": kv}, _spec_path(kv, scheme)
  spec = json.loads(json.dumps(leaf))  # deep copy of plain data
  if spec.get("driver") not in T5X_ARRAY_DRIVERS:
    raise checkpoint_paths.CheckpointOutsideFolderError(
        f"{what} names the TensorStore driver {spec.get('driver')!r}; only "
        f"{', '.join(sorted(T5X_ARRAY_DRIVERS))} arrays are read")
  unknown = sorted(set(spec) - _T5X_SPEC_KEYS)
  if unknown:
    raise checkpoint_paths.CheckpointOutsideFolderError(f"{what} has the spec key(s) {unknown}; "
                                                        f"only {sorted(_T5X_SPEC_KEYS)} are read")
  kv = spec["kvstore"]
  inner = spec.pop("path", None)  # why: TensorStore appends a top-level path to the kvstore's
  if isinstance(kv, dict) and kv.get("driver") == "ocdbt":
    base = _folder_kvstore(kv.get("base"), directory, f"{what} (ocdbt base)")
    key = "/".join(p for p in (kv.get("path"), inner) if p)
    spec["kvstore"] = {"driver": "ocdbt", "base": base, "path": key}
    return spec, f"{_spec_path(base, scheme)}/{key}"
  if isinstance(kv, dict) and not kv.get("path"):
    kv = {**kv, "path": inner or name}  # why: T5X's spec may name the array only at top level
  elif inner:
    kv = ({**kv, "path": f"{kv['path']}/{inner}"} if isinstance(kv, dict) else f"{kv}/{inner}")
  spec["kvstore"] = _folder_kvstore(kv, directory, what)
  return spec, _spec_path(spec["kvstore"], scheme)


def _is_ref(x: Any) -> bool:
  return (isinstance(x, str) and
          x.startswith(checkpoint_paths.T5X_PLACEHOLDER)) or (isinstance(x, dict) and
                                                              "kvstore" in x and "driver" in x)


def load_t5x_checkpoint(path: PathLike, config: Optional[network.T5Config] = None) -> Params:
  """Nested float32 numpy params (`target`) of a T5X-native `checkpoint_N` folder or msgpack file.

  Raises CheckpointMismatchError (with `config`), IncompleteCheckpointError,
  CheckpointOutsideFolderError (nothing is read then), UnreadableCheckpointFileError (malformed
  msgpack), ObjectStoreError (a store that cannot be reached), ValueError (no `target`,
  unreadable arrays).
  """
  path = checkpoint_paths.as_path(path)
  msgpack_file = path if path.is_file() else path / checkpoint_paths.T5X_MSGPACK_FILE
  directory = msgpack_file.parent
  try:
    tree = serialization.msgpack_restore(msgpack_file.read_bytes())
  except checkpoint_paths.ObjectStoreError:
    raise
  except Exception as e:  # msgpack raises several error types.
    raise checkpoint_paths.UnreadableCheckpointFileError(
        f"{msgpack_file}: cannot read T5X msgpack: {e}") from e
  if isinstance(tree, dict) and "optimizer" in tree and "target" not in tree:
    tree = tree["optimizer"]
  if not isinstance(tree, dict) or "target" not in tree:
    keys = sorted(tree) if isinstance(tree, dict) else type(tree).__name__
    raise ValueError(f"{msgpack_file}: no 'target' params in checkpoint "
                     f"(top-level keys: {keys})")
  target = tree["target"]
  flat = traverse_util.flatten_dict(target, is_leaf=lambda k, x: _is_ref(x))
  specs = {  # why: every reference is checked before any array is read
      key: _folder_spec(leaf, directory, msgpack_file, "target." + ".".join(key))
      for key, leaf in flat.items()
      if _is_ref(leaf)
  }
  out = {}
  for key, leaf in flat.items():
    value = _ts_read(*specs[key], "target." + ".".join(key)) if key in specs else leaf
    out["/".join(key)] = np.asarray(value, dtype=np.float32)
  params = traverse_util.unflatten_dict(out, sep="/")
  if config is not None:
    check_params(params, config, str(msgpack_file))
  return params
