"""The output layer fused with its cross-entropy: loss, gradient and metrics without the logits.

At mT5's shapes the logits are [batch, length, 250112] float32 (12.3 GB at batch 24, 512 tokens):
T5X's `compute_weighted_cross_entropy` builds them, a one-hot of the targets of the same size and
both gradients. Here the output projection and the loss are one computation over chunks of the
target positions (every row of the batch, `OutputLayer.chunk_tokens` tokens a chunk): each chunk's
logits live only inside one step of a `lax.scan`, which reduces them to four float32 statistics a
token (`TokenStatistics`) and, under differentiation, to their gradient, so no array of batch x
length x vocab elements exists (Wijmans et al. 2024, Cut Cross-Entropy; Liger Kernel's fused linear
cross-entropy: the gradient computed in the forward pass, the backward pass scales it).

The loss is T5X's (`t5x/losses.py`): label smoothing over the other vocab - 1 pieces less the
smoothed distribution's entropy, z-loss `z_loss * log(Z)^2` (Chowdhery et al. 2022). The token
accuracy is `argmax(logits) == target` with `jnp.argmax`'s ties (the first maximal index). The
vocabulary axis keeps its logical name ("vocab"), so a kernel sharded over `model` stays sharded.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Optional

import flax.linen as nn
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

# Tokens of one chunk by default: 256 x 250,112 float32 logits are 256 MB (mT5's vocabulary).
DEFAULT_CHUNK_TOKENS = 256


@dataclasses.dataclass(frozen=True)
class OutputLayer:
  """The static description of an output layer and its loss (hashable: a `custom_vjp` argument).

  `transposed`: the kernel is [vocab, embed] (the tied embedding of T5 1.0), else [embed, vocab]
  (mT5's `logits_dense`). `divisor`: logits = hidden @ kernel / divisor (tied: sqrt(emb_dim)), or
  None. `label_smoothing` in [0, 1), `z_loss` >= 0 (T5X's). `chunk_tokens`: tokens (batch rows x
  target positions) a chunk at most; a chunk holds every row and at least one position.
  """
  transposed: bool = False
  divisor: Optional[float] = None
  label_smoothing: float = 0.0
  z_loss: float = 0.0
  chunk_tokens: int = DEFAULT_CHUNK_TOKENS

  def __post_init__(self):
    if not 0.0 <= self.label_smoothing < 1.0:
      raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
    if int(self.chunk_tokens) < 1:
      raise ValueError(f"chunk_tokens must be >= 1, got {self.chunk_tokens}")

  @property
  def kernel_axes(self) -> tuple[str, str]:
    """The kernel's logical axis names."""
    return ("vocab", "embed") if self.transposed else ("embed", "vocab")


class TokenStatistics(NamedTuple):
  """What the loss and the metrics need of a token's logits, each [batch, length].

  `log_z` float32 log-sum-exp; `target_logit` float32; `log_prob_sum` float32 sum over the
  vocabulary of log-softmax (label smoothing's term); `argmax` int32 first maximal index.
  """
  log_z: Array
  target_logit: Array
  log_prob_sum: Array
  argmax: Array


class TokenLosses(NamedTuple):
  """float32 [batch, length] per-token terms, unweighted: `total` (= cross_ent + z),
  `cross_ent` (smoothed, less the smoothed target's entropy), `z_loss`, `correct` (0/1)."""
  total: Array
  cross_ent: Array
  z_loss: Array
  correct: Array


def _smoothing(layer: OutputLayer, vocab_size: int) -> tuple[float, float, float]:
  """(confidence, low_confidence, normalizing_constant) of T5X's label smoothing."""
  confidence = 1.0 - layer.label_smoothing
  low = (1.0 - confidence) / (vocab_size - 1)
  constant = -(confidence * np.log(confidence) + (vocab_size - 1) * low * np.log(low + 1e-20))
  return confidence, low, float(constant)


def token_losses(stats: TokenStatistics, targets: Array, layer: OutputLayer,
                 vocab_size: int) -> TokenLosses:
  """Per-token loss terms (`TokenLosses`) of `stats` and int `targets` [batch, length] (T5X
  `compute_weighted_cross_entropy`'s values, unweighted)."""
  confidence, low, constant = _smoothing(layer, vocab_size)
  log_p = stats.target_logit - stats.log_z
  if layer.label_smoothing:
    cross_ent = -(confidence - low) * log_p - low * stats.log_prob_sum - constant
  else:  # why: T5X's formula is then exactly -log_p (every other term is 0)
    cross_ent = -log_p
  z_term = layer.z_loss * jnp.square(stats.log_z)
  correct = (stats.argmax == targets).astype(jnp.float32)
  return TokenLosses(cross_ent + z_term, cross_ent, z_term, correct)


# ---------------------------------------------------------------------------------------------
# One chunk.
# ---------------------------------------------------------------------------------------------
def _chunk_logits(hidden: Array, kernel: Array, layer: OutputLayer) -> Array:
  """float32 logits [batch, chunk, vocab] of `hidden` [batch, chunk, embed] (any float dtype)."""
  h = hidden.astype(jnp.float32)  # why: the output layer runs in float32 (T5X's logits_dense)
  k = kernel.astype(jnp.float32)
  contract = ((2,), (1,)) if layer.transposed else ((2,), (0,))
  logits = lax.dot_general(h, k, (contract, ((), ())))
  if layer.divisor is not None:
    logits = logits / jnp.float32(layer.divisor)
  return nn.with_logical_constraint(logits, ("batch", "length", "vocab"))


def _chunk_statistics(logits: Array, targets: Array) -> TokenStatistics:
  """`TokenStatistics` [batch, chunk] of float32 logits [batch, chunk, vocab]."""
  vocab_size = logits.shape[-1]
  m = jnp.max(logits, axis=-1, keepdims=True)
  iota = lax.broadcasted_iota(jnp.int32, logits.shape, 2)
  shifted = logits - m
  sum_exp = jnp.sum(jnp.exp(shifted), axis=-1)
  log_sum_exp = jnp.log(sum_exp)
  # why the shifted sum: sum(logits) - V * log Z loses digits to cancellation at V = 250,112
  log_prob_sum = jnp.sum(shifted, axis=-1) - vocab_size * log_sum_exp
  target_logit = jnp.sum(jnp.where(iota == targets[..., None], logits, 0.0), axis=-1)
  # why a min over the maximal indices: jnp.argmax's tie (the first), without a variadic reduce
  argmax = jnp.min(jnp.where(logits == m, iota, vocab_size), axis=-1)
  return TokenStatistics(m[..., 0] + log_sum_exp, target_logit, log_prob_sum, argmax)


def _chunk_logit_gradient(logits: Array, stats: TokenStatistics, targets: Array, weights: Array,
                          layer: OutputLayer) -> Array:
  """d(sum of weights x total loss)/d logits, float32 [batch, chunk, vocab]: weights x (softmax x
  (1 + 2 z log Z) - smoothed one-hot)."""
  confidence, low, _ = _smoothing(layer, logits.shape[-1])
  probs = jnp.exp(logits - stats.log_z[..., None])
  scale = 1.0 + 2.0 * layer.z_loss * stats.log_z
  iota = lax.broadcasted_iota(jnp.int32, logits.shape, 2)
  soft = jnp.where(iota == targets[..., None], confidence, low)
  grad = (probs * scale[..., None] - soft) * weights[..., None]
  if layer.divisor is not None:
    grad = grad / jnp.float32(layer.divisor)
  return nn.with_logical_constraint(grad, ("batch", "length", "vocab"))


def _chunk_gradients(hidden: Array, kernel: Array, grad_logits: Array,
                     layer: OutputLayer) -> tuple[Array, Array]:
  """(d hidden float32 [batch, chunk, embed], d kernel float32 in the kernel's layout) of the
  chunk's logit gradient."""
  h = hidden.astype(jnp.float32)
  k = kernel.astype(jnp.float32)
  if layer.transposed:  # kernel [vocab, embed]
    d_hidden = jnp.einsum("btv,ve->bte", grad_logits, k)
    d_kernel = jnp.einsum("btv,bte->ve", grad_logits, h)
  else:  # kernel [embed, vocab]
    d_hidden = jnp.einsum("btv,ev->bte", grad_logits, k)
    d_kernel = jnp.einsum("bte,btv->ev", h, grad_logits)
  d_hidden = nn.with_logical_constraint(d_hidden, ("batch", "length", "embed"))
  return d_hidden, nn.with_logical_constraint(d_kernel, layer.kernel_axes)


# ---------------------------------------------------------------------------------------------
# Chunks.
# ---------------------------------------------------------------------------------------------
def _chunked(x: Array, positions: int, pad_value=0) -> Array:
  """[batch, length, ...] -> [chunks, batch, positions, ...], the length padded with
  `pad_value`."""
  batch, length = x.shape[:2]
  chunks = -(-length // positions)
  pad = chunks * positions - length
  if pad:
    x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2), constant_values=pad_value)
  x = x.reshape((batch, chunks, positions) + x.shape[2:])
  return jnp.moveaxis(x, 1, 0)


