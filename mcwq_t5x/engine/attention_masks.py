"""Attention masks of the T5 network (T5X `layers.make_attention_mask` / `make_decoder_mask`).

Masks are [batch, 1, q_len, kv_len] in a float `dtype`, 1 = attend; masked logits are set to
`mask_value(dtype)` in place (`mask_logits`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

Array = jax.Array
DType = Any


def make_attention_mask(query_input: Array,
                        key_input: Array,
                        pairwise_fn: Callable[..., Any] = jnp.multiply,
                        dtype: DType = jnp.float32) -> Array:
  """Mask [batch, 1, q_len, kv_len] (`dtype`, 1 = attend) = pairwise_fn(query[:, :, None],
  key[:, None, :]) of [batch, q_len] and [batch, kv_len] (multiply: padding; equal: segments)."""
  mask = pairwise_fn(query_input[..., :, None], key_input[..., None, :])
  return mask[..., None, :, :].astype(dtype)


def make_causal_mask(x: Array, dtype: DType = jnp.float32) -> Array:
  """Causal mask [batch, 1, len, len] for [batch, len] inputs (key <= query)."""
  idxs = jnp.broadcast_to(jnp.arange(x.shape[-1], dtype=jnp.int32), x.shape)
  return make_attention_mask(idxs, idxs, jnp.greater_equal, dtype)


def combine_masks(*masks: Optional[Array], dtype: DType = jnp.float32):
  """Logical AND of the non-None masks (None if all are None)."""
  masks = [m for m in masks if m is not None]
  if not masks:
    return None
  mask = masks[0]
  for other in masks[1:]:
    mask = jnp.logical_and(mask, other)
  return mask.astype(dtype)


def make_decoder_mask(decoder_target_tokens: Array,
                      dtype: DType,
                      decoder_segment_ids: Optional[Array] = None) -> Array:
  """[batch, 1, len, len] mask: causal AND non-padding (`decoder_target_tokens` int [batch, len],
  0 = pad) AND same segment (`decoder_segment_ids` [batch, len] or None)."""
  causal = make_causal_mask(decoder_target_tokens, dtype)
  padding = make_attention_mask(decoder_target_tokens > 0, decoder_target_tokens > 0, dtype=dtype)
  segment = None
  if decoder_segment_ids is not None:
    segment = make_attention_mask(decoder_segment_ids, decoder_segment_ids, jnp.equal, dtype)
  return combine_masks(causal, padding, segment, dtype=dtype)


def mask_value(dtype: DType) -> Array:
  """The logit of masked attention positions: a scalar `jnp.finfo(dtype).min` of float `dtype`."""
  # why not T5X's -1e10: it overflows to -inf in float16 (max 65504), and a fully masked row (a
  # padding query) becomes NaN after the softmax; Flax's `dot_product_attention_weights` agrees.
  return jnp.asarray(jnp.finfo(dtype).min, dtype)


def mask_logits(logits: Array, mask: Array) -> Array:
  """`logits` [batch, heads, q_len, kv_len] (any float dtype) with `mask_value` where `mask`
  (broadcastable, e.g. [batch or 1, 1, q_len, kv_len]; > 0 = attend) is not; same shape, dtype."""
  # why in place, not added as a bias: min + a negative relative bias overflows to -inf in
  # float16; in place, masked keys get weight exactly 0 and a fully masked row stays finite.
  return jnp.where(mask > 0, logits, mask_value(logits.dtype))
