"""T5.1.1 / mT5 / T5 1.0 encoder-decoder Transformer in Flax linen.

The architecture, parameter tree and logical axis names follow T5X's
`t5x/examples/t5/network.py` and `layers.py` (Roberts et al., 2022), so that T5X and Hugging Face
`(M)T5ForConditionalGeneration` checkpoints load unchanged: pre-norm RMS layer norm (epsilon
1e-6; Raffel et al. 2020, Sec. 2.1), gated-GELU (T5.1.1/mT5, Shazeer 2020) or ReLU (T5 1.0) MLP,
no biases, relative position buckets (32, max distance 128), unscaled attention logits (T5X folds
1/sqrt(d_kv) into the query initialiser), logits from `logits_dense` or the tied embedding /
sqrt(emb_dim). Parameters are float32 with logical axis names (`vocab, embed, mlp, heads, kv,
joined_kv, relpos_buckets`) and T5X's kernel layouts (`[embed, joined_kv]`, `[vocab, embed]`, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any, Callable, Optional, Sequence

import flax
import flax.linen as nn
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from mcwq_t5x.engine import attention_masks
from mcwq_t5x.engine import remat

Array = jax.Array
DType = Any
Initializer = Callable[..., Array]

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
_REMAT_POLICIES = {
    "none": None,
    "minimal": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
    "full": jax.checkpoint_policies.nothing_saveable,
}


@dataclasses.dataclass(frozen=True)
class T5Config:
  """Hyper-parameters of the network; field names are those of T5X's config.

  `dtype`: activations (float32/bfloat16/float16, strings accepted); params are float32; masked
  logits get `attention_masks.mask_value(dtype)`. `emb_dim` d_model, `head_dim` d_kv, `mlp_dim`
  d_ff. `mlp_activations`: one per `wi` kernel, multiplied: ("gelu", "linear") gated GELU
  (T5.1.1/mT5), ("relu",) T5 1.0. `dropout_rate`: T5X's placement (embeddings, attention weights,
  MLP hidden, block outputs, final norm). `logits_via_embedding`: tied output (T5 1.0, decoder
  output @ embedding.T / sqrt(emb_dim)) else `logits_dense`. `float32_attention_logits`: q.k and
  softmax in float32. `relative_attention_num_buckets` (T5: 32), `relative_attention_max_distance`
  (T5: 128), `layer_norm_epsilon` (T5/HF: 1e-6). `remat_policy` (T5X's scalable_t5): "none" keeps
  every layer's activations for the backward pass, "minimal" keeps only their matmuls without a
  batch dimension (`jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims`), "full" keeps
  only each layer's input and recomputes the rest; the numbers are the same, up to float order
  (`engine.remat`: on XLA:CPU the recomputation runs in a conditional on the layer's cotangent).
  """
  vocab_size: int = 250112
  dtype: Any = jnp.float32
  emb_dim: int = 512
  num_heads: int = 6
  num_encoder_layers: int = 8
  num_decoder_layers: int = 8
  head_dim: int = 64
  mlp_dim: int = 1024
  mlp_activations: Sequence[str] = ("gelu", "linear")
  dropout_rate: float = 0.1
  logits_via_embedding: bool = False
  float32_attention_logits: bool = True
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  layer_norm_epsilon: float = 1e-6
  remat_policy: str = "none"

  def __post_init__(self):
    if self.remat_policy not in _REMAT_POLICIES:
      raise ValueError(f"T5Config.remat_policy: unknown policy {self.remat_policy!r}; "
                       f"expected one of {sorted(_REMAT_POLICIES)}")
    if isinstance(self.dtype, str):
      if self.dtype not in _DTYPES:
        raise ValueError(f"T5Config.dtype: unknown dtype {self.dtype!r}; "
                         f"expected one of {sorted(_DTYPES)}")
      object.__setattr__(self, "dtype", _DTYPES[self.dtype])
    object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
    for act in self.mlp_activations:
      if act not in _ACTIVATIONS:
        raise ValueError(f"T5Config.mlp_activations: unknown activation "
                         f"{act!r}; expected one of {sorted(_ACTIVATIONS)}")
    for name in ("vocab_size", "emb_dim", "num_heads", "num_encoder_layers", "num_decoder_layers",
                 "head_dim", "mlp_dim"):
      if int(getattr(self, name)) <= 0:
        raise ValueError(f"T5Config.{name} must be positive, got "
                         f"{getattr(self, name)}")


_ACTIVATIONS = {
    "gelu": functools.partial(nn.gelu, approximate=True),  # = HF gelu_new.
    "relu": nn.relu,
    "silu": nn.silu,
    "linear": lambda x: x,
}

# Presets. `tiny` learns MCWQ on a CPU in minutes (width 64: on 2 CPU cores, half the step time of
# width 128 for about the same learning per step); the others are the
# published sizes (mT5: Xue et al., 2021, Table 1 / T5X gin files; T5 1.0 base: Raffel et al.,
# 2020).
_T5_1_1_BASE = T5Config(
    vocab_size=32128,
    emb_dim=768,
    num_heads=12,
    num_encoder_layers=12,
    num_decoder_layers=12,
    head_dim=64,
    mlp_dim=2048)

CONFIGS: dict[str, T5Config] = {
    "tiny":
        T5Config(
            vocab_size=2000,
            emb_dim=64,
            num_heads=4,
            num_encoder_layers=2,
            num_decoder_layers=2,
            head_dim=16,
            mlp_dim=256,
            dropout_rate=0.1),
    "mt5_small":
        T5Config(
            emb_dim=512,
            num_heads=6,
            num_encoder_layers=8,
            num_decoder_layers=8,
            head_dim=64,
            mlp_dim=1024),
    "mt5_base":
        T5Config(
            emb_dim=768,
            num_heads=12,
            num_encoder_layers=12,
            num_decoder_layers=12,
            head_dim=64,
            mlp_dim=2048),
    "mt5_large":
        T5Config(
            emb_dim=1024,
            num_heads=16,
            num_encoder_layers=24,
            num_decoder_layers=24,
            head_dim=64,
            mlp_dim=2816),
    "t5_1_1_base":  # T5.1.1 base (`t5-v1_1-base`; T5X t5x/examples/t5/t5_1_1/base.gin).
        _T5_1_1_BASE,
    # T5 1.0 base (`t5-base`): the same sizes with a wider ReLU MLP and the output layer tied to
    # the embedding.
    "t5_base":
        dataclasses.replace(
            _T5_1_1_BASE, mlp_dim=3072, mlp_activations=("relu",), logits_via_embedding=True),
}


def get_config(name: str, **overrides: Any) -> T5Config:
  """Preset `name` of `CONFIGS` with `overrides`; KeyError lists known presets, TypeError a bad
  field."""
  if name not in CONFIGS:
    raise KeyError(f"unknown model config {name!r}; known: {sorted(CONFIGS)}")
  return dataclasses.replace(CONFIGS[name], **overrides)


def _constrain(x: Array, names: tuple[str, ...]) -> Array:
  return nn.with_logical_constraint(x, names)


# ---------------------------------------------------------------------------
# Layers.
# ---------------------------------------------------------------------------
def _param(module: nn.Module, name: str, init: Initializer, axes: tuple[str, ...],
           shape: tuple[int, ...]) -> Array:
  """`module.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)`: the
  unboxed float32 parameter, created by `init` under `nn.Module.init`.

  Raises flax's `ScopeParamShapeError` when an existing value's shape is not `shape`: the check
  Flax makes by tracing `init` again (`jax.eval_shape`), here by comparing shapes; why: that trace
  of every parameter in every `apply` was most of tracing the decoding loop.
  """
  if module.has_variable("params", name):
    value = nn.meta.unbox(module.get_variable("params", name))
    if np.shape(value) != tuple(shape):
      raise flax.errors.ScopeParamShapeError(name, module.scope.path_text, np.shape(value),
                                             tuple(shape))
    return value
  return module.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)


class DenseGeneral(nn.Module):
  """Bias-free linear map over `axis` to `features`, T5X's kernel layout.

  The kernel is stored float32 [prod(in dims), prod(features)] with the two logical names
  `kernel_axes`, reshaped to [*in dims, *features] for the product in `dtype`.
  """
  features: int | Sequence[int]
  axis: int | Sequence[int] = -1
  dtype: DType = jnp.float32
  kernel_init: Initializer = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
  kernel_axes: tuple[str, ...] = ()

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    features = ((self.features,) if isinstance(self.features, int) else tuple(self.features))
    axis = (self.axis,) if isinstance(self.axis, int) else tuple(self.axis)
    inputs = jnp.asarray(inputs, self.dtype)
    axis = tuple(a % inputs.ndim for a in axis)
    in_dims = tuple(inputs.shape[a] for a in axis)
    kernel = _param(self, "kernel", self.kernel_init, self.kernel_axes,
                    (int(np.prod(in_dims)), int(np.prod(features))))
    kernel = jnp.asarray(kernel, self.dtype).reshape(in_dims + features)
    contract = tuple(range(len(axis)))
    return lax.dot_general(inputs, kernel, ((axis, contract), ((), ())))


class LayerNorm(nn.Module):
  """T5 RMS layer norm: x / sqrt(mean(x^2) + eps) * scale; no mean, no bias.

  Computed in float32, returned in `dtype`. Param `scale` [embed], init ones.
  """
  epsilon: float = 1e-6
  dtype: DType = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x = jnp.asarray(x, jnp.float32)
    features = x.shape[-1]
    mean2 = jnp.mean(lax.square(x), axis=-1, keepdims=True)
    y = jnp.asarray(x * lax.rsqrt(mean2 + self.epsilon), self.dtype)
    scale = _param(self, "scale", nn.initializers.ones, ("embed",), (features,))
    return y * jnp.asarray(scale, self.dtype)


class Embed(nn.Module):
  """Token embedding [vocab, embed] (init N(0, 1) as T5X) with `attend`."""
  num_embeddings: int
  features: int
  dtype: DType = jnp.float32

  def setup(self):
    self.embedding = _param(self, "embedding", nn.initializers.normal(stddev=1.0),
                            ("vocab", "embed"), (self.num_embeddings, self.features))

  def __call__(self, inputs: Array) -> Array:
    """[...] int ids -> [..., embed] in `dtype` (ids out of range give NaN)."""
    if not jnp.issubdtype(inputs.dtype, jnp.integer):
      raise ValueError(f"Embed: token ids must be integers, got {inputs.dtype}")
    # why gather, then cast: the gradient is then a float32 scatter-add; in bfloat16 XLA:GPU runs
    # it as a compare-and-swap loop, slow where rows repeat (padding), and it rounds the sums.
    return jnp.take(self.embedding, inputs, axis=0).astype(self.dtype)

  def attend(self, query: Array) -> Array:
    """[..., embed] -> [..., vocab] = query @ embedding.T (float32)."""
    query = jnp.asarray(query, jnp.float32)
    return jnp.dot(query, jnp.asarray(self.embedding, jnp.float32).T)


def relative_position_bucket(relative_position: Array, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> Array:
  """int32 buckets in [0, num_buckets) of `relative_position` (memory - query), T5's (Raffel et al.
  2020, Sec. 2.1; T5X/mesh TF).

  Bidirectional: half the buckets per direction, else future positions share bucket 0;
  distances >= `max_distance` share the last bucket.
  """
  ret = jnp.zeros_like(relative_position, dtype=jnp.int32)
  n = -relative_position.astype(jnp.int32)
  if bidirectional:
    num_buckets //= 2
    ret += (n < 0).astype(jnp.int32) * num_buckets
    n = jnp.abs(n)
  else:
    n = jnp.maximum(n, 0)
  max_exact = num_buckets // 2
  is_small = n < max_exact
  val_if_large = max_exact + (
      jnp.log(n.astype(jnp.float32) / max_exact + jnp.finfo(jnp.float32).eps) /
      np.log(max_distance / max_exact) * (num_buckets - max_exact)).astype(jnp.int32)
  val_if_large = jnp.minimum(val_if_large, num_buckets - 1)
  return ret + jnp.where(is_small, n, val_if_large)


class RelativePositionBiases(nn.Module):
  """Per-head relative position bias; param `rel_embedding` [heads, buckets] (fields of
  `T5Config`)."""
  num_buckets: int
  max_distance: int
  num_heads: int
  dtype: DType = jnp.float32

  @nn.compact
  def __call__(self, qlen: int, klen: int, bidirectional: bool = True) -> Array:
    """Bias [1, heads, qlen, klen] (`self.dtype`): relative position = key index - query index
    (T5X)."""
    # Packed rows need no positions: within a contiguous segment this is the position difference,
    # and the segment mask removes the other pairs.
    relative = (jnp.arange(klen, dtype=jnp.int32)[None, :] -
                jnp.arange(qlen, dtype=jnp.int32)[:, None])[None]
    buckets = relative_position_bucket(relative, bidirectional, self.num_buckets, self.max_distance)
    table = _param(self, "rel_embedding",
                   nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"),
                   ("heads", "relpos_buckets"), (self.num_heads, self.num_buckets))
    # why a one-hot contraction, as T5X, not a gather: the gather's gradient is a scatter-add of
    # q * k positions into num_buckets rows, which XLA:GPU runs as a compare-and-swap loop under
    # that contention (mT5-small's step: 6.9 s on an H200; docs/benchmarks.md). Forward values are
    # the same: one term of each sum is non-zero.
    one_hot = (buckets[0][None] == lax.broadcasted_iota(jnp.int32, (self.num_buckets, 1, 1),
                                                        0)).astype(self.dtype)
    values = lax.dot_general(jnp.asarray(table, self.dtype), one_hot, (((1,), (0,)), ((), ())))
    return values[None]  # [1, heads, q, k]


class MultiHeadDotProductAttention(nn.Module):
  """T5X multi-head attention with an autoregressive key/value cache.

  The query kernel is initialised with an extra 1/sqrt(head_dim) factor and the
  logits are NOT scaled (T5X / Mesh TF convention). The decode cache lives in
  the flax `cache` collection as `cached_key`, `cached_value`
  ([batch, heads, head_dim, max_len], T5X's layout) and `cache_index` (int32
  scalar).
  """
  num_heads: int
  head_dim: int
  dtype: DType = jnp.float32
  dropout_rate: float = 0.0
  kernel_init: Initializer = nn.initializers.variance_scaling(1.0, "fan_in", "normal")
  float32_logits: bool = True

  @nn.compact
  def __call__(self,
               inputs_q: Array,
               inputs_kv: Array,
               mask: Optional[Array] = None,
               bias: Optional[Array] = None,
               *,
               decode: bool = False,
               deterministic: bool = False,
               precomputed_kv: Optional[tuple[Array, Array]] = None) -> Array:
    """Attention of inputs_q [b, q, embed] over inputs_kv [b, k, embed] -> [b, q, embed] in `dtype`.

    `mask` [b or 1, 1 or heads, q, k] (1 = attend; masked logits get `attention_masks.mask_value`),
    `bias` [b or 1, heads, q, k]. `decode`: use and update the cache (one query position per call;
    the first call only creates it). `precomputed_kv`: (key, value) [b, heads, head_dim, k]
    (`cross_attention_kv`). ValueError: a cached query that is not one position of the cached batch;
    `precomputed_kv` with `decode`.
    """
    projection = functools.partial(
        DenseGeneral,
        axis=-1,
        features=(self.num_heads, self.head_dim),
        kernel_axes=("embed", "joined_kv"),
        dtype=self.dtype)
    depth_scaling = jnp.sqrt(self.head_dim).astype(self.dtype)

    def query_init(*args):
      return self.kernel_init(*args) / depth_scaling

    query = projection(kernel_init=query_init, name="query")(inputs_q)
    query = _constrain(query, ("batch", "length", "heads", "kv"))
    if precomputed_kv is None:
      key = projection(kernel_init=self.kernel_init, name="key")(inputs_kv)
      value = projection(kernel_init=self.kernel_init, name="value")(inputs_kv)
      key = _constrain(key, ("batch", "length", "heads", "kv"))
      value = _constrain(value, ("batch", "length", "heads", "kv"))
      kv_layout = "bkhd"
    elif decode:
      raise ValueError("precomputed_kv is for attention without a cache (decode=False)")
    else:
      # why this layout: XLA hoists the projection out of the loop either way, but in [b, k, heads,
      # head_dim] it copied it transposed at every step.
      key, value = precomputed_kv
      kv_layout = "bhdk"  # einsum letters of key and value's axes

    if decode:
      is_initialized = self.has_variable("cache", "cached_key")
      swap = lambda s: s[:-3] + (s[-2], s[-1], s[-3])
      cached_key = self.variable("cache", "cached_key", jnp.zeros, swap(key.shape), key.dtype)
      cached_value = self.variable("cache", "cached_value", jnp.zeros, swap(value.shape),
                                   value.dtype)
      cache_index = self.variable("cache", "cache_index", lambda: jnp.array(0, dtype=jnp.int32))
      if is_initialized:
        batch, num_heads, head_dim, length = cached_key.value.shape
        expected = (batch, 1, num_heads, head_dim)
        if query.shape != expected:
          raise ValueError(f"autoregressive cache: expected query shape "
                           f"{expected}, got {query.shape}")
        cur_index = cache_index.value
        # Writes position cur_index in place (the values of T5X's one-hot sum, without
        # reading and rewriting the whole cache at every step).
        at = (0, 0, 0, cur_index)
        key = lax.dynamic_update_slice(cached_key.value, jnp.moveaxis(key, -3, -1), at)
        value = lax.dynamic_update_slice(cached_value.value, jnp.moveaxis(value, -3, -1), at)
        cached_key.value = key
        cached_value.value = value
        cache_index.value = cur_index + 1
        kv_layout = "bhdk"
        mask = attention_masks.combine_masks(
            mask, jnp.broadcast_to(jnp.arange(length) <= cur_index, (batch, 1, 1, length)))
        if bias is not None:
          bias = lax.dynamic_slice_in_dim(bias, cur_index, 1, axis=-2)

    if self.float32_logits:
      query = query.astype(jnp.float32)
      key = key.astype(jnp.float32)
    # [b, heads, q, k]
    logits = jnp.einsum(f"bqhd,{kv_layout}->bhqk", query, key)
    if bias is not None:
      logits = logits + bias.astype(logits.dtype)
    if mask is not None:
      logits = attention_masks.mask_logits(logits, mask)
    weights = jax.nn.softmax(logits).astype(self.dtype)
    if not deterministic and self.dropout_rate > 0.0:
      keep_prob = 1.0 - self.dropout_rate
      shape = list(weights.shape)
      shape[-2] = 1  # T5 broadcasts attention dropout along the query axis.
      keep = jax.random.bernoulli(self.make_rng("dropout"), keep_prob, shape)
      weights = weights * (
          jnp.broadcast_to(keep, weights.shape).astype(self.dtype) /
          jnp.asarray(keep_prob, self.dtype))
    x = jnp.einsum(f"bhqk,{kv_layout}->bqhd", weights, value.astype(self.dtype))
    return DenseGeneral(
        features=inputs_q.shape[-1],
        axis=(-2, -1),
        kernel_init=self.kernel_init,
        kernel_axes=("joined_kv", "embed"),
        dtype=self.dtype,
        name="out")(
            x)


class MlpBlock(nn.Module):
  """T5 MLP: prod_i act_i(x @ wi_i) -> dropout -> @ wo (`wi` if one act)."""
  intermediate_dim: int
  activations: Sequence[str] = ("gelu", "linear")
  kernel_init: Initializer = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
  intermediate_dropout_rate: float = 0.1
  dtype: DType = jnp.float32

  @nn.compact
  def __call__(self, inputs: Array, deterministic: bool = False) -> Array:
    hidden = []
    for idx, act in enumerate(self.activations):
      name = "wi" if len(self.activations) == 1 else f"wi_{idx}"
      x = DenseGeneral(
          self.intermediate_dim,
          dtype=self.dtype,
          kernel_init=self.kernel_init,
          kernel_axes=("embed", "mlp"),
          name=name)(
              inputs)
      hidden.append(_ACTIVATIONS[act](x))
    x = functools.reduce(operator.mul, hidden)
    x = nn.Dropout(
        rate=self.intermediate_dropout_rate, broadcast_dims=(-2,))(
            x, deterministic=deterministic)
    x = _constrain(x, ("batch", "length", "mlp"))
    return DenseGeneral(
        inputs.shape[-1],
        dtype=self.dtype,
        kernel_init=self.kernel_init,
        kernel_axes=("mlp", "embed"),
        name="wo")(
            x)


def _dropout(cfg: T5Config, x: Array, deterministic: bool) -> Array:
  return nn.Dropout(rate=cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)


def _attention(cfg: T5Config, name: str) -> "MultiHeadDotProductAttention":
  """The attention sublayer `name` of a block (T5X parameter name)."""
  return MultiHeadDotProductAttention(
      cfg.num_heads,
      cfg.head_dim,
      cfg.dtype,
      cfg.dropout_rate,
      float32_logits=cfg.float32_attention_logits,
      name=name)


def _mlp(cfg: T5Config) -> "MlpBlock":
  """The MLP sublayer `mlp` of a block."""
  return MlpBlock(
      cfg.mlp_dim,
      cfg.mlp_activations,
      intermediate_dropout_rate=cfg.dropout_rate,
      dtype=cfg.dtype,
      name="mlp")


def _residual(cfg: T5Config, inputs: Array, norm_name: str, deterministic: bool,
              sublayer: Callable[[Array], Array]) -> Array:
  """T5.1.1's pre-norm residual: `inputs + dropout(sublayer(LayerNorm(inputs)))`.

  Called inside a module's compact `__call__` (the LayerNorm `norm_name` and the sublayer's
  modules belong to that module). Activations [batch, length, embed] keep their logical axes.
  """
  x = LayerNorm(cfg.layer_norm_epsilon, cfg.dtype, name=norm_name)(inputs)
  x = sublayer(_constrain(x, ("batch", "length", "embed")))
  return _constrain(_dropout(cfg, x, deterministic) + inputs, ("batch", "length", "embed"))


class EncoderLayer(nn.Module):
  """Pre-norm self-attention + MLP block of the encoder; `bias` [1, heads, len, len] is the
  stack's relative position bias."""
  config: T5Config

  @nn.compact
  def __call__(self,
               inputs: Array,
               encoder_mask: Optional[Array] = None,
               bias: Optional[Array] = None,
               deterministic: bool = False) -> Array:
    cfg = self.config
    x = _residual(
        cfg, inputs, "pre_attention_layer_norm", deterministic,
        lambda h: _attention(cfg, "attention")
        (h, h, encoder_mask, bias, deterministic=deterministic))
    return _residual(cfg, x, "pre_mlp_layer_norm", deterministic, lambda h: _mlp(cfg)
                     (h, deterministic=deterministic))


