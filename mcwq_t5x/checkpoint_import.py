# Copyright 2026 The mcwq-t5x Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

"""Import pre-trained T5/mT5 weights into the `network.Transformer` tree.

Two formats are read, both returning the same nested dict of float32 numpy
arrays keyed by T5X's parameter names (`token_embedder/embedding`,
`encoder/layers_0/attention/query/kernel`, ...):

* Hugging Face (`config.json` + `model.safetensors`, or `pytorch_model.bin`
  when torch is installed) of `T5ForConditionalGeneration` /
  `MT5ForConditionalGeneration`. Torch `Linear` weights are [out, in]; T5X
  kernels are [in, out], so every kernel is transposed; the relative position
  table [buckets, heads] becomes [heads, buckets]. No rescaling is needed: HF
  T5 and T5X both leave the attention logits unscaled.
* T5X native checkpoints (a `checkpoint_N/` directory as published under
  gs://t5-data/pretrained_models/t5x/): a msgpack file `checkpoint` holding
  the train state `{"target": params, "state": optimizer state}`, where large
  arrays are replaced by a reference to a TensorStore zarr array stored in a
  sub-directory named after the flattened path (`target.encoder.layers_0...`).
  The reference is either a TensorStore spec dict (T5X's own writer; the
  kvstore path is relative to the checkpoint directory) or a string
  `PLACEHOLDER://target.encoder...` (Orbax-style writer). Only `target` is
  read; the optimizer state is ignored.

Every import is checked against the parameter shapes of
`network.Transformer(config)`: a missing, unexpected or mis-shaped parameter
raises `CheckpointMismatchError` naming it.
"""

from __future__ import annotations

import functools
import json
import os
import pathlib
from typing import Any, Mapping, Optional

from flax import serialization
from flax import traverse_util
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mcwq_t5x import network

PathLike = str | os.PathLike
Params = dict[str, Any]

_PLACEHOLDER = "PLACEHOLDER://"
T5X_CHECKPOINT_FILE = "checkpoint"


class CheckpointMismatchError(ValueError):
  """A checkpoint's parameter names or shapes do not match the model."""


# ---------------------------------------------------------------------------
# Expected shapes and validation.
# ---------------------------------------------------------------------------
def expected_param_shapes(config: network.T5Config) -> dict[str, tuple]:
  """Flat {'a/b/kernel': shape} of `network.Transformer(config)` params.

  Computed with `jax.eval_shape`, so nothing is allocated (cached per config).
  """
  return dict(_expected_param_shapes(config))


@functools.lru_cache(maxsize=16)
def _expected_param_shapes(config: network.T5Config) -> tuple:
  module = network.Transformer(config)
  tokens = jax.ShapeDtypeStruct((1, 1), jnp.int32)
  shapes = jax.eval_shape(
      lambda rng, x: module.init(rng, x, x, x, enable_dropout=False),
      jax.random.PRNGKey(0), tokens)
  flat = traverse_util.flatten_dict(nn.unbox(shapes["params"]), sep="/")
  return tuple((k, tuple(v.shape)) for k, v in flat.items())


def check_params(params: Mapping[str, Any], config: network.T5Config,
                 source: str = "checkpoint") -> None:
  """Raises CheckpointMismatchError unless params match the model exactly.

  Args:
    params: nested dict of arrays (T5X names).
    config: the model config.
    source: file/dir name used in error messages.
  """
  expected = expected_param_shapes(config)
  got = {k: tuple(np.shape(v))
         for k, v in traverse_util.flatten_dict(dict(params), sep="/").items()}
  missing = sorted(set(expected) - set(got))
  extra = sorted(set(got) - set(expected))
  if missing:
    raise CheckpointMismatchError(
        f"{source}: parameter {missing[0]} (shape {expected[missing[0]]}) is "
        f"missing ({len(missing)} missing in all: {missing[:5]})")
  if extra:
    raise CheckpointMismatchError(
        f"{source}: unexpected parameter {extra[0]} with shape "
        f"{got[extra[0]]} ({len(extra)} unexpected in all: {extra[:5]})")
  for name in sorted(expected):
    if expected[name] != got[name]:
      raise CheckpointMismatchError(
          f"{source}: parameter {name} has shape {got[name]}, the model "
          f"expects {expected[name]}")


