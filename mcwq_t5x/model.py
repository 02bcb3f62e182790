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

"""`EncoderDecoderModel`: loss, decoding and scoring around `network.Transformer`.

A lean counterpart of T5X's `t5x/models.py::EncoderDecoderModel`:

* `loss_fn`: teacher-forced cross-entropy with T5X's semantics
  (`t5x/losses.py::compute_weighted_cross_entropy`): label smoothing with the
  entropy of the smoothed distribution subtracted (so a perfect model has loss
  0), auxiliary z-loss `z_loss * log(Z)^2` per token (Chowdhery et al. 2022 /
  Mesh TF) added to the loss, per-token weights from `decoder_loss_weights`,
  and the summed loss divided by a loss normalizing factor (a constant such as
  T5X's pre-training batch x length, or by default the number of target
  tokens of the batch). Metrics are unnormalised SUMS over tokens, so a
  trainer can add them over microbatches and normalise once.
* `predict_batch` / `predict_batch_with_aux`: greedy decoding or beam search
  with the flax `cache` collection (one decoder position per step) through
  `mcwq_t5x.decoding`, inside `jax.jit`.
* `score_batch`: sum of target token log-probabilities.

Batches use the keys of seqio's `EncDecFeatureConverter`:
`encoder_input_tokens`, `decoder_input_tokens`, `decoder_target_tokens`,
`decoder_loss_weights` and, when packed, `encoder_segment_ids`,
`decoder_segment_ids`, `encoder_positions`, `decoder_positions`. PAD = 0,
EOS = 1, decoder BOS = 0 (T5 convention).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mcwq_t5x import decoding
from mcwq_t5x import network

Array = jax.Array
Batch = Mapping[str, Array]
PyTree = Any

_PACKING_KEYS = ("encoder_segment_ids", "decoder_segment_ids",
                 "encoder_positions", "decoder_positions")


def cross_entropy_with_logits(logits: Array, targets: Array,
                              z_loss: float) -> tuple[Array, Array]:
  """Per-token soft-target cross-entropy plus z-loss (T5X `losses.py`).

  Args:
    logits: float [..., vocab].
    targets: float [..., vocab] target distribution.
    z_loss: coefficient of log(Z)^2, Z = sum(exp(logits)).

  Returns:
    (loss, z_loss_term), both float32 [...]; `loss` already includes
    `z_loss_term`.
  """
  logits = logits.astype(jnp.float32)
  log_z = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
  log_softmax = logits - log_z
  loss = -jnp.sum(targets * log_softmax, axis=-1)
  z_term = z_loss * jnp.square(jnp.squeeze(log_z, axis=-1))
  return loss + z_term, z_term


def compute_weighted_cross_entropy(
    logits: Array, targets: Array, weights: Optional[Array],
    label_smoothing: float = 0.0, z_loss: float = 0.0
) -> tuple[Array, Array, Array]:
  """Token-level losses with label smoothing, T5X conventions, NOT summed.

  Args:
    logits: float [batch, len, vocab].
    targets: int [batch, len].
    weights: float [batch, len] or None (all ones).
    label_smoothing: mass spread uniformly over the other vocab - 1 tokens.
    z_loss: z-loss coefficient.

  Returns:
    (total_loss, z_loss_term, cross_entropy) float32 [batch, len], each
    multiplied by `weights`; total = cross_entropy + z_loss_term, where
    cross_entropy has the entropy of the smoothed target subtracted.
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