class DecoderLayer(nn.Module):
  """Pre-norm self-attention + cross-attention + MLP block of the decoder; `bias` [1, heads, len,
  len] is the stack's relative position bias (len: the decode length when decoding)."""
  config: T5Config

  @nn.compact
  def __call__(self,
               inputs: Array,
               encoded: Array,
               decoder_mask: Optional[Array] = None,
               encoder_decoder_mask: Optional[Array] = None,
               bias: Optional[Array] = None,
               deterministic: bool = False,
               decode: bool = False,
               cross_kv: Optional[tuple[Array, Array]] = None) -> Array:
    cfg = self.config
    x = _residual(
        cfg, inputs, "pre_self_attention_layer_norm", deterministic,
        lambda h: _attention(cfg, "self_attention")
        (h, h, decoder_mask, bias, deterministic=deterministic, decode=decode))
    y = _residual(
        cfg, x, "pre_cross_attention_layer_norm", deterministic,
        lambda h: _attention(cfg, "encoder_decoder_attention")
        (h, encoded, encoder_decoder_mask, deterministic=deterministic, precomputed_kv=cross_kv))
    return _residual(cfg, y, "pre_mlp_layer_norm", deterministic, lambda h: _mlp(cfg)
                     (h, deterministic=deterministic))


def _embed(cfg: T5Config, shared_embedding: nn.Module, tokens: Array,
           deterministic: bool) -> tuple[nn.Module, Array]:
  """(RelativePositionBiases module, activations [batch, length, emb_dim] in `cfg.dtype`) of int
  `tokens` [batch, length], embedded and dropped out; inside a compact `__call__`."""
  rel_emb = RelativePositionBiases(
      cfg.relative_attention_num_buckets,
      cfg.relative_attention_max_distance,
      cfg.num_heads,
      cfg.dtype,
      name="relpos_bias")
  x = shared_embedding(tokens.astype(jnp.int32))
  x = _dropout(cfg, x, deterministic).astype(cfg.dtype)
  return rel_emb, _constrain(x, ("batch", "length", "embed"))


