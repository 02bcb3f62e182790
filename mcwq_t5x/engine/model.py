"""`EncoderDecoderModel`: loss, decoding and scoring around `network.Transformer`.

A lean counterpart of T5X's `t5x/models.py::EncoderDecoderModel`: `loss_fn` (T5X's
`compute_weighted_cross_entropy`: label smoothing less the smoothed distribution's entropy, z-loss
`z_loss * log(Z)^2`, Chowdhery et al. 2022; computed by `losses.fused_loss` with the output layer,
without [batch, length, vocab] logits), `predict_batch[_with_aux]` (greedy, temperature sampling
or beam search through `engine.decoding`, T5X's option names) and `score_batch`.

Loss contract: the model alone normalises. `loss_normalizer(batch)` is the float32 denominator D
(`loss_normalizing_factor` as in T5X); `loss_fn(..., normalizer=D)` returns (Σ_t w_t loss_t / D,
metrics as sums), and a row's numerator depends on that row only, so summed microbatch gradients
with the batch's D equal the batch gradient. Batches use seqio's `EncDecFeatureConverter` keys
(positions accepted and not read); PAD = 0, EOS = 1, decoder BOS = 0.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mcwq_t5x.engine import decoding
from mcwq_t5x.engine import losses
from mcwq_t5x.engine import network

Array = jax.Array
Batch = Mapping[str, Array]
PyTree = Any

# The packing features the network reads. A packed batch's `encoder_positions` and
# `decoder_positions` are accepted and not read: relative attention takes key index - query index,
# which equals the position difference within a segment (see `network.Transformer.__call__`).
_SEGMENT_KEYS = ("encoder_segment_ids", "decoder_segment_ids")

# T5X's `losses.SpecialLossNormalizingFactor` names.
SPECIAL_LOSS_NORMALIZING_FACTORS = ("NUM_REAL_TARGET_TOKENS", "NUM_TOTAL_TARGET_TOKENS",
                                    "AVERAGE_PER_SEQUENCE")

# Decoding methods of `predict_batch_with_aux` and the `decoder_params` keys
# each one takes (the keyword arguments of the `mcwq_t5x.engine.decoding` function).
DECODER_PARAMS = {
    "greedy": (),
    "beam_search": ("alpha",),
    "temperature_sample": ("temperature", "topk")
}


def check_decode_options(
    num_decodes: int = 1,
    method: Optional[str] = None,
    decoder_params: Optional[Mapping[str, Any]] = None) -> tuple[str, dict[str, Any]]:
  """(method, decoder_params) checked before anything is decoded or loaded.

  The method defaults to "greedy" if `num_decodes == 1`, else "beam_search"; `decoder_params` come
  back as a dict (`topk` int, `alpha`/`temperature` float). ValueError: `num_decodes` < 1, an
  unknown method, greedy with `num_decodes > 1`, or keys the method does not take.
  """
  if int(num_decodes) < 1:
    raise ValueError(f"num_decodes must be >= 1, got {num_decodes}")
  if method is None:
    method = "greedy" if num_decodes == 1 else "beam_search"
  if method not in DECODER_PARAMS:
    raise ValueError(f"predict_batch: unknown method {method!r}; expected "
                     f"one of {sorted(DECODER_PARAMS)}")
  if method == "greedy" and num_decodes != 1:
    raise ValueError("predict_batch: greedy decoding gives one sequence; "
                     "use num_decodes=1, or method='beam_search' or "
                     "'temperature_sample'")
  decoder_params = dict(decoder_params or {})
  unknown = sorted(set(decoder_params) - set(DECODER_PARAMS[method]))
  if unknown:
    raise ValueError(f"predict_batch: decoder_params {unknown} are not taken by method "
                     f"{method!r} (it takes {list(DECODER_PARAMS[method])}; methods: "
                     f"{DECODER_PARAMS})")
  if "topk" in decoder_params:
    decoder_params["topk"] = int(decoder_params["topk"])
  for key in ("alpha", "temperature"):
    if key in decoder_params:
      decoder_params[key] = float(decoder_params[key])
  return method, decoder_params


def cross_entropy_with_logits(logits: Array, targets: Array, z_loss: float) -> tuple[Array, Array]:
  """(loss, z_loss_term), float32 [...]: soft-target cross-entropy of logits [..., vocab] against
  `targets` [..., vocab] plus `z_loss * log(Z)^2` (included in loss). Source: T5X `losses.py`."""
  logits = logits.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
  log_softmax = logits - log_z
  loss = -jnp.sum(targets * log_softmax, axis=-1)
  z_term = z_loss * jnp.square(jnp.squeeze(log_z, axis=-1))
  return loss + z_term, z_term


def compute_weighted_cross_entropy(logits: Array,
                                   targets: Array,
                                   weights: Optional[Array],
                                   label_smoothing: float = 0.0,
                                   z_loss: float = 0.0) -> tuple[Array, Array, Array]:
  """(total_loss, z_loss_term, cross_entropy), float32 [batch, len], times `weights`, NOT summed.

  `logits` float [batch, len, vocab], `targets` int [batch, len]; label smoothing spreads its mass
  over the other vocab - 1 tokens and the smoothed target's entropy is subtracted (T5X).
  """
  vocab_size = logits.shape[-1]
  confidence = 1.0 - label_smoothing
  low_confidence = (1.0 - confidence) / (vocab_size - 1)
  normalizing_constant = -(
      confidence * np.log(confidence) +
      (vocab_size - 1) * low_confidence * np.log(low_confidence + 1e-20))
  soft_targets = jax.nn.one_hot(targets, vocab_size, dtype=jnp.float32)
  soft_targets = soft_targets * (confidence - low_confidence) + low_confidence
  total, z_term = cross_entropy_with_logits(logits, soft_targets, z_loss)
  total = total - normalizing_constant
  if weights is not None:
    total = total * weights
    z_term = z_term * weights
  return total, z_term, total - z_term


def _sum_per_sequence(weights: Array, segment_ids: Optional[Array]) -> Array:
  """float32 [batch, len]: each token's sequence weight total (a row, or a packed segment; T5X
  `losses._sum_weights_per_segment`)."""
  if segment_ids is None:
    return jnp.broadcast_to(jnp.sum(weights, axis=-1, keepdims=True), weights.shape)
  same = segment_ids[:, :, None] == segment_ids[:, None, :]
  return jnp.einsum("blm,bm->bl", same.astype(jnp.float32), weights)


class EncoderDecoderModel:
  """T5X-style wrapper of a `network.Transformer` (module docstring).

  `output_vocabulary.eos_id` is the only vocabulary use (default EOS 1). `label_smoothing` and
  `z_loss` default to T5X's (0, 1e-4). `loss_chunk_tokens`: tokens whose logits the loss and
  scoring hold at once (`losses.OutputLayer.chunk_tokens`). `loss_normalizing_factor`: None or
  'NUM_REAL_TARGET_TOKENS' (target tokens), 'NUM_TOTAL_TARGET_TOKENS' (batch x length),
  'AVERAGE_PER_SEQUENCE', or a positive constant (T5X pre-training: 2048 * 114 = 233472); names of
  T5X's `SpecialLossNormalizingFactor`, case-insensitive. Unlike T5X, None is not "no
  normalisation" (pass 1.0).
  """

  def __init__(self,
               module: network.Transformer,
               input_vocabulary: Any = None,
               output_vocabulary: Any = None,
               label_smoothing: float = 0.0,
               z_loss: float = 1e-4,
               loss_normalizing_factor: Union[None, float, str] = None,
               loss_chunk_tokens: int = losses.DEFAULT_CHUNK_TOKENS):
    """ValueError: `label_smoothing` outside [0, 1), `loss_chunk_tokens` < 1, or an unknown
    `loss_normalizing_factor`."""
    if not 0.0 <= label_smoothing < 1.0:
      raise ValueError(f"label_smoothing must be in [0, 1), got "
                       f"{label_smoothing}")
    factor = loss_normalizing_factor
    if isinstance(factor, str) and (factor.upper() in SPECIAL_LOSS_NORMALIZING_FACTORS):
      factor = factor.upper()
    elif factor is not None and (isinstance(factor, (bool, str)) or
                                 not isinstance(factor, (int, float)) or factor <= 0):
      raise ValueError("loss_normalizing_factor must be None, a positive number or one of "
                       f"{SPECIAL_LOSS_NORMALIZING_FACTORS}, got {loss_normalizing_factor!r}")
    elif factor is not None:
      factor = float(factor)
    self.module = module
    self.input_vocabulary = input_vocabulary
    self.output_vocabulary = output_vocabulary
    self.label_smoothing = float(label_smoothing)
    self.z_loss = float(z_loss)
    self.loss_normalizing_factor = factor
    tied = bool(module.config.logits_via_embedding)
    self.output_layer = losses.OutputLayer(
        transposed=tied,
        divisor=float(network.logits_divisor(module.config)) if tied else None,
        label_smoothing=self.label_smoothing,
        z_loss=self.z_loss,
        chunk_tokens=int(loss_chunk_tokens))
    self._predict_jit = jax.jit(
        self._predict_impl, static_argnames=("num_decodes", "method", "decoder_params"))

  @property
  def eos_id(self) -> int:
    """EOS id of the output vocabulary (1 without one, T5 convention)."""
    vocab = self.output_vocabulary
    return int(vocab.eos_id) if vocab is not None else 1

  # ------------------------------------------------------------------------
  # Initialisation.
  # ------------------------------------------------------------------------
  def get_initial_variables(self,
                            rng: Array,
                            input_shapes: Mapping[str, tuple],
                            input_types: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """{"params": LogicallyPartitioned-boxed tree} for `input_shapes` ("encoder_input_tokens",
    "decoder_input_tokens" [batch, len]; segment ids optional). KeyError: a required shape
    missing."""
    input_types = dict(input_types or {})
    for key in ("encoder_input_tokens", "decoder_input_tokens"):
      if key not in input_shapes:
        raise KeyError(f"get_initial_variables: input_shapes lacks {key!r} "
                       f"(got {sorted(input_shapes)})")
    enc = jnp.ones(input_shapes["encoder_input_tokens"],
                   input_types.get("encoder_input_tokens", jnp.int32))
    dec = jnp.ones(input_shapes["decoder_input_tokens"],
                   input_types.get("decoder_input_tokens", jnp.int32))
    extra = {}
    for key in _SEGMENT_KEYS:
      if key in input_shapes:
        extra[key] = jnp.ones(input_shapes[key], input_types.get(key, jnp.int32))
    variables = self.module.init({
        "params": rng,
        "dropout": jax.random.fold_in(rng, 1)
    },
                                 enc,
                                 dec,
                                 dec,
                                 enable_dropout=False,
                                 **extra)
    return {"params": variables["params"]}

  # ------------------------------------------------------------------------
  # Loss.
  # ------------------------------------------------------------------------
  def _compute_logits(self,
                      params: PyTree,
                      batch: Batch,
                      dropout_rng: Optional[Array] = None,
                      output_logits: bool = True) -> Array:
    """Teacher-forced logits float32 [batch, len, vocab], or (`output_logits=False`) the output
    layer's input [batch, len, emb_dim]."""
    rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
    extra = {k: batch[k] for k in _SEGMENT_KEYS if k in batch}
    return self.module.apply({"params": params},
                             batch["encoder_input_tokens"],
                             batch["decoder_input_tokens"],
                             batch["decoder_target_tokens"],
                             enable_dropout=dropout_rng is not None,
                             rngs=rngs,
                             output_logits=output_logits,
                             **extra)

  @staticmethod
  def _weights(batch: Batch) -> Array:
    """Token weights: `decoder_loss_weights`, else targets != 0; float32."""
    if batch.get("decoder_loss_weights") is not None:
      return batch["decoder_loss_weights"].astype(jnp.float32)
    return (batch["decoder_target_tokens"] > 0).astype(jnp.float32)

  def _loss_weights(self, batch: Batch) -> Array:
    """Weights of the loss numerator, float32 [batch, len]: the token weights,
    divided by their sequence's total for 'AVERAGE_PER_SEQUENCE'."""
    weights = self._weights(batch)
    if self.loss_normalizing_factor != "AVERAGE_PER_SEQUENCE":
      return weights
    total = _sum_per_sequence(weights, batch.get("decoder_segment_ids"))
    return jnp.where(total > 0, weights / jnp.where(total > 0, total, 1.0), 0.0)

  def loss_normalizer(self, batch: Batch) -> Array:
    """float32 scalar denominator of `batch` (module docstring): the constant; batch x length for
    'NUM_TOTAL_TARGET_TOKENS'; else the loss weights' sum (tokens, or sequences), at least 1."""
    factor = self.loss_normalizing_factor
    if isinstance(factor, float):
      return jnp.float32(factor)
    if factor == "NUM_TOTAL_TARGET_TOKENS":
      return jnp.float32(np.prod(batch["decoder_target_tokens"].shape))
    return jnp.maximum(jnp.sum(self._loss_weights(batch)), 1.0)

  def loss_fn(self,
              params: PyTree,
              batch: Batch,
              dropout_rng: Optional[Array],
              normalizer: Optional[Array] = None) -> tuple[Array, dict[str, Array]]:
    """(float32 loss = Σ weighted token losses / `normalizer`, float32 metric SUMS) teacher-forced.

    Source: T5X `BaseTransformerModel.loss_fn`; `normalizer` (default `loss_normalizer(batch)`) is
    ours, for exact microbatching. Dropout iff `dropout_rng`. Metrics: "loss", "cross_ent_loss",
    "z_loss", "accuracy_numerator", "num_tokens", "num_examples" (rows, or segments when packed).
    The values of `compute_weighted_cross_entropy` on the logits, without them (`losses`).
    """
    hidden = self._compute_logits(params, batch, dropout_rng, output_logits=False)
    targets = batch["decoder_target_tokens"]
    kernel = network.output_kernel(self.module.config, params)
    loss_sum, stats = losses.fused_loss(hidden, kernel, targets, self._loss_weights(batch),
                                        self.output_layer)
    total, ce, z_term, correct = losses.token_losses(stats, targets, self.output_layer,
                                                     self.module.config.vocab_size)
    if normalizer is None:
      normalizer = self.loss_normalizer(batch)
    loss = loss_sum / normalizer
    weights = self._weights(batch)
    if "decoder_segment_ids" in batch:
      num_examples = jnp.sum(jnp.max(batch["decoder_segment_ids"], axis=-1))
    else:
      num_examples = jnp.sum(jnp.any(weights > 0, axis=-1))
    metrics = {
        "loss": jnp.sum(total * weights),
        "cross_ent_loss": jnp.sum(ce * weights),
        "z_loss": jnp.sum(z_term * weights),
        "accuracy_numerator": jnp.sum(correct * weights),
        "num_tokens": jnp.sum(weights),
        "num_examples": num_examples.astype(jnp.float32),
    }
    return loss, metrics

  def eval_fn(self, params: PyTree, batch: Batch) -> tuple[Array, dict[str, Array]]:
    """`loss_fn` without dropout, normalised by `loss_normalizer(batch)`."""
    return self.loss_fn(params, batch, None)

  # ------------------------------------------------------------------------
  # Scoring.
  # ------------------------------------------------------------------------
  def token_scores(self, params: PyTree, batch: Batch) -> Array:
    """float32 [batch, len]: each target token's log-prob times its weight (no dropout,
    smoothing, z)."""
    hidden = self._compute_logits(params, batch, output_logits=False)
    targets = batch["decoder_target_tokens"]
    stats = losses.token_statistics(hidden, network.output_kernel(self.module.config, params),
                                    targets, self.output_layer)
    return (stats.target_logit - stats.log_z) * self._weights(batch)

  def score_batch(self, params: PyTree, batch: Batch) -> Array:
    """Sum of target token log-probs per row, float32 [batch] (T5X)."""
    return jnp.sum(self.token_scores(params, batch), axis=-1)

  # ------------------------------------------------------------------------
  # Decoding.
  # ------------------------------------------------------------------------
  def _predict_impl(self, params: PyTree, encoder_input_tokens: Array, prompt: Array,
                    rng: Optional[Array], *, num_decodes: int, method: str,
                    decoder_params: tuple[tuple[str, Any], ...]) -> tuple[Array, Array]:
    max_decode_length = prompt.shape[1]
    # Zero cache of the right shapes, without running the network.
    cache_shapes = jax.eval_shape(lambda: self.module.apply({"params": params},
                                                            encoder_input_tokens,
                                                            prompt,
                                                            prompt,
                                                            decode=True,
                                                            enable_dropout=False,
                                                            mutable=["cache"])[1]["cache"])
    cache = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), cache_shapes)
    encoded = self.module.apply({"params": params},
                                encoder_input_tokens,
                                enable_dropout=False,
                                method=self.module.encode)
    encoded = decoding.flat_batch_beam_expand(encoded, num_decodes)
    raw_inputs = decoding.flat_batch_beam_expand(encoder_input_tokens, num_decodes)
    # The cross-attention keys and values are the same at every step: projected once here, in
    # the layout the decoding loop reads (no transposed copy per step; network.cross_attention_kv).
    cross_kv = network.cross_attention_kv(self.module.config, params, encoded)

    def tokens_to_logits(state: decoding.DecodingState):
      ids = state.cur_token[:, None].astype(jnp.int32)
      logits, new_vars = self.module.apply({
          "params": params,
          "cache": state.cache
      },
                                           encoded,
                                           raw_inputs,
                                           ids,
                                           ids,
                                           enable_dropout=False,
                                           decode=True,
                                           max_decode_length=max_decode_length,
                                           cross_kv=cross_kv,
                                           mutable=["cache"],
                                           method=self.module.decode)
      return logits[:, 0, :], new_vars["cache"]

    kwargs = dict(decoder_params)
    if method == "beam_search":
      return decoding.beam_search(
          prompt, cache, tokens_to_logits, self.eos_id, num_decodes=num_decodes, **kwargs)
    if method == "greedy":
      kwargs = {"temperature": 0.0}
    return decoding.temperature_sample(
        prompt,
        cache,
        tokens_to_logits,
        self.eos_id,
        decode_rng=rng,
        num_decodes=num_decodes,
        **kwargs)

  def predict_batch_with_aux(
      self,
      params: PyTree,
      batch: Batch,
      rng: Optional[Array] = None,
      *,
      decoder_params: Optional[Mapping[str, Any]] = None,
      return_all_decodes: bool = False,
      num_decodes: int = 1,
      prompt_with_targets: bool = False,
      method: Optional[str] = None,
      max_decode_length: Optional[int] = None) -> tuple[Array, dict[str, Array]]:
    """(tokens int32 [B, L] or [B, num_decodes, L], {"scores": float32 [B] or [B, num_decodes]}).

    Source: T5X `EncoderDecoderModel.predict_batch_with_aux`, same names; `method` ("greedy",
    "beam_search", "temperature_sample") is chosen per call (T5X: `decode_fn`). L is
    `decoder_input_tokens`' length unless `max_decode_length`; `prompt_with_targets` forces it less
    EOS. `decoder_params`: beam_search {"alpha"}, temperature_sample {"temperature", "topk"}. No
    BOS, 0 after EOS; scores are untempered log-prob sums (T5X `rescale_log_probs=False`), for beams
    / brevity penalty. ValueError: packed batches, a bad method or keys, sampling without `rng`, no
    decode length, `prompt_with_targets` without targets or with another length.
    """
    if "encoder_segment_ids" in batch:
      raise ValueError("predict_batch: packed batches are not supported")
    method, decoder_params = check_decode_options(num_decodes, method, decoder_params)
    samples = method == "temperature_sample" and (decoder_params.get("temperature", 1.0) != 0.0 and
                                                  decoder_params.get("topk", 0) != 1)
    if samples and rng is None:
      raise ValueError("predict_batch: method 'temperature_sample' samples; "
                       "pass rng=jax.random.PRNGKey(...)")
    encoder_input_tokens = jnp.asarray(batch["encoder_input_tokens"], jnp.int32)
    batch_size = encoder_input_tokens.shape[0]
    if prompt_with_targets:
      if "decoder_input_tokens" not in batch:
        raise ValueError("predict_batch: prompt_with_targets needs "
                         "decoder_input_tokens")
      prompt = jnp.asarray(batch["decoder_input_tokens"], jnp.int32)
      if max_decode_length not in (None, prompt.shape[1]):
        raise ValueError(f"predict_batch: max_decode_length={max_decode_length} differs "
                         f"from the prompt length {prompt.shape[1]}")
      prompt = jnp.where(prompt == self.eos_id, 0, prompt)
    else:
      if max_decode_length is None and "decoder_input_tokens" not in batch:
        raise ValueError("predict_batch: give max_decode_length or a batch "
                         "with decoder_input_tokens (whose length is the "
                         "default)")
      length = int(max_decode_length or batch["decoder_input_tokens"].shape[1])
      prompt = jnp.zeros((batch_size, length), jnp.int32)
    decodes, scores = self._predict_jit(
        params,
        encoder_input_tokens,
        prompt,
        rng if samples else None,
        num_decodes=int(num_decodes),
        method=method,
        decoder_params=tuple(sorted(decoder_params.items())))
    if return_all_decodes:
      return decodes, {"scores": scores}
    return decodes[:, -1, :], {"scores": scores[:, -1]}

  def predict_batch(self,
                    params: PyTree,
                    batch: Batch,
                    rng: Optional[Array] = None,
                    **kwargs: Any) -> Array:
    """int32 [B, L] (or [B, num_decodes, L]) tokens of `predict_batch_with_aux`."""
    return self.predict_batch_with_aux(params, batch, rng, **kwargs)[0]


def unbox(variables: PyTree) -> PyTree:
  """Plain arrays from `nn.LogicallyPartitioned` boxes (`nn.unbox`)."""
  return nn.unbox(variables)


__all__ = [
    "DECODER_PARAMS", "EncoderDecoderModel", "SPECIAL_LOSS_NORMALIZING_FACTORS",
    "check_decode_options", "compute_weighted_cross_entropy", "cross_entropy_with_logits", "unbox"
]