class EncoderDecoderModel:
  """T5X-style wrapper of a `network.Transformer` (see module docstring).

  Attributes:
    module: the flax module.
    input_vocabulary, output_vocabulary: optional seqio-like vocabularies
      (only `output_vocabulary.eos_id` is used; default EOS id 1).
    label_smoothing: label smoothing mass (T5X default 0).
    z_loss: z-loss coefficient (T5X default 1e-4).
    loss_normalizing_factor: None = number of target tokens (sum of
      `decoder_loss_weights`) of the batch; a float = that constant (T5X's
      pre-training batch x target length, e.g. 2048 * 114 = 233472).
  """

  def __init__(self, module: network.Transformer, input_vocabulary: Any = None,
               output_vocabulary: Any = None, label_smoothing: float = 0.0,
               z_loss: float = 1e-4,
               loss_normalizing_factor: Optional[float] = None):
    if not 0.0 <= label_smoothing < 1.0:
      raise ValueError(f"label_smoothing must be in [0, 1), got "
                       f"{label_smoothing}")
    if loss_normalizing_factor is not None and (
        isinstance(loss_normalizing_factor, bool) or
        not isinstance(loss_normalizing_factor, (int, float)) or
        loss_normalizing_factor <= 0):
      raise ValueError("loss_normalizing_factor must be None or a positive "
                       f"number, got {loss_normalizing_factor!r}")
    self.module = module
    self.input_vocabulary = input_vocabulary
    self.output_vocabulary = output_vocabulary
    self.label_smoothing = float(label_smoothing)
    self.z_loss = float(z_loss)
    self.loss_normalizing_factor = (None if loss_normalizing_factor is None
                                    else float(loss_normalizing_factor))
    self._predict_jit = jax.jit(
        self._predict_impl,
        static_argnames=("num_decodes", "alpha", "max_decode_length",
                         "method"))

  @property
  def eos_id(self) -> int:
    """EOS id of the output vocabulary (1 without one, T5 convention)."""
    vocab = self.output_vocabulary
    return int(vocab.eos_id) if vocab is not None else 1

  # ------------------------------------------------------------------------
  # Initialisation.
  # ------------------------------------------------------------------------
  def get_initial_variables(self, rng: Array,
                            input_shapes: Mapping[str, tuple],
                            input_types: Optional[Mapping[str, Any]] = None
                            ) -> dict[str, Any]:
    """Initial variables {"params": LogicallyPartitioned-boxed tree}.

    Args:
      rng: PRNG key.
      input_shapes: at least "encoder_input_tokens" and "decoder_input_tokens"
        ([batch, len]); segment ids/positions shapes optional.
      input_types: optional dtypes per key (default int32).

    Raises:
      KeyError: a required shape is missing.
    """
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
    for key in _PACKING_KEYS:
      if key in input_shapes:
        extra[key] = jnp.ones(input_shapes[key],
                              input_types.get(key, jnp.int32))
    variables = self.module.init(
        {"params": rng, "dropout": jax.random.fold_in(rng, 1)}, enc, dec, dec,
        enable_dropout=False, **extra)
    return {"params": variables["params"]}

  # ------------------------------------------------------------------------
  # Loss.
  # ------------------------------------------------------------------------
  def _compute_logits(self, params: PyTree, batch: Batch,
                      dropout_rng: Optional[Array] = None) -> Array:
    rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
    extra = {k: batch[k] for k in _PACKING_KEYS if k in batch}
    return self.module.apply(
        {"params": params}, batch["encoder_input_tokens"],
        batch["decoder_input_tokens"], batch["decoder_target_tokens"],
        enable_dropout=dropout_rng is not None, rngs=rngs, **extra)

  @staticmethod
  def _weights(batch: Batch) -> Array:
    if "decoder_loss_weights" in batch and batch[
        "decoder_loss_weights"] is not None:
      return batch["decoder_loss_weights"].astype(jnp.float32)
    return (batch["decoder_target_tokens"] > 0).astype(jnp.float32)

  def _loss_and_metrics(self, logits: Array, batch: Batch
                        ) -> tuple[Array, dict[str, Array]]:
    targets = batch["decoder_target_tokens"]
    weights = self._weights(batch)
    total, z_term, ce = compute_weighted_cross_entropy(
        logits, targets, weights, self.label_smoothing, self.z_loss)
    num_tokens = jnp.sum(weights)
    if self.loss_normalizing_factor is None:
      factor = jnp.maximum(num_tokens, 1.0)
    else:
      factor = jnp.float32(self.loss_normalizing_factor)
    loss_sum = jnp.sum(total)
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    if "decoder_segment_ids" in batch:
      num_examples = jnp.sum(jnp.max(batch["decoder_segment_ids"], axis=-1))
    else:
      num_examples = jnp.sum(jnp.any(weights > 0, axis=-1))
    metrics = {
        "loss": loss_sum,
        "cross_ent_loss": jnp.sum(ce),
        "z_loss": jnp.sum(z_term),
        "accuracy_numerator": jnp.sum(correct * weights),
        "num_tokens": num_tokens,
        "num_examples": num_examples.astype(jnp.float32),
    }
    return loss_sum / factor, metrics

  def loss_fn(self, params: PyTree, batch: Batch,
              dropout_rng: Optional[Array]) -> tuple[Array, dict[str, Array]]:
    """Teacher-forced loss (dropout on iff `dropout_rng` is given).

    Args:
      params: unboxed params.
      batch: feature-converter batch (see module docstring).
      dropout_rng: PRNG key for dropout, or None for a deterministic pass.

    Returns:
      (loss, metrics): loss = summed weighted token loss (cross-entropy +
      z-loss) / loss normalizing factor, float32 scalar; metrics = SUMS over
      the batch's tokens: "loss" (summed token loss incl. z-loss, not
      normalised), "cross_ent_loss", "z_loss", "accuracy_numerator" (correct
      argmax tokens, weighted), "num_tokens" (sum of weights),
      "num_examples" (non-empty rows, or segments when packed).
    """
    logits = self._compute_logits(params, batch, dropout_rng)
    return self._loss_and_metrics(logits, batch)

  def eval_fn(self, params: PyTree, batch: Batch
              ) -> tuple[Array, dict[str, Array]]:
    """`loss_fn` without dropout."""
    return self.loss_fn(params, batch, None)

  # ------------------------------------------------------------------------
  # Scoring.
  # ------------------------------------------------------------------------
  def token_scores(self, params: PyTree, batch: Batch) -> Array:
    """Log-probability of every target token times its weight, [batch, len].

    No dropout, no label smoothing, no z-loss.
    """
    logits = self._compute_logits(params, batch).astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    targets = batch["decoder_target_tokens"]
    token_lp = jnp.take_along_axis(log_probs, targets[..., None].astype(
        jnp.int32), axis=-1)[..., 0]
    return token_lp * self._weights(batch)

  def score_batch(self, params: PyTree, batch: Batch) -> Array:
    """Sum of target token log-probs per row, float32 [batch] (T5X)."""
    return jnp.sum(self.token_scores(params, batch), axis=-1)

  # ------------------------------------------------------------------------
  # Decoding.
  # ------------------------------------------------------------------------
  def _predict_impl(self, params: PyTree, encoder_input_tokens: Array,
                    decoder_input_tokens: Array, rng: Optional[Array], *,
                    num_decodes: int, alpha: float, max_decode_length: int,
                    method: str) -> tuple[Array, Array]:
    batch_size = encoder_input_tokens.shape[0]
    target_shape = (batch_size, max_decode_length)
    # Zero cache of the right shapes, without running the network.
    cache_shapes = jax.eval_shape(
        lambda: self.module.apply(
            {"params": params}, encoder_input_tokens,
            jnp.ones(target_shape, jnp.int32),
            jnp.ones(target_shape, jnp.int32), decode=True,
            enable_dropout=False, mutable=["cache"])[1]["cache"])
    cache = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype),
                                   cache_shapes)
    encoded = self.module.apply({"params": params}, encoder_input_tokens,
                                enable_dropout=False,
                                method=self.module.encode)
    encoded = decoding.flat_batch_beam_expand(encoded, num_decodes)
    raw_inputs = decoding.flat_batch_beam_expand(encoder_input_tokens,
                                                 num_decodes)

    def tokens_to_logits(state: decoding.DecodingState):
      ids = state.cur_token[:, None].astype(jnp.int32)
      logits, new_vars = self.module.apply(
          {"params": params, "cache": state.cache}, encoded, raw_inputs, ids,
          ids, enable_dropout=False, decode=True,
          max_decode_length=max_decode_length, mutable=["cache"],
          method=self.module.decode)
      return logits[:, 0, :], new_vars["cache"]

    prompt = jnp.zeros(target_shape, decoder_input_tokens.dtype)
    if method == "beam":
      return decoding.beam_search(prompt, cache, tokens_to_logits,
                                  self.eos_id, num_decodes=num_decodes,
                                  alpha=alpha)
    if method == "greedy":
      return decoding.temperature_sample(
          prompt, cache, tokens_to_logits, self.eos_id,
          num_decodes=num_decodes, temperature=0.0, topk=1)
    raise ValueError(f"unknown decoding method {method!r}")

  def predict_batch_with_aux(
      self, params: PyTree, batch: Batch, rng: Optional[Array] = None, *,
      num_decodes: int = 1, alpha: float = 0.6,
      max_decode_length: Optional[int] = None,
      return_all_decodes: bool = False, method: Optional[str] = None
  ) -> tuple[Array, dict[str, Array]]:
    """Decodes a batch with the KV cache; returns tokens and scores.

    Args:
      params: unboxed params.
      batch: needs "encoder_input_tokens" [B, in_len]; "decoder_input_tokens"
        [B, L] is optional (only its length is used, as the default decode
        length).
      rng: unused (greedy and beam search are deterministic).
      num_decodes: beam size (1 = greedy).
      alpha: beam-search length penalty exponent ((5+len)/6)^alpha.
      max_decode_length: decode length (default L).
      return_all_decodes: return all beams [B, num_decodes, len] (ascending
        score, best last) instead of the best [B, len].
      method: "greedy" or "beam"; default greedy if num_decodes == 1 else
        beam.

    Returns:
      (tokens int32, {"scores": float32}): tokens after EOS are 0 and the
      BOS is not included. Greedy scores are summed log-probs; beam scores
      are summed log-probs / brevity penalty.

    Raises:
      ValueError: packed batches (segment ids) or bad arguments.
    """
    del rng
    if "encoder_segment_ids" in batch:
      raise ValueError("predict_batch: packed batches are not supported")
    if num_decodes < 1:
      raise ValueError(f"num_decodes must be >= 1, got {num_decodes}")
    if method is None:
      method = "greedy" if num_decodes == 1 else "beam"
    if max_decode_length is None and "decoder_input_tokens" not in batch:
      raise ValueError("predict_batch: give max_decode_length or a batch with "
                       "decoder_input_tokens (whose length is the default)")
    length = int(max_decode_length or batch["decoder_input_tokens"].shape[1])
    encoder_input_tokens = jnp.asarray(batch["encoder_input_tokens"],
                                       jnp.int32)
    decodes, scores = self._predict_jit(
        params, encoder_input_tokens,
        jnp.zeros((encoder_input_tokens.shape[0], length), jnp.int32), None,
        num_decodes=int(num_decodes), alpha=float(alpha),
        max_decode_length=length, method=method)
    if return_all_decodes:
      return decodes, {"scores": scores}
    return decodes[:, -1, :], {"scores": scores[:, -1]}

  def predict_batch(self, params: PyTree, batch: Batch,
                    rng: Optional[Array] = None, *, num_decodes: int = 1,
                    alpha: float = 0.6,
                    max_decode_length: Optional[int] = None,
                    return_all_decodes: bool = False,
                    method: Optional[str] = None) -> Array:
    """Tokens of `predict_batch_with_aux` (int32 [B, L] or [B, n, L])."""
    return self.predict_batch_with_aux(
        params, batch, rng, num_decodes=num_decodes, alpha=alpha,
        max_decode_length=max_decode_length,
        return_all_decodes=return_all_decodes, method=method)[0]


def unbox(variables: PyTree) -> PyTree:
  """Plain arrays from `nn.LogicallyPartitioned` boxes (`nn.unbox`)."""
  return nn.unbox(variables)


__all__ = ["EncoderDecoderModel", "compute_weighted_cross_entropy",
           "cross_entropy_with_logits", "unbox"]