def _rematerialised(cfg: T5Config, layer: type[nn.Module], *static_argnums: int) -> type[nn.Module]:
  """`layer`, whose activations the backward pass recomputes as `cfg.remat_policy` says (the same
  parameter names); `static_argnums` count `self` as 0 (`flax.linen.remat`)."""
  if cfg.remat_policy == "none":
    return layer
  return remat.rematerialised(layer, _REMAT_POLICIES[cfg.remat_policy], static_argnums)


class Encoder(nn.Module):
  """Embedding -> dropout -> layers -> `encoder_norm` -> dropout (element-wise, as T5X's)."""
  config: T5Config
  shared_embedding: nn.Module

  @nn.compact
  def __call__(self,
               encoder_input_tokens: Array,
               encoder_mask: Optional[Array] = None,
               deterministic: bool = False) -> Array:
    cfg = self.config
    rel_emb, x = _embed(cfg, self.shared_embedding, encoder_input_tokens, deterministic)
    length = x.shape[-2]
    bias = rel_emb(length, length, True)  # why once: every layer shares the table (T5)
    layer = _rematerialised(cfg, EncoderLayer, 4)  # why 4: `deterministic` is a Python bool
    for i in range(cfg.num_encoder_layers):
      x = layer(cfg, name=f"layers_{i}")(x, encoder_mask, bias, deterministic)
    x = LayerNorm(cfg.layer_norm_epsilon, cfg.dtype, name="encoder_norm")(x)
    # why element-wise, where every other dropout is shared along the length: T5X's encoder does so
    return nn.Dropout(rate=cfg.dropout_rate)(x, deterministic=deterministic)