def _unchunked(x: Array, length: int) -> Array:
  """[chunks, batch, positions, ...] -> [batch, length, ...] (the padding dropped)."""
  x = jnp.moveaxis(x, 0, 1)
  x = x.reshape((x.shape[0], x.shape[1] * x.shape[2]) + x.shape[3:])
  return x[:, :length]


def _positions_per_chunk(batch: int, length: int, layer: OutputLayer) -> int:
  return max(1, min(length, int(layer.chunk_tokens) // max(batch, 1)))


def token_statistics(hidden: Array, kernel: Array, targets: Array,
                     layer: OutputLayer) -> TokenStatistics:
  """`TokenStatistics` [batch, length] of the logits of `hidden` [batch, length, embed] (any float
  dtype) through `kernel` (`layer.kernel_axes`) against int `targets` [batch, length], one chunk
  of logits at a time. Not differentiable (`fused_loss` is)."""
  batch, length = targets.shape
  positions = _positions_per_chunk(batch, length, layer)

  def step(_, xs):
    h, t = xs
    return None, _chunk_statistics(_chunk_logits(h, kernel, layer), t)

  _, stats = lax.scan(step, None, (_chunked(hidden, positions), _chunked(targets, positions)))
  return TokenStatistics(*(_unchunked(s, length) for s in stats))


def _statistics_and_gradients(hidden, kernel, targets, weights, layer):
  """(TokenStatistics, d hidden float32 [batch, length, embed], d kernel float32) of the sum of
  `weights` x total loss, in one pass over the chunks."""
  batch, length = targets.shape
  positions = _positions_per_chunk(batch, length, layer)

  def step(d_kernel, xs):
    h, t, w = xs
    logits = _chunk_logits(h, kernel, layer)
    stats = _chunk_statistics(logits, t)
    d_h, d_k = _chunk_gradients(h, kernel, _chunk_logit_gradient(logits, stats, t, w, layer), layer)
    return d_kernel + d_k, (stats, d_h)

  zeros = nn.with_logical_constraint(jnp.zeros(kernel.shape, jnp.float32), layer.kernel_axes)
  d_kernel, (stats, d_hidden) = lax.scan(step, zeros,
                                         (_chunked(hidden, positions), _chunked(targets, positions),
                                          _chunked(weights.astype(jnp.float32), positions)))
  stats = TokenStatistics(*(_unchunked(s, length) for s in stats))
  return stats, _unchunked(d_hidden, length), d_kernel


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _fused(hidden, kernel, targets, weights, layer):
  stats = token_statistics(hidden, kernel, targets, layer)
  total = token_losses(stats, targets, layer, _vocab_size(kernel, layer)).total
  return jnp.sum(total * weights), stats


def _fused_fwd(hidden, kernel, targets, weights, layer):
  stats, d_hidden, d_kernel = _statistics_and_gradients(hidden, kernel, targets, weights, layer)
  total = token_losses(stats, targets, layer, _vocab_size(kernel, layer)).total
  residuals = (d_hidden, d_kernel, total, jnp.zeros((), hidden.dtype), jnp.zeros((), kernel.dtype))
  return (jnp.sum(total * weights), stats), residuals


def _fused_bwd(layer, residuals, cotangents):
  del layer
  d_hidden, d_kernel, total, hidden_zero, kernel_zero = residuals
  g = cotangents[0]  # why only the sum's: `fused_loss` stops the statistics' gradient
  return ((g * d_hidden).astype(hidden_zero.dtype), (g * d_kernel).astype(kernel_zero.dtype), None,
          g * total)


_fused.defvjp(_fused_fwd, _fused_bwd)


def _vocab_size(kernel: Array, layer: OutputLayer) -> int:
  return int(kernel.shape[0] if layer.transposed else kernel.shape[1])


def fused_loss(hidden: Array, kernel: Array, targets: Array, weights: Array,
               layer: OutputLayer) -> tuple[Array, TokenStatistics]:
  """(float32 Σ weights x total token loss, `TokenStatistics` without gradient) of the output layer
  `kernel` on `hidden` [batch, length, embed] against int `targets` [batch, length].

  Differentiable in `hidden`, `kernel` and `weights` (float [batch, length]); under `jax.grad`
  one pass over the chunks computes the loss and its gradient (3 products of the output layer,
  as unfused). The statistics give the metrics (`token_losses`) and carry no gradient.
  """
  loss_sum, stats = _fused(hidden, kernel, targets, weights.astype(jnp.float32), layer)
  return loss_sum, jax.tree_util.tree_map(lax.stop_gradient, stats)


__all__ = [
    "DEFAULT_CHUNK_TOKENS", "OutputLayer", "TokenLosses", "TokenStatistics", "fused_loss",
    "token_losses", "token_statistics"
]