# ---------------------------------------------------------------------------
# Hugging Face.
# ---------------------------------------------------------------------------
def config_from_hf(config: PathLike | Mapping[str, Any],
                   **overrides: Any) -> network.T5Config:
  """T5Config from a Hugging Face T5/mT5 `config.json` (path or dict).

  Mapping: d_model->emb_dim, num_heads, num_layers->num_encoder_layers,
  num_decoder_layers, d_kv->head_dim, d_ff->mlp_dim,
  feed_forward_proj ("gated-gelu" -> ("gelu", "linear"), "relu" -> ("relu",),
  "gated-silu" -> ("silu", "linear")), dropout_rate, layer_norm_epsilon,
  relative_attention_{num_buckets,max_distance}. Tied, scaled logits
  (logits_via_embedding) for model_type "t5" unless the config says
  `tie_word_embeddings: false` (T5.1.1) or `scale_decoder_outputs: false`;
  mT5 always has a separate output layer.

  Raises:
    ValueError: unreadable file, missing field or unsupported activation.
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
  proj = cfg.get("feed_forward_proj", "relu")
  acts = {"gated-gelu": ("gelu", "linear"), "gated-gelu_new": ("gelu", "linear"),
          "relu": ("relu",), "gated-silu": ("silu", "linear"),
          "gated-relu": ("relu", "linear"), "gelu": ("gelu",),
          "gelu_new": ("gelu",)}
  if proj not in acts:
    raise ValueError(f"{source}: unsupported feed_forward_proj {proj!r}")
  model_type = cfg.get("model_type", "t5")
  if model_type == "mt5":
    tied = False
  elif "scale_decoder_outputs" in cfg:
    tied = bool(cfg["scale_decoder_outputs"])
  else:
    tied = bool(cfg.get("tie_word_embeddings", True))
  try:
    kwargs = dict(
        vocab_size=int(cfg["vocab_size"]), emb_dim=int(cfg["d_model"]),
        num_heads=int(cfg["num_heads"]),
        num_encoder_layers=int(cfg["num_layers"]),
        num_decoder_layers=int(cfg.get("num_decoder_layers") or
                               cfg["num_layers"]),
        head_dim=int(cfg["d_kv"]), mlp_dim=int(cfg["d_ff"]),
        mlp_activations=acts[proj],
        dropout_rate=float(cfg.get("dropout_rate", 0.1)),
        logits_via_embedding=tied,
        relative_attention_num_buckets=int(
            cfg.get("relative_attention_num_buckets", 32)),
        relative_attention_max_distance=int(
            cfg.get("relative_attention_max_distance", 128)),
        layer_norm_epsilon=float(cfg.get("layer_norm_epsilon", 1e-6)))
  except KeyError as e:
    raise ValueError(f"{source}: missing field {e.args[0]!r}") from e
  kwargs.update(overrides)
  return network.T5Config(**kwargs)


def _hf_name_map(config: network.T5Config) -> dict[str, tuple[str, bool]]:
  """{T5X flat name: (HF state-dict key, transpose?)} for `config`."""
  m: dict[str, tuple[str, bool]] = {
      "token_embedder/embedding": ("shared.weight", False),
      "encoder/relpos_bias/rel_embedding": (
          "encoder.block.0.layer.0.SelfAttention.relative_attention_bias"
          ".weight", True),
      "decoder/relpos_bias/rel_embedding": (
          "decoder.block.0.layer.0.SelfAttention.relative_attention_bias"
          ".weight", True),
      "encoder/encoder_norm/scale": ("encoder.final_layer_norm.weight", False),
      "decoder/decoder_norm/scale": ("decoder.final_layer_norm.weight", False),
  }
  if not config.logits_via_embedding:
    m["decoder/logits_dense/kernel"] = ("lm_head.weight", True)
  wis = (["wi"] if len(config.mlp_activations) == 1 else
         [f"wi_{i}" for i in range(len(config.mlp_activations))])

  def attn(t5x: str, hf: str):
    for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v"),
                         ("out", "o")):
      m[f"{t5x}/{ours}/kernel"] = (f"{hf}.{theirs}.weight", True)

  def mlp(t5x: str, hf: str):
    for wi in wis + ["wo"]:
      m[f"{t5x}/{wi}/kernel"] = (f"{hf}.DenseReluDense.{wi}.weight", True)

  for i in range(config.num_encoder_layers):
    t, h = f"encoder/layers_{i}", f"encoder.block.{i}.layer"
    attn(f"{t}/attention", f"{h}.0.SelfAttention")
    m[f"{t}/pre_attention_layer_norm/scale"] = (f"{h}.0.layer_norm.weight",
                                                False)
    mlp(f"{t}/mlp", f"{h}.1")
    m[f"{t}/pre_mlp_layer_norm/scale"] = (f"{h}.1.layer_norm.weight", False)
  for i in range(config.num_decoder_layers):
    t, h = f"decoder/layers_{i}", f"decoder.block.{i}.layer"
    attn(f"{t}/self_attention", f"{h}.0.SelfAttention")
    m[f"{t}/pre_self_attention_layer_norm/scale"] = (
        f"{h}.0.layer_norm.weight", False)
    attn(f"{t}/encoder_decoder_attention", f"{h}.1.EncDecAttention")
    m[f"{t}/pre_cross_attention_layer_norm/scale"] = (
        f"{h}.1.layer_norm.weight", False)
    mlp(f"{t}/mlp", f"{h}.2")
    m[f"{t}/pre_mlp_layer_norm/scale"] = (f"{h}.2.layer_norm.weight", False)
  return m


def _read_hf_state_dict(directory: pathlib.Path) -> tuple[dict[str, np.ndarray],
                                                          str]:
  """Reads model.safetensors (or shards, or pytorch_model.bin) as numpy."""
  single = directory / "model.safetensors"
  index = directory / "model.safetensors.index.json"
  files: list[pathlib.Path] = []
  if single.is_file():
    files = [single]
  elif index.is_file():
    try:
      weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, json.JSONDecodeError, KeyError) as e:
      raise ValueError(f"{index}: cannot read safetensors index: {e}") from e
    files = sorted({directory / f for f in weight_map.values()})
  if files:
    from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
    state = {}
    for f in files:
      try:
        state.update(load_file(str(f)))
      except Exception as e:  # safetensors raises its own error types.
        raise ValueError(f"{f}: cannot read safetensors file: {e}") from e
    return state, str(files[0])
  binary = directory / "pytorch_model.bin"
  if binary.is_file():
    try:
      import torch  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ValueError(f"{binary}: reading pytorch_model.bin needs torch; "
                       "convert it to safetensors or install torch") from e
    sd = torch.load(str(binary), map_location="cpu", weights_only=True)
    return {k: v.float().numpy() for k, v in sd.items()}, str(binary)
  raise ValueError(f"{directory}: no model.safetensors, "
                   "model.safetensors.index.json or pytorch_model.bin")


def load_hf_checkpoint(path: PathLike,
                       config: Optional[network.T5Config] = None) -> Params:
  """Params from a Hugging Face T5/mT5 directory (save_pretrained layout).

  Args:
    path: directory with config.json and model.safetensors (or shards /
      pytorch_model.bin).
    config: model config; default `config_from_hf(path/config.json)`.

  Returns:
    Nested dict of float32 numpy arrays in T5X layout.

  Raises:
    CheckpointMismatchError: a tensor is missing or has the wrong shape
      (message names the T5X parameter and the HF key).
    ValueError: unreadable files.
  """
  directory = pathlib.Path(path)
  if config is None:
    config = config_from_hf(directory / "config.json")
  state, source = _read_hf_state_dict(directory)
  expected = expected_param_shapes(config)
  flat = {}
  for name, (key, transpose) in _hf_name_map(config).items():
    if key not in state and key == "lm_head.weight" and "shared.weight" in state:
      key = "shared.weight"  # HF ties lm_head to shared when it is not saved.
    if key not in state:
      raise CheckpointMismatchError(
          f"{source}: tensor {key} for parameter {name} is missing")
    value = np.asarray(state[key], dtype=np.float32)
    if transpose:
      value = value.T
    if tuple(value.shape) != expected[name]:
      raise CheckpointMismatchError(
          f"{source}: parameter {name} (from {key}) has shape {value.shape}, "
          f"the model expects {expected[name]}")
    flat[name] = np.ascontiguousarray(value)
  params = traverse_util.unflatten_dict(flat, sep="/")
  check_params(params, config, source)
  return params


# ---------------------------------------------------------------------------
# T5X native (msgpack + TensorStore zarr).
# ---------------------------------------------------------------------------
def _ts_read(spec: dict[str, Any], source: str) -> np.ndarray:
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  try:
    return np.asarray(ts.open(spec, open=True).result().read().result())
  except Exception as e:  # tensorstore raises ValueError/OSError variants.
    raise ValueError(f"{source}: cannot read TensorStore array: {e}") from e


def _resolve_leaf(leaf: Any, directory: pathlib.Path, name: str) -> Any:
  """Turns a msgpack leaf (array, spec dict or placeholder) into an array."""
  if isinstance(leaf, str) and leaf.startswith(_PLACEHOLDER):
    rel = leaf[len(_PLACEHOLDER):]
    spec = {"driver": "zarr",
            "kvstore": {"driver": "file", "path": str(directory / rel)}}
    return _ts_read(spec, str(directory / rel))
  if isinstance(leaf, dict) and "kvstore" in leaf and "driver" in leaf:
    spec = json.loads(json.dumps(leaf))  # deep copy of plain data
    kv = spec["kvstore"]
    if isinstance(kv, str):
      kv = {"driver": "file", "path": kv}
    rel = kv.get("path", spec.pop("path", name))
    if kv.get("driver") in ("gcs", "gfile", "file"):
      kv = {"driver": "file", "path": str(directory / rel)}
    spec["kvstore"] = kv
    return _ts_read(spec, str(directory / rel))
  return leaf


def _is_ref(x: Any) -> bool:
  return (isinstance(x, str) and x.startswith(_PLACEHOLDER)) or (
      isinstance(x, dict) and "kvstore" in x and "driver" in x)


def load_t5x_checkpoint(path: PathLike,
                        config: Optional[network.T5Config] = None) -> Params:
  """Params (`target`) of a T5X native checkpoint directory.

  Args:
    path: the `checkpoint_N` directory (or its `checkpoint` msgpack file).
    config: if given, names and shapes are checked against the model.

  Returns:
    Nested dict of float32 numpy arrays in T5X layout.

  Raises:
    CheckpointMismatchError: names/shapes differ from the model.
    ValueError: unreadable msgpack, no `target` tree, unreadable arrays.
  """
  path = pathlib.Path(path)
  msgpack_file = path if path.is_file() else path / T5X_CHECKPOINT_FILE
  directory = msgpack_file.parent
  try:
    tree = serialization.msgpack_restore(msgpack_file.read_bytes())
  except Exception as e:  # msgpack raises several error types.
    raise ValueError(f"{msgpack_file}: cannot read T5X msgpack: {e}") from e
  if isinstance(tree, dict) and "optimizer" in tree and "target" not in tree:
    tree = tree["optimizer"]
  if not isinstance(tree, dict) or "target" not in tree:
    keys = sorted(tree) if isinstance(tree, dict) else type(tree).__name__
    raise ValueError(f"{msgpack_file}: no 'target' params in checkpoint "
                     f"(top-level keys: {keys})")
  target = tree["target"]
  flat = traverse_util.flatten_dict(target, is_leaf=lambda k, x: _is_ref(x))
  out = {}
  for key, leaf in flat.items():
    name = "/".join(key)
    value = _resolve_leaf(leaf, directory, "target." + ".".join(key))
    out[name] = np.asarray(value, dtype=np.float32)
  params = traverse_util.unflatten_dict(out, sep="/")
  if config is not None:
    check_params(params, config, str(msgpack_file))
  return params


def save_t5x_checkpoint(params: Mapping[str, Any], path: PathLike, *,
                        step: int = 0, reference: str = "placeholder",
                        optimizer_state: Optional[Mapping[str, Any]] = None
                        ) -> pathlib.Path:
  """Writes params in the T5X native layout (msgpack + TensorStore zarr).

  Each parameter goes to the zarr array `path/target.<dotted name>`; the
  msgpack `path/checkpoint` holds `{"version": 3, "target": refs, "state":
  {"step": step, "param_states": optimizer_state or {}}}`.

  Args:
    params: nested dict of arrays (boxed or plain).
    path: the checkpoint directory to create.
    step: training step stored in `state`.
    reference: "placeholder" (`PLACEHOLDER://target....` strings) or "spec"
      (TensorStore spec dicts with relative kvstore paths, T5X's own writer).
    optimizer_state: optional tree written inline under state/param_states.

  Returns:
    The checkpoint directory.

  Raises:
    ValueError: unknown `reference`.
  """
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  if reference not in ("placeholder", "spec"):
    raise ValueError(f"reference must be 'placeholder' or 'spec', got "
                     f"{reference!r}")
  directory = pathlib.Path(path)
  directory.mkdir(parents=True, exist_ok=True)
  flat = traverse_util.flatten_dict(nn.unbox(dict(params)))
  refs = {}
  for key, value in flat.items():
    value = np.asarray(value, dtype=np.float32)
    rel = "target." + ".".join(key)
    spec = {"driver": "zarr",
            "kvstore": {"driver": "file", "path": str(directory / rel)},
            "metadata": {"shape": list(value.shape), "dtype": "<f4",
                         "chunks": list(value.shape) or [1],
                         "compressor": {"id": "gzip"}},
            "create": True, "delete_existing": True}
    ts.open(spec).result().write(value).result()
    if reference == "placeholder":
      refs[key] = _PLACEHOLDER + rel
    else:
      refs[key] = {"driver": "zarr", "kvstore": {"driver": "file",
                                                 "path": rel},
                   "metadata": {"shape": list(value.shape), "dtype": "<f4"}}
  tree = {"version": 3,
          "target": traverse_util.unflatten_dict(refs),
          "state": {"step": np.asarray(step, np.int64),
                    "param_states": dict(optimizer_state or {})}}
  (directory / T5X_CHECKPOINT_FILE).write_bytes(
      serialization.msgpack_serialize(tree))
  return directory


# ---------------------------------------------------------------------------
# Format detection.
# ---------------------------------------------------------------------------
def detect_format(path: PathLike) -> str:
  """'hf' or 't5x' for a checkpoint path.

  Raises:
    ValueError: neither layout found (message lists what was looked for).
  """
  p = pathlib.Path(path)
  if p.is_file() and p.name == T5X_CHECKPOINT_FILE:
    return "t5x"
  if p.is_dir():
    if (p / T5X_CHECKPOINT_FILE).is_file():
      return "t5x"
    if any((p / f).is_file() for f in ("model.safetensors",
                                       "model.safetensors.index.json",
                                       "pytorch_model.bin")):
      return "hf"
  raise ValueError(
      f"{p}: not a checkpoint: expected a T5X directory with a 'checkpoint' "
      "msgpack file, or a Hugging Face directory with model.safetensors / "
      "pytorch_model.bin")


def load_pretrained(path: PathLike, config: network.T5Config) -> Params:
  """Params from a HF or T5X-native checkpoint, checked against `config`.

  Args:
    path: checkpoint directory (format detected by `detect_format`).
    config: model config the params must fit.

  Returns:
    Nested dict of float32 numpy arrays (plain, unboxed; T5X names).

  Raises:
    CheckpointMismatchError, ValueError: see the format-specific loaders.
  """
  fmt = detect_format(path)
  if fmt == "hf":
    return load_hf_checkpoint(path, config)
  return load_t5x_checkpoint(path, config)