class Decoder(nn.Module):
  """Embedding -> layers -> `decoder_norm` -> logits (dense or tied); `output_logits=False`: the
  output layer's input [batch, length, emb_dim] in `dtype` (for `losses.fused_loss`)."""
  config: T5Config
  shared_embedding: nn.Module

  @nn.compact
  def __call__(self,
               encoded: Array,
               decoder_input_tokens: Array,
               decoder_mask: Optional[Array] = None,
               encoder_decoder_mask: Optional[Array] = None,
               deterministic: bool = False,
               decode: bool = False,
               max_decode_length: Optional[int] = None,
               cross_kv: Optional[Sequence[tuple[Array, Array]]] = None,
               output_logits: bool = True) -> Array:
    cfg = self.config
    rel_emb, y = _embed(cfg, self.shared_embedding, decoder_input_tokens, deterministic)
    length = max_decode_length if decode and max_decode_length else y.shape[-2]
    bias = rel_emb(length, length, False)  # why once: every layer shares the table (T5)
    # why not when decoding: no backward pass, and the cache is written in the layers
    layer = DecoderLayer if decode else _rematerialised(cfg, DecoderLayer, 6, 7)
    for i in range(cfg.num_decoder_layers):
      y = layer(
          cfg, name=f"layers_{i}")(  # why positional: remat's static_argnums
              y, encoded, decoder_mask, encoder_decoder_mask, bias, deterministic, decode,
              None if cross_kv is None else cross_kv[i])
    y = LayerNorm(cfg.layer_norm_epsilon, cfg.dtype, name="decoder_norm")(y)
    y = _dropout(cfg, y, deterministic)
    if cfg.logits_via_embedding:
      if not output_logits:
        return y
      return _constrain(
          self.shared_embedding.attend(y) / logits_divisor(cfg), ("batch", "length", "vocab"))
    dense = DenseGeneral(
        cfg.vocab_size, dtype=jnp.float32, kernel_axes=("embed", "vocab"), name="logits_dense")
    if not output_logits:
      if self.is_initializing():  # why: creates the kernel; the logits are dead code under jit
        dense(y)
      return y
    return _constrain(dense(y), ("batch", "length", "vocab"))


