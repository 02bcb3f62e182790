"""Model-agnostic autoregressive decoding in pure JAX: greedy, temperature sampling, beam search.

This module follows the design and conventions of T5X's `t5x/decoding.py` (Roberts et al. 2022,
"Scaling Up Models and Data with t5x and seqio"), re-implemented here because T5X itself is not
installable. Nothing here imports TensorFlow or SeqIO; everything is `jax.jit`-able (the decoding
loops are `jax.lax.while_loop`s with an early exit).

Conventions (identical to T5X):

* `inputs` is the decoder prompt, int32 `[batch, max_decode_len]`, laid out like the decoder
  input tokens (shifted right by one, as `seqio.EncDecFeatureConverter`'s `decoder_input_tokens`):
  `inputs[:, 0]` is the BOS slot (ignored: decoding starts from the BOS/pad id 0 at decoder
  position 0), and a non-zero `inputs[:, j]`, j >= 1, forces returned position `j - 1`; zeros
  are decoded. An all-zero `inputs` decodes from scratch (the usual encoder-decoder case).
  Example: `inputs = [0, 5, 6, 0, 0]` returns `[5, 6, a, b, c]` with `a, b, c` decoded.
* The returned sequences do not include the initial BOS: returned position `j` is decoder
  position `j + 1`, i.e. they are laid out like `decoder_target_tokens`.
* `eos_id` ends a sequence. Only a *decoded* EOS ends it (an EOS inside the prompt does not). Every
  position after the EOS is padding (0).
* The decoded sequences are `[batch, num_decodes, max_decode_len]` and their scores
  `[batch, num_decodes]`, sorted ascending by score: the best decode is LAST (`[:, -1]`).
* Scores are sums of the model's log-probabilities (`log_softmax` of the float32 logits, *not* of
  temperature-scaled or top-k-filtered logits) over the decoded tokens, EOS included, forced prompt
  tokens excluded. `beam_search` additionally divides by the length penalty, see
  `length_penalized_score`.

The model is seen only through `tokens_to_logits(state: DecodingState) -> (logits, new_cache)`:
one call decodes one position for every row of the (flattened) batch, using a key/value cache
(the flax "cache" collection of a decoder run with `decode=True`). `beam_search` and
`temperature_sample(num_decodes > 1)` repeat every cache leaf per beam/sample
(`flat_batch_beam_expand`), and `beam_search` reorders the cache by the surviving beams' parent
indices at each step (`gather_beams`), exactly as T5X does. Cache leaves of rank 0 (e.g. flax's
scalar `cache_index`) are shared by all rows and left untouched; every other cache leaf must have
the batch dimension first.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple, Union

import flax
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

PyTree = Any
Array = jax.Array

# Large negative number standing in for log(0); finite, so sums of it never become NaN (as T5X).
NEG_INF = np.array(-1.0e7, dtype=np.float32)
# Temperatures below this (in a per-example temperature array) decode greedily (as T5X).
MIN_TEMPERATURE = 1e-4


@flax.struct.dataclass
class DecodingState:
  """What `tokens_to_logits` sees at one decoding step (the same fields as T5X's DecodingState).

  Attributes:
    cur_index: int32 `[flat_batch]`: decoder position of `cur_token` (0 = the initial BOS).
    sequences: `[flat_batch, max_decode_len]` (dtype of `inputs`): the decoder input tokens so far,
      `sequences[:, 0]` is the BOS 0 and `sequences[b, cur_index[b]] == cur_token[b]`; positions
      after `cur_index` hold the prompt (or 0).
    cur_token: `[flat_batch]`: the token to feed to the decoder at this step.
    cache: the model's cache pytree (e.g. the flax "cache" collection) with leading dim
      `flat_batch` (0-d leaves are shared). `flat_batch` is `batch * num_decodes` (beams or samples,
      flattened with `flatten_beam_dim`).
  """
  cur_index: Array
  sequences: Array
  cur_token: Array
  cache: PyTree


TokensToLogits = Callable[[DecodingState], Tuple[Array, PyTree]]


# ----------------------------------------------------------------------------------------------
# Length penalty and scores.
# ----------------------------------------------------------------------------------------------


def brevity_penalty(alpha: Union[float, Array], length: Union[int, float, Array]) -> Array:
  """The GNMT length penalty `((5 + length) / 6) ** alpha` used by T5X's beam search.

  Source: Wu et al. 2016 ("Google's Neural Machine Translation System", eq. 14) and T5X's
  `decoding.brevity_penalty`.

  Args:
    alpha: penalty exponent (0 disables the penalty: the result is 1).
    length: number of tokens (see `sequence_lengths` for the convention), any shape.

  Returns:
    float32 array of the shape of `length`.
  """
  return jnp.power((5.0 + jnp.asarray(length, jnp.float32)) / 6.0, jnp.asarray(alpha, jnp.float32))


def sequence_lengths(sequences: Array, eos_id: int, max_len: Optional[int] = None,
                     inputs: Optional[Array] = None) -> Array:
  """Length used by the beam-search length penalty: tokens up to and including the first EOS.

  The length is `j + 1` where `j` is the position of the first EOS in the returned (BOS-less)
  sequence, i.e. the number of tokens up to and including EOS, counting prompt tokens. A sequence
  without EOS (it hit the length limit) has length `max_len`, the decode length. This is T5X's
  `cur_index + 1` at the step that produced the EOS.

  Args:
    sequences: int `[..., length]` decoded sequences (as returned by `beam_search`).
    eos_id: end-of-sequence id.
    max_len: length assigned to sequences without EOS; default `sequences.shape[-1]`.
    inputs: optional prompt as passed to the decoding functions (decoder-input layout, so
      `inputs[..., j + 1]` is the prompt token of returned position `j`), broadcastable to
      `sequences`; EOS tokens at prompt positions do not count as the end (they do not end
      decoding either).

  Returns:
    int32 array `[...]`.
  """
  sequences = jnp.asarray(sequences)
  length = sequences.shape[-1]
  if max_len is None:
    max_len = length
  is_eos = sequences == eos_id
  if inputs is not None:
    inputs = jnp.asarray(inputs)
    prompt = jnp.concatenate([inputs[..., 1:], jnp.zeros_like(inputs[..., :1])], axis=-1)
    is_eos = is_eos & (prompt == 0)
  has_eos = jnp.any(is_eos, axis=-1)
  first = jnp.argmax(is_eos, axis=-1)
  return jnp.where(has_eos, first + 1, max_len).astype(jnp.int32)


def length_penalized_score(log_probs: Array, sequences: Array, eos_id: int, alpha: float,
                           max_len: Optional[int] = None,
                           inputs: Optional[Array] = None) -> Array:
  """The beam-search score of a sequence: `log_probs / brevity_penalty(alpha, length)`.

  `beam_search` returns exactly this (up to float32 rounding) for each returned sequence, so a
  model can check its beam scores against its own scorer: with `lp = score_batch(...)` (the sum of
  target token log-probs, EOS included),
  `length_penalized_score(lp, sequences, eos_id, alpha, max_len=max_decode_len)` equals the
  returned beam score. `length` is `sequence_lengths(sequences, eos_id, max_len, inputs)`.

  Args:
    log_probs: float `[...]`, summed token log-probs of each sequence.
    sequences: int `[..., length]`.
    eos_id: end-of-sequence id.
    alpha: length-penalty exponent.
    max_len: length of sequences without EOS; default `sequences.shape[-1]`.
    inputs: optional prompt, see `sequence_lengths`.

  Returns:
    float32 `[...]`.
  """
  lengths = sequence_lengths(sequences, eos_id, max_len=max_len, inputs=inputs)
  return jnp.asarray(log_probs, jnp.float32) / brevity_penalty(alpha, lengths)


# ----------------------------------------------------------------------------------------------
# Beam-dimension helpers (same names and semantics as T5X). 0-d leaves pass through unchanged.
# ----------------------------------------------------------------------------------------------


def add_beam_dim(x: Array, beam_size: int, offset: int = 0) -> Array:
  """Repeats `x` along a new beam axis: `[batch, ...] -> [batch, beam_size, ...]`.

  With `offset` the batch axis is `offset` (e.g. 1 for scanned layer caches). 0-d arrays are
  returned unchanged.
  """
  if x.ndim == 0:
    return x
  x = jnp.expand_dims(x, axis=offset + 1)
  reps = [1] * x.ndim
  reps[offset + 1] = beam_size
  return jnp.tile(x, reps)


def flatten_beam_dim(x: Array, offset: int = 0) -> Array:
  """Merges batch and beam axes: `[batch, beam, ...] -> [batch * beam, ...]` (0-d unchanged)."""
  if x.ndim == 0:
    return x
  shape = x.shape
  return x.reshape(shape[:offset] + (shape[offset] * shape[offset + 1],) + shape[offset + 2:])


def unflatten_beam_dim(x: Array, batch_size: int, beam_size: int, offset: int = 0) -> Array:
  """Splits the flat batch axis: `[batch * beam, ...] -> [batch, beam, ...]` (0-d unchanged).

  Raises:
    ValueError: if the axis is not `batch_size * beam_size` long.
  """
  if x.ndim == 0:
    return x
  if x.shape[offset] != batch_size * beam_size:
    raise ValueError(f"unflatten_beam_dim: axis {offset} of shape {x.shape} is not "
                     f"batch_size * beam_size = {batch_size} * {beam_size}")
  shape = x.shape
  return x.reshape(shape[:offset] + (batch_size, beam_size) + shape[offset + 1:])


def flat_batch_beam_expand(x: Array, beam_size: int, offset: int = 0) -> Array:
  """Repeats each batch element in place: `[b0, b1] -> [b0, b0, b1, b1]` for beam_size 2.

  `[batch, ...] -> [batch * beam_size, ...]`; 0-d arrays are returned unchanged.
  """
  return flatten_beam_dim(add_beam_dim(x, beam_size, offset), offset)


def gather_beams(nested: PyTree, beam_indices: Array, batch_size: int, new_beam_size: int,
                 offset: int = 0) -> PyTree:
  """Selects beams of every leaf: `out[b, k] = x[b, beam_indices[b, k]]`.

  Args:
    nested: pytree of arrays `[batch, old_beam, ...]` (0-d leaves pass through).
    beam_indices: int `[batch, new_beam_size]` indices into the old beam axis.
    batch_size: batch size.
    new_beam_size: number of beams selected.
    offset: position of the batch axis in the leaves.

  Returns:
    The pytree with leaves `[batch, new_beam_size, ...]`.
  """
  if beam_indices.shape != (batch_size, new_beam_size):
    raise ValueError(f"gather_beams: beam_indices has shape {beam_indices.shape}, expected "
                     f"{(batch_size, new_beam_size)}")
  batch_indices = jnp.arange(batch_size)[:, None]

  def gather(x):
    if x.ndim == 0:
      return x
    if offset == 0:
      return x[batch_indices, beam_indices]
    moved = jnp.moveaxis(jnp.moveaxis(x, offset, 0), offset + 1, 1)
    out = moved[batch_indices, beam_indices]
    return jnp.moveaxis(jnp.moveaxis(out, 1, offset + 1), 0, offset)

  return jax.tree_util.tree_map(gather, nested)


def gather_topk_beams(nested: PyTree, score_or_log_prob: Array, batch_size: int,
                      new_beam_size: int) -> PyTree:
  """Keeps the `new_beam_size` best beams by score, best first.

  Args:
    nested: pytree of arrays `[batch, old_beam, ...]`.
    score_or_log_prob: float `[batch, old_beam]`.
    batch_size: batch size.
    new_beam_size: number of beams kept.

  Returns:
    The pytree gathered with `gather_beams`, sorted by descending score.
  """
  _, topk_indices = lax.top_k(score_or_log_prob, k=new_beam_size)
  return gather_beams(nested, topk_indices, batch_size, new_beam_size)


def cache_map(fn: Callable[[Array], Array], cache: PyTree) -> PyTree:
  """Applies `fn` to every cache leaf of rank >= 1; 0-d leaves (e.g. `cache_index`) are kept."""
  return jax.tree_util.tree_map(lambda x: x if jnp.ndim(x) == 0 else fn(x), cache)


def _check_cache_batch(cache: PyTree, batch_size: int, offset: int = 0) -> None:
  """Raises ValueError naming the leaf whose batch axis is not `batch_size` long."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(cache)[0]:
    if jnp.ndim(leaf) == 0:
      continue
    shape = jnp.shape(leaf)
    if len(shape) <= offset or shape[offset] != batch_size:
      raise ValueError(
          f"decoding: cache leaf {jax.tree_util.keystr(path)} has shape {shape}; expected the "
          f"batch size {batch_size} of `inputs` on axis {offset} (0-d leaves are allowed)")


def _fit_length(inputs: Array, max_decode_len: Optional[int]) -> Array:
  """Pads with zeros / truncates `inputs` `[batch, len]` to `max_decode_len` columns."""
  if max_decode_len is None or max_decode_len == inputs.shape[1]:
    return inputs
  if max_decode_len < 1:
    raise ValueError(f"decoding: max_decode_len must be >= 1, got {max_decode_len}")
  if max_decode_len < inputs.shape[1]:
    return inputs[:, :max_decode_len]
  return jnp.pad(inputs, ((0, 0), (0, max_decode_len - inputs.shape[1])))


def _check_inputs(inputs: Array, num_decodes: int) -> Array:
  inputs = jnp.asarray(inputs)
  if inputs.ndim != 2:
    raise ValueError(f"decoding: inputs must be [batch, max_decode_len], got shape {inputs.shape}")
  if not jnp.issubdtype(inputs.dtype, jnp.integer):
    raise ValueError(f"decoding: inputs must be integer token ids, got dtype {inputs.dtype}")
  if num_decodes < 1:
    raise ValueError(f"decoding: num_decodes must be >= 1, got {num_decodes}")
  return inputs


def _static_float(x: Any) -> Optional[float]:
  """`float(x)` if `x` is a concrete number, else None (a tracer)."""
  try:
    return float(x)
  except (TypeError, jax.errors.ConcretizationTypeError):
    return None


def _sort_ascending(sequences: Array, scores: Array) -> Tuple[Array, Array]:
  """Sorts `[batch, n, ...]` sequences by `[batch, n]` scores, ascending (best last), stable."""
  order = jnp.argsort(scores, axis=-1, stable=True)
  scores = jnp.take_along_axis(scores, order, axis=-1)
  sequences = jnp.take_along_axis(sequences, order[:, :, None], axis=1)
  return sequences, scores


# ----------------------------------------------------------------------------------------------
# Temperature sampling and greedy decoding.
# ----------------------------------------------------------------------------------------------


def _filter_logits(logits: Array, topk: int, topp: Union[float, Array]) -> Array:
  """Top-k / nucleus (top-p) filtering: removed tokens get NEG_INF. `logits` `[batch, vocab]`."""
  vocab = logits.shape[-1]
  if topk > 0 and topk < vocab:
    kth = lax.top_k(logits, topk)[0][:, -1:]
    logits = jnp.where(logits < kth, NEG_INF, logits)
  static_topp = _static_float(topp)
  if static_topp is None or static_topp > 0.0:
    # Keep the smallest set of most likely tokens whose probability mass reaches topp
    # (Holtzman et al. 2020): a token is kept when the mass strictly before it is < topp.
    sorted_logits = -jnp.sort(-logits, axis=-1)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    kept = mass_before < topp
    threshold = jnp.min(jnp.where(kept, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < threshold, NEG_INF, logits)
  return logits


def temperature_sample(inputs: Array,
                       cache: PyTree,
                       tokens_to_logits: TokensToLogits,
                       eos_id: int,
                       decode_rng: Optional[Array] = None,
                       num_decodes: int = 1,
                       temperature: Union[float, Array] = 1.0,
                       topk: int = 1,
                       topp: Union[float, Array] = 0.0,
                       initial_index: Optional[Array] = None,
                       max_decode_steps: Optional[Union[int, Array]] = None,
                       max_decode_len: Optional[int] = None,
                       cache_offset: int = 0,
                       rescale_log_probs: bool = False) -> Tuple[Array, Array]:
  """Samples (or greedily decodes) `num_decodes` continuations per example, as T5X.

  Greedy argmax decoding (deterministic; `decode_rng` is not needed) when `temperature == 0` or
  `topk == 1` (the default). Otherwise each token is drawn from
  `softmax(filter(logits / temperature))` where `filter` keeps the `topk` best tokens (`topk > 1`;
  `topk == 0` keeps all) or the nucleus of mass `topp` (`topp > 0`, Holtzman et al. 2020).
  Decoding stops (early exit of the while loop) once every row has decoded EOS, filled
  `max_decode_len` positions or decoded `max_decode_steps` tokens.

  Args:
    inputs: int `[batch, max_decode_len]` decoder prompt in decoder-input layout (0 = no prompt
      token; `inputs[:, 0]` is the BOS slot), see the module docstring.
    cache: model cache pytree with leading dim `batch` (0-d leaves shared); it is expanded to
      `batch * num_decodes` rows with `flat_batch_beam_expand` when `num_decodes > 1`.
    tokens_to_logits: `DecodingState -> (logits float [batch * num_decodes, vocab], new_cache)`.
    eos_id: end-of-sequence id.
    decode_rng: PRNG key, required unless decoding is greedy.
    num_decodes: samples per example (rows `b * num_decodes + n` in the flat batch).
    temperature: >= 0, sampling temperature: a number, or a float array `[batch]` with one
      temperature per example (entries below `MIN_TEMPERATURE` decode greedily).
    topk: keep only the `topk` most likely tokens (0: no top-k filtering; 1: greedy).
    topp: nucleus mass in [0, 1]; requires `topk == 0`.
    initial_index: optional int `[batch]`: the decoder position to start from when the cache
      was already filled for positions `< initial_index` (prefill); the first token fed is
      `inputs[:, initial_index]`. Default: all 0 (the BOS 0).
    max_decode_steps: optional limit on the number of decoded (non-prompt) tokens per row
      (an int, or an int array `[batch]`).
    max_decode_len: optional output length; `inputs` is zero-padded or truncated to it.
    cache_offset: axis of the batch dimension in the cache leaves (1 for scanned layers).
    rescale_log_probs: if True (T5X's default), the returned log-probs are those of the
      temperature-scaled, top-k/top-p filtered sampling distribution (0 for greedy decoding);
      if False (default here), they are the model's own log-probs, comparable with a scorer.

  Returns:
    `(sequences, log_probs)`: sequences `[batch, num_decodes, max_decode_len]` (dtype of inputs,
    no BOS, 0 after EOS) and float32 `[batch, num_decodes]` sums of the token log-probs
    (decoded tokens incl. EOS, prompt excluded), both sorted by ascending log-prob (best last).

  Raises:
    ValueError: on malformed shapes or arguments, or a missing `decode_rng` when sampling.
  """
  inputs = _fit_length(_check_inputs(inputs, num_decodes), max_decode_len)
  batch_size = inputs.shape[0]
  static_temperature = _static_float(temperature)
  if static_temperature is not None:
    if static_temperature < 0:
      raise ValueError(f"temperature_sample: temperature must be >= 0, got {temperature}")
    temperature = static_temperature
  if topk < 0:
    raise ValueError(f"temperature_sample: topk must be >= 0, got {topk}")
  static_topp = _static_float(topp)
  if static_topp is not None and not 0.0 <= static_topp <= 1.0:
    raise ValueError(f"temperature_sample: topp must be in [0, 1], got {topp}")
  if (static_topp is None or static_topp > 0) and topk > 0:
    raise ValueError("temperature_sample: at most one of topk and topp may be non-zero "
                     f"(got topk={topk}, topp={topp}); pass topk=0 with topp")
  if isinstance(max_decode_steps, int) and max_decode_steps < 1:
    raise ValueError(f"temperature_sample: max_decode_steps must be >= 1, got {max_decode_steps}")
  greedy = topk == 1 or static_temperature == 0.0
  if not greedy and static_temperature is None:
    temperature = jnp.asarray(temperature, jnp.float32)
    if temperature.ndim == 1:
      if temperature.shape != (batch_size,):
        raise ValueError(f"temperature_sample: a temperature array must have shape "
                         f"({batch_size},), got {temperature.shape}")
      temperature = flat_batch_beam_expand(temperature, num_decodes)[:, None]
    elif temperature.ndim != 0:
      raise ValueError(f"temperature_sample: temperature must be a number or [batch], got shape "
                       f"{temperature.shape}")
  if max_decode_steps is not None and not isinstance(max_decode_steps, int):
    max_decode_steps = jnp.asarray(max_decode_steps, jnp.int32)
    if max_decode_steps.ndim == 1:
      if max_decode_steps.shape != (batch_size,):
        raise ValueError(f"temperature_sample: max_decode_steps must be an int or [batch], got "
                         f"shape {max_decode_steps.shape}")
      max_decode_steps = flat_batch_beam_expand(max_decode_steps, num_decodes)
  if not greedy and decode_rng is None:
    raise ValueError("temperature_sample: decode_rng is required when sampling "
                     "(temperature > 0 and topk != 1)")
  _check_cache_batch(cache, batch_size, cache_offset)
  if initial_index is not None:
    initial_index = jnp.asarray(initial_index, jnp.int32)
    if initial_index.shape != (batch_size,):
      raise ValueError(f"temperature_sample: initial_index must have shape ({batch_size},), "
                       f"got {initial_index.shape}")

  if num_decodes > 1:
    inputs = flat_batch_beam_expand(inputs, num_decodes)
    cache = cache_map(lambda x: flat_batch_beam_expand(x, num_decodes, cache_offset), cache)
    if initial_index is not None:
      initial_index = flat_batch_beam_expand(initial_index, num_decodes)
  if decode_rng is None:
    decode_rng = jax.random.PRNGKey(0)  # Unused by greedy decoding.

  sequences, log_probs = _sample_single_trial(
      inputs, cache, tokens_to_logits, eos_id, decode_rng, greedy=greedy,
      temperature=temperature, topk=topk, topp=topp, initial_index=initial_index,
      max_decode_steps=max_decode_steps, rescale_log_probs=rescale_log_probs)
  sequences = sequences.reshape(batch_size, num_decodes, -1)
  log_probs = log_probs.reshape(batch_size, num_decodes)
  return _sort_ascending(sequences, log_probs)


def _sample_single_trial(inputs, cache, tokens_to_logits, eos_id, rng, *, greedy, temperature,
                         topk, topp, initial_index, max_decode_steps, rescale_log_probs):
  """The while loop of `temperature_sample` on a flat batch; returns ([n, len], [n])."""
  flat_batch, length = inputs.shape
  # Decoder inputs [flat_batch, length + 1]: BOS at position 0, prompt at 1..length-1, and one
  # extra slot; decoder position j + 1 is returned position j.
  sequences0 = jnp.concatenate([inputs, jnp.zeros((flat_batch, 1), inputs.dtype)], axis=1)
  if initial_index is None:
    sequences0 = sequences0.at[:, 0].set(0)
  positions = jnp.arange(length + 1)[None, :]
  rows = jnp.arange(flat_batch)
  if initial_index is None:
    index0 = jnp.zeros((flat_batch,), jnp.int32)
  else:
    index0 = jnp.clip(initial_index, 0, length)
  state0 = dict(
      index=index0,
      sequences=sequences0,
      cache=cache,
      ended=index0 >= length,
      log_prob=jnp.zeros((flat_batch,), jnp.float32),
      num_decoded=jnp.zeros((flat_batch,), jnp.int32),
      rng=rng)

  def cond_fn(state):
    return ~jnp.all(state["ended"])

  def body_fn(state):
    index, sequences, ended = state["index"], state["sequences"], state["ended"]
    rng, step_rng = jax.random.split(state["rng"])
    cur_token = sequences[rows, index]
    logits, new_cache = tokens_to_logits(DecodingState(
        cur_index=index, sequences=sequences[:, :-1], cur_token=cur_token, cache=state["cache"]))
    logits = logits.astype(jnp.float32)
    model_log_probs = jax.nn.log_softmax(logits, axis=-1)
    if greedy:
      token = jnp.argmax(logits, axis=-1)
      if rescale_log_probs:
        model_log_probs = jnp.zeros_like(model_log_probs)
    else:
      if isinstance(temperature, (int, float)):
        scaled = _filter_logits(logits / temperature, topk, topp)
        token = jax.random.categorical(step_rng, scaled, axis=-1)
      else:  # Traced or per-example temperatures: rows below MIN_TEMPERATURE are greedy.
        cold = temperature < MIN_TEMPERATURE
        scaled = _filter_logits(logits / jnp.maximum(temperature, MIN_TEMPERATURE), topk, topp)
        token = jnp.where(cold[..., 0] if cold.ndim else cold,
                          jnp.argmax(logits, axis=-1),
                          jax.random.categorical(step_rng, scaled, axis=-1))
      if rescale_log_probs:
        model_log_probs = jax.nn.log_softmax(scaled, axis=-1)
    token = token.astype(sequences.dtype)
    token_log_prob = jnp.take_along_axis(model_log_probs, token[:, None].astype(jnp.int32),
                                         axis=-1)[:, 0]
    next_index = jnp.minimum(index + 1, length)
    prompt_token = sequences[rows, next_index]
    in_prompt = prompt_token != 0
    token = jnp.where(in_prompt, prompt_token, token)
    active = ~ended
    decoded = active & ~in_prompt
    write = active[:, None] & (positions == next_index[:, None])
    sequences = jnp.where(write, token[:, None], sequences)
    log_prob = state["log_prob"] + jnp.where(decoded, token_log_prob, 0.0)
    num_decoded = state["num_decoded"] + decoded.astype(jnp.int32)
    index = jnp.where(active, next_index, index)
    ended = ended | (decoded & (token == eos_id)) | (index >= length)
    if max_decode_steps is not None:
      ended = ended | (num_decoded >= max_decode_steps)
    return dict(index=index, sequences=sequences, cache=new_cache, ended=ended,
                log_prob=log_prob, num_decoded=num_decoded, rng=rng)

  final = lax.while_loop(cond_fn, body_fn, state0)
  return final["sequences"][:, 1:], final["log_prob"]


def greedy_decode(inputs: Array, cache: PyTree, tokens_to_logits: TokensToLogits, eos_id: int,
                  num_decodes: int = 1, max_decode_len: Optional[int] = None,
                  initial_index: Optional[Array] = None,
                  max_decode_steps: Optional[int] = None,
                  decode_rng: Optional[Array] = None,
                  cache_offset: int = 0,
                  rescale_log_probs: bool = False) -> Tuple[Array, Array]:
  """Greedy argmax decoding: `temperature_sample(..., temperature=0)`; same args and results.

  `decode_rng` is accepted (and ignored) so that model code can pass it uniformly.
  """
  del decode_rng
  return temperature_sample(inputs, cache, tokens_to_logits, eos_id, num_decodes=num_decodes,
                            temperature=0.0, topk=1, initial_index=initial_index,
                            max_decode_steps=max_decode_steps, max_decode_len=max_decode_len,
                            cache_offset=cache_offset, rescale_log_probs=rescale_log_probs)


# ----------------------------------------------------------------------------------------------
# Beam search.
# ----------------------------------------------------------------------------------------------


def beam_search(inputs: Array,
                cache: PyTree,
                tokens_to_logits: TokensToLogits,
                eos_id: int,
                num_decodes: int = 4,
                alpha: float = 0.6,
                max_decode_len: Optional[int] = None,
                decode_rng: Optional[Array] = None,
                cache_offset: int = 0) -> Tuple[Array, Array]:
  """Beam search with the GNMT length penalty, as T5X's `decoding.beam_search`.

  Each step extends the `num_decodes` live beams by every token, keeps the `2 * num_decodes` best
  extensions by log-prob; those ending in EOS (or reaching `max_decode_len`) compete for the
  `num_decodes` finished slots by `log_prob / brevity_penalty(alpha, length)`, the others
  (best `num_decodes`) stay live and their caches are gathered from their parent beams.
  The loop exits early once no live beam can beat the worst finished one (the bound uses the
  largest penalty over the remaining lengths, so the result equals the one without early exit).

  Length convention of the penalty (`sequence_lengths`): number of tokens of the returned
  sequence up to and including the first EOS (prompt tokens included); `max_decode_len` for a
  sequence that reached the length limit without EOS. Scores = `length_penalized_score(
  sum of model token log-probs (EOS included, prompt excluded), sequences, eos_id, alpha,
  max_len=max_decode_len)`.

  Args:
    inputs: int `[batch, max_decode_len]` decoder prompt in decoder-input layout (0 = no prompt
      token; `inputs[:, 0]` is the BOS slot), see the module docstring.
    cache: model cache pytree with leading dim `batch` (0-d leaves shared); expanded to
      `batch * num_decodes` rows (`flat_batch_beam_expand`).
    tokens_to_logits: `DecodingState -> (logits float [batch * num_decodes, vocab], new_cache)`.
    eos_id: end-of-sequence id.
    num_decodes: beam size (and number of returned sequences).
    alpha: length-penalty exponent (0: no penalty).
    max_decode_len: optional output length; `inputs` is zero-padded or truncated to it.
    decode_rng: ignored (accepted so that model code can pass it uniformly).
    cache_offset: axis of the batch dimension in the cache leaves (1 for scanned layers).

  Returns:
    `(sequences, scores)`: `[batch, num_decodes, max_decode_len]` (dtype of inputs, no BOS, 0 after
    EOS) and float32 `[batch, num_decodes]` length-penalised scores, ascending (best last). If
    fewer than `num_decodes` distinct finished sequences exist, the extra slots have scores
    <= NEG_INF / 2.

  Raises:
    ValueError: on malformed shapes or arguments.
  """
  del decode_rng
  inputs = _fit_length(_check_inputs(inputs, num_decodes), max_decode_len)
  batch_size, length = inputs.shape
  beam_size = num_decodes
  _check_cache_batch(cache, batch_size, cache_offset)

  # Decoder positions [batch, length + 1]: BOS 0, the prompt (inputs[:, 1:]) and one extra slot.
  prompt = jnp.concatenate([inputs, jnp.zeros((batch_size, 1), inputs.dtype)], axis=1)
  prompt = prompt.at[:, 0].set(0)
  live_seqs0 = add_beam_dim(prompt, beam_size)  # [batch, beam, length + 1]
  state0 = dict(
      index=jnp.array(0, jnp.int32),
      # Only beam 0 is alive at first, so the first step does not yield duplicates.
      live_log_probs=jnp.tile(
          jnp.array([0.0] + [float(NEG_INF)] * (beam_size - 1), jnp.float32), (batch_size, 1)),
      live_seqs=live_seqs0,
      finished_scores=jnp.full((batch_size, beam_size), NEG_INF, jnp.float32),
      finished_seqs=jnp.zeros_like(live_seqs0),
      finished_flags=jnp.zeros((batch_size, beam_size), bool),
      cache=cache_map(lambda x: add_beam_dim(x, beam_size, cache_offset), cache))
  max_penalty_len = brevity_penalty(alpha, length)

  def cond_fn(state):
    index = state["index"]
    # Upper bound of any live beam's final score: log-probs only decrease, and the largest
    # penalty over the remaining lengths [index + 1, length] is at one of the ends.
    largest_penalty = jnp.maximum(brevity_penalty(alpha, index + 1), max_penalty_len)
    best_live = jnp.max(state["live_log_probs"], axis=1) / largest_penalty
    worst_finished = jnp.where(jnp.all(state["finished_flags"], axis=1),
                               jnp.min(state["finished_scores"], axis=1), NEG_INF)
    search_done = jnp.all(worst_finished > best_live)
    return (index < length) & ~search_done

  def body_fn(state):
    index = state["index"]
    live_seqs = state["live_seqs"]
    flat_seqs = flatten_beam_dim(live_seqs)
    flat_cache = cache_map(lambda x: flatten_beam_dim(x, cache_offset), state["cache"])
    flat_logits, new_flat_cache = tokens_to_logits(DecodingState(
        cur_index=jnp.full((batch_size * beam_size,), index, jnp.int32),
        sequences=flat_seqs[:, :-1],
        cur_token=flat_seqs[:, index],
        cache=flat_cache))
    vocab_size = flat_logits.shape[-1]
    log_probs = jax.nn.log_softmax(
        unflatten_beam_dim(flat_logits.astype(jnp.float32), batch_size, beam_size), axis=-1)
    # Prompt positions are forced (their log-prob does not count).
    prompt_token = lax.dynamic_index_in_dim(prompt, index + 1, axis=1, keepdims=False)
    in_prompt = prompt_token != 0
    forced = jnp.where(jnp.arange(vocab_size)[None, :] == prompt_token[:, None], 0.0, NEG_INF)
    log_probs = jnp.where(in_prompt[:, None, None], forced[:, None, :], log_probs)
    # [batch, beam, vocab] -> best 2 * beam extensions.
    candidate_log_probs = (log_probs + state["live_log_probs"][:, :, None]).reshape(
        batch_size, beam_size * vocab_size)
    topk_log_probs, topk_indices = lax.top_k(candidate_log_probs, k=2 * beam_size)
    topk_parents = topk_indices // vocab_size
    topk_tokens = (topk_indices % vocab_size).astype(live_seqs.dtype)
    topk_seqs = gather_beams(live_seqs, topk_parents, batch_size, 2 * beam_size)
    topk_seqs = lax.dynamic_update_slice(topk_seqs, topk_tokens[:, :, None], (0, 0, index + 1))
    newly_finished = ((topk_tokens == eos_id) & ~in_prompt[:, None]) | (index + 1 >= length)

    # Live beams: the best non-finished extensions, with their parents' caches.
    new_live_log_probs = topk_log_probs + jnp.where(newly_finished, NEG_INF, 0.0)
    new_live_log_probs, live_choice = lax.top_k(new_live_log_probs, k=beam_size)
    new_live_seqs = gather_beams(topk_seqs, live_choice, batch_size, beam_size)
    live_parents = gather_beams(topk_parents, live_choice, batch_size, beam_size)
    new_cache = cache_map(lambda x: unflatten_beam_dim(x, batch_size, beam_size, cache_offset),
                          new_flat_cache)
    new_cache = gather_beams(new_cache, live_parents, batch_size, beam_size, cache_offset)

    # Finished beams: merge the newly finished extensions by length-penalised score.
    new_scores = topk_log_probs / brevity_penalty(alpha, index + 1)
    new_scores = jnp.where(newly_finished, new_scores, NEG_INF)
    new_flags = newly_finished & (topk_log_probs > NEG_INF / 2)
    all_scores = jnp.concatenate([state["finished_scores"], new_scores], axis=1)
    all_seqs = jnp.concatenate([state["finished_seqs"], topk_seqs], axis=1)
    all_flags = jnp.concatenate([state["finished_flags"], new_flags], axis=1)
    finished_scores, finished_seqs, finished_flags = gather_topk_beams(
        (all_scores, all_seqs, all_flags), all_scores, batch_size, beam_size)
    return dict(index=index + 1, live_log_probs=new_live_log_probs, live_seqs=new_live_seqs,
                finished_scores=finished_scores, finished_seqs=finished_seqs,
                finished_flags=finished_flags, cache=new_cache)

  final = lax.while_loop(cond_fn, body_fn, state0)
  # [:, :, 1:] drops the BOS. Positions after the EOS were never written (0), except a prompt
  # that would continue after it; zero them for the documented invariant.
  sequences = final["finished_seqs"][:, :, 1:]
  is_eos = (sequences == eos_id) & (prompt[:, None, 1:] == 0)
  after_eos = (jnp.cumsum(is_eos, axis=-1) - is_eos) > 0
  sequences = jnp.where(after_eos, 0, sequences)
  scores = final["finished_scores"]
  # top_k order is descending; T5X returns ascending (best last).
  return jnp.flip(sequences, axis=1), jnp.flip(scores, axis=1)