def logits_divisor(config: T5Config) -> np.float32:
  """The tied output layer's divisor sqrt(emb_dim), float32 (T5 1.0; Mesh TF)."""
  return np.sqrt(np.float32(config.emb_dim))


def output_kernel(config: T5Config, params: Any) -> Array:
  """The output layer's kernel in unboxed `params`: `logits_dense` [embed, vocab], or (tied,
  `logits_via_embedding`) the embedding [vocab, embed], whose logits are divided by
  `logits_divisor`."""
  if config.logits_via_embedding:
    return params["token_embedder"]["embedding"]
  return params["decoder"]["logits_dense"]["kernel"]


def cross_attention_kv(config: T5Config, params: Any, encoded: Array) -> list[tuple[Array, Array]]:
  """Per decoder layer, the cross-attention (key, value) of `encoded` [batch, in_len, emb_dim], each
  [batch, num_heads, head_dim, in_len] in `config.dtype`; KeyError if `params` lack a kernel."""
  # why once per batch: they are the same at every decoding step (as Hugging Face keeps them);
  # T5X projects them per step and XLA then copies them transposed at every step.
  projection = DenseGeneral(
      axis=-1,
      features=(config.num_heads, config.head_dim),
      kernel_axes=("embed", "joined_kv"),
      dtype=config.dtype)
  out = []
  for i in range(config.num_decoder_layers):
    attention = params["decoder"][f"layers_{i}"]["encoder_decoder_attention"]
    kv = (
        jnp.moveaxis(
            _constrain(
                projection.apply({"params": attention[name]}, encoded),
                ("batch", "length", "heads", "kv")), -3, -1) for name in ("key", "value"))
    out.append(tuple(kv))
  return out


class Transformer(nn.Module):
  """T5 encoder-decoder; `__call__`, `encode`, `decode` as in T5X.

  Attributes:
    config: a `T5Config`.
  """
  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = Embed(cfg.vocab_size, cfg.emb_dim, cfg.dtype)
    self.encoder = Encoder(cfg, self.token_embedder)
    self.decoder = Decoder(cfg, self.token_embedder)

  def encode(self,
             encoder_input_tokens: Array,
             encoder_segment_ids: Optional[Array] = None,
             *,
             enable_dropout: bool = True) -> Array:
    """[batch, in_len] int tokens (0 = pad) -> [batch, in_len, embed] (`config.dtype`); T5X's
    signature, packed segments attend within themselves."""
    cfg = self.config
    mask = attention_masks.make_attention_mask(
        encoder_input_tokens > 0, encoder_input_tokens > 0, dtype=cfg.dtype)
    if encoder_segment_ids is not None:
      mask = attention_masks.combine_masks(
          mask,
          attention_masks.make_attention_mask(encoder_segment_ids, encoder_segment_ids, jnp.equal,
                                              cfg.dtype),
          dtype=cfg.dtype)
    return self.encoder(encoder_input_tokens, mask, deterministic=not enable_dropout)

  def decode(self,
             encoded: Array,
             encoder_input_tokens: Array,
             decoder_input_tokens: Array,
             decoder_target_tokens: Array,
             encoder_segment_ids: Optional[Array] = None,
             decoder_segment_ids: Optional[Array] = None,
             *,
             enable_dropout: bool = True,
             decode: bool = False,
             max_decode_length: Optional[int] = None,
             cross_kv: Optional[Sequence[tuple[Array, Array]]] = None,
             output_logits: bool = True) -> Array:
    """Decoder logits float32 [batch, tgt_len, vocab] (`output_logits=False`: the output layer's
    input [batch, tgt_len, emb_dim] in `config.dtype`, whose kernel is `output_kernel`).

    `decode=True`: cached decoding, no self-attention mask (the cache is causal), no packing
    (ValueError with segment ids). `cross_kv`: `cross_attention_kv`'s projections, or None
    (projected here); the same logits. No `decoder_positions` (T5X's, read by no relative
    attention).
    """
    cfg = self.config
    if decode:
      if encoder_segment_ids is not None or decoder_segment_ids is not None:
        raise ValueError("packed (segment id) inputs are not supported with "
                         "decode=True")
      decoder_mask = None
      enc_dec_mask = attention_masks.make_attention_mask(
          jnp.ones_like(decoder_target_tokens), encoder_input_tokens > 0, dtype=cfg.dtype)
    else:
      decoder_mask = attention_masks.make_decoder_mask(decoder_target_tokens, cfg.dtype,
                                                       decoder_segment_ids)
      enc_dec_mask = attention_masks.make_attention_mask(
          decoder_target_tokens > 0, encoder_input_tokens > 0, dtype=cfg.dtype)
      if encoder_segment_ids is not None:
        if decoder_segment_ids is None:
          raise ValueError("encoder_segment_ids given without "
                           "decoder_segment_ids")
        enc_dec_mask = attention_masks.combine_masks(
            enc_dec_mask,
            attention_masks.make_attention_mask(decoder_segment_ids, encoder_segment_ids, jnp.equal,
                                                cfg.dtype),
            dtype=cfg.dtype)
    return self.decoder(
        encoded,
        decoder_input_tokens,
        decoder_mask=decoder_mask,
        encoder_decoder_mask=enc_dec_mask,
        deterministic=not enable_dropout,
        decode=decode,
        max_decode_length=max_decode_length,
        cross_kv=cross_kv,
        output_logits=output_logits)

  def __call__(self,
               encoder_input_tokens: Array,
               decoder_input_tokens: Array,
               decoder_target_tokens: Array,
               encoder_segment_ids: Optional[Array] = None,
               decoder_segment_ids: Optional[Array] = None,
               encoder_positions: Optional[Array] = None,
               decoder_positions: Optional[Array] = None,
               *,
               enable_dropout: bool = True,
               decode: bool = False,
               max_decode_length: Optional[int] = None,
               output_logits: bool = True) -> Array:
    """Teacher-forced logits float32 [batch, tgt_len, vocab] (or, `output_logits=False`, the
    output layer's input: `decode`).

    Tokens int32 [batch, len], 0 = padding; `decoder_input_tokens` are the targets shifted right
    (BOS 0); `decoder_target_tokens` feed the masks only; `*_segment_ids` pack; `*_positions` are
    accepted (T5X's model passes them) and not read. `decode`, `max_decode_length`: cached decoding.
    """
    # why unread: relative positions are key index - query index in the row (one [1, heads, len,
    # len] bias, as T5X), which equals position difference within a packed segment (contiguous,
    # counting from 0) while the segment mask replaces every other pair; the positions would
    # cost a [batch, heads, len, len] gather per layer and its scatter-add in the backward pass.
    del encoder_positions, decoder_positions
    encoded = self.encode(encoder_input_tokens, encoder_segment_ids, enable_dropout=enable_dropout)
    return self.decode(
        encoded,
        encoder_input_tokens,
        decoder_input_tokens,
        decoder_target_tokens,
        encoder_segment_ids,
        decoder_segment_ids,
        enable_dropout=enable_dropout,
        decode=decode,
        max_decode_length=max_decode_length,
        output_logits=output_logits)
