"""Model-agnostic autoregressive decoding in pure JAX: temperature sampling (greedy at
temperature 0) and beam search.

T5X's `t5x/decoding.py` (Roberts et al. 2022) re-implemented with its conventions, `jax.jit`-able
(`lax.while_loop`s with early exit, `flax.struct` states), no TensorFlow or SeqIO; the caller is
`EncoderDecoderModel.predict_batch`. `inputs` is the decoder prompt, int32 [batch,
max_decode_len] in decoder-input layout: `inputs[:, 0]` is the ignored BOS slot and a non-zero
`inputs[:, j]` forces returned position `j - 1` (`[0, 5, 6, 0, 0]` -> `[5, 6, a, b, c]`). Returned
sequences are BOS-less (`decoder_target_tokens` layout), [batch, num_decodes, max_decode_len],
0 after the first decoded EOS, with scores [batch, num_decodes] sorted ascending (best LAST).
Scores sum the untempered model log-probs of decoded tokens, EOS included (T5X's
`rescale_log_probs=False`); beam scores are divided by `brevity_penalty`. The model is seen only
through `tokens_to_logits(DecodingState) -> (logits, new_cache)`; every cache leaf but rank-0 ones
has the batch first (T5X's `cache_offset=0`) and is expanded and reordered per beam as in T5X.
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


@flax.struct.dataclass
class DecodingState:
  """What `tokens_to_logits` sees at one decoding step (T5X's DecodingState fields).

  `flat_batch` = batch * num_decodes (`flatten_beam_dim`). `cur_index` int32 [flat_batch]: position
  of `cur_token` [flat_batch] (0 = BOS), the same for every row; `sequences` [flat_batch,
  max_decode_len]: decoder inputs so far (BOS 0 first), the prompt (or 0) after `cur_index`;
  `cache`: the model's pytree, leading dim flat_batch (0-d leaves shared).
  """
  cur_index: Array
  sequences: Array
  cur_token: Array
  cache: PyTree


TokensToLogits = Callable[[DecodingState], Tuple[Array, PyTree]]


@flax.struct.dataclass
class SamplingLoopState:
  """The `lax.while_loop` state of `temperature_sample` (T5X's; one scalar position, no prefill).

  `cur_index` int32 scalar; `sequences` [flat_batch, max_decode_len + 1] (returned position j is
  j + 1); `cache`; `ended` bool [flat_batch]; `log_prob` float32 [flat_batch]; `rng`.
  """
  cur_index: Array
  sequences: Array
  cache: PyTree
  ended: Array
  log_prob: Array
  rng: Array


@flax.struct.dataclass
class BeamState:
  """The `lax.while_loop` state of `beam_search` (T5X's `BeamState`, without `initial_index`).

  `cur_index` int32 scalar; `live_logprobs`, `finished_scores` (NEG_INF when empty) float32
  [batch, beam]; `live_seqs`, `finished_seqs` [batch, beam, max_decode_len + 1] (BOS first);
  `finished_flags` bool [batch, beam]; `cache` leaves [batch, beam, ...] (0-d shared).
  """
  cur_index: Array
  live_logprobs: Array
  finished_scores: Array
  live_seqs: Array
  finished_seqs: Array
  finished_flags: Array
  cache: PyTree


# ----------------------------------------------------------------------------------------------
# Length penalty and scores.
# ----------------------------------------------------------------------------------------------


def brevity_penalty(alpha: Union[float, Array], length: Union[int, float, Array]) -> Array:
  """The GNMT length penalty `((5 + length) / 6) ** alpha`, float32 of `length`'s shape (alpha 0:
  1).

  Source: Wu et al. 2016 (GNMT, eq. 14), T5X `decoding.brevity_penalty`.
  """
  return jnp.power((5.0 + jnp.asarray(length, jnp.float32)) / 6.0, jnp.asarray(alpha, jnp.float32))


def sequence_lengths(sequences: Array,
                     eos_id: int,
                     max_len: Optional[int] = None,
                     inputs: Optional[Array] = None) -> Array:
  """int32 [...]: tokens of `sequences` [..., length] up to and including the first EOS (prompt
  included; `max_len` without EOS; an EOS the prompt `inputs` forces does not count)."""
  sequences = jnp.asarray(sequences)
  if max_len is None:
    max_len = sequences.shape[-1]
  is_eos = sequences == eos_id
  if inputs is not None:
    is_eos = is_eos & (_output_layout(jnp.asarray(inputs)) == 0)
  has_eos = jnp.any(is_eos, axis=-1)
  first = jnp.argmax(is_eos, axis=-1)
  return jnp.where(has_eos, first + 1, max_len).astype(jnp.int32)


def length_penalized_score(log_probs: Array,
                           sequences: Array,
                           eos_id: int,
                           alpha: float,
                           max_len: Optional[int] = None,
                           inputs: Optional[Array] = None) -> Array:
  """float32 [...] `log_probs / brevity_penalty(alpha, sequence_lengths(...))`, as `beam_search`
  scores (so `score_batch` scores can be checked against beam scores)."""
  lengths = sequence_lengths(sequences, eos_id, max_len=max_len, inputs=inputs)
  return jnp.asarray(log_probs, jnp.float32) / brevity_penalty(alpha, lengths)


# ----------------------------------------------------------------------------------------------
# Beam-dimension helpers (same names and semantics as T5X, batch axis first). 0-d leaves pass
# through unchanged.
# ----------------------------------------------------------------------------------------------


def add_beam_dim(x: Array, beam_size: int) -> Array:
  """Repeats `x` along a new beam axis: `[batch, ...] -> [batch, beam, ...]` (0-d unchanged)."""
  if x.ndim == 0:
    return x
  return jnp.repeat(jnp.expand_dims(x, axis=1), beam_size, axis=1)


def flatten_beam_dim(x: Array) -> Array:
  """Merges batch and beam axes: `[batch, beam, ...] -> [batch * beam, ...]` (0-d unchanged)."""
  if x.ndim == 0:
    return x
  return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])


def unflatten_beam_dim(x: Array, batch_size: int, beam_size: int) -> Array:
  """`[batch * beam, ...] -> [batch, beam, ...]` (0-d unchanged); ValueError on another length."""
  if x.ndim == 0:
    return x
  if x.shape[0] != batch_size * beam_size:
    raise ValueError(f"unflatten_beam_dim: axis 0 of shape {x.shape} is not "
                     f"batch_size * beam_size = {batch_size} * {beam_size}")
  return x.reshape((batch_size, beam_size) + x.shape[1:])


def flat_batch_beam_expand(x: Array, beam_size: int) -> Array:
  """`[batch, ...] -> [batch * beam_size, ...]`, each element repeated in place (0-d unchanged)."""
  return flatten_beam_dim(add_beam_dim(x, beam_size))


def gather_beams(nested: PyTree, beam_indices: Array, batch_size: int,
                 new_beam_size: int) -> PyTree:
  """`out[b, k] = x[b, beam_indices[b, k]]` per leaf [batch, old_beam, ...] (0-d leaves pass).

  ValueError if `beam_indices` is not [batch_size, new_beam_size].
  """
  if beam_indices.shape != (batch_size, new_beam_size):
    raise ValueError(f"gather_beams: beam_indices has shape {beam_indices.shape}, expected "
                     f"{(batch_size, new_beam_size)}")
  batch_indices = jnp.arange(batch_size)[:, None]
  return jax.tree_util.tree_map(lambda x: x
                                if x.ndim == 0 else x[batch_indices, beam_indices], nested)


def gather_topk_beams(nested: PyTree, score_or_log_prob: Array, batch_size: int,
                      new_beam_size: int) -> PyTree:
  """The `new_beam_size` best beams of `nested` ([batch, old_beam, ...]) by `score_or_log_prob`
  [batch, old_beam], best first."""
  _, topk_indices = lax.top_k(score_or_log_prob, k=new_beam_size)
  return gather_beams(nested, topk_indices, batch_size, new_beam_size)


def cache_map(fn: Callable[[Array], Array], cache: PyTree) -> PyTree:
  """Applies `fn` to every cache leaf of rank >= 1; 0-d leaves (e.g. `cache_index`) are kept."""
  return jax.tree_util.tree_map(lambda x: x if jnp.ndim(x) == 0 else fn(x), cache)


def _check_cache_batch(cache: PyTree, batch_size: int) -> None:
  """Raises ValueError naming the leaf whose first axis is not `batch_size` long."""
  for path, leaf in jax.tree_util.tree_flatten_with_path(cache)[0]:
    shape = jnp.shape(leaf)
    if shape and shape[0] != batch_size:
      raise ValueError(
          f"decoding: cache leaf {jax.tree_util.keystr(path)} has shape {shape}; expected the "
          f"batch size {batch_size} of `inputs` on axis 0 (0-d leaves are allowed)")


def _check_inputs(inputs: Array, num_decodes: int) -> Array:
  inputs = jnp.asarray(inputs)
  if inputs.ndim != 2:
    raise ValueError(f"decoding: inputs must be [batch, max_decode_len], got shape {inputs.shape}")
  if not jnp.issubdtype(inputs.dtype, jnp.integer):
    raise ValueError(f"decoding: inputs must be integer token ids, got dtype {inputs.dtype}")
  if num_decodes < 1:
    raise ValueError(f"decoding: num_decodes must be >= 1, got {num_decodes}")
  return inputs


def _output_layout(inputs: Array) -> Array:
  """The prompt in returned (BOS-less) positions: `inputs[..., 1:]` followed by one 0."""
  return jnp.concatenate([inputs[..., 1:], jnp.zeros_like(inputs[..., :1])], axis=-1)


def _zero_after_eos(sequences: Array, prompt: Array, eos_id: int) -> Array:
  """Zeros every position after the first decoded (non-prompt) EOS; `prompt` in output layout."""
  is_eos = (sequences == eos_id) & (prompt == 0)
  after_eos = (jnp.cumsum(is_eos, axis=-1) - is_eos) > 0
  return jnp.where(after_eos, jnp.zeros_like(sequences), sequences)


# ----------------------------------------------------------------------------------------------
# Temperature sampling (greedy decoding at temperature 0).
# ----------------------------------------------------------------------------------------------


def argmax_last(x: Array) -> Array:
  """int32 [...] `jnp.argmax(x, axis=-1)` of float [..., n]: the first largest (or first NaN)."""
  # why a max and a min, not one reduction over (value, index) pairs: XLA's CPU backend does not
  # vectorise the latter (in greedy decoding it cost about as much as the output matmul).
  largest = jnp.max(x, axis=-1, keepdims=True)
  index = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
  hit = (x == largest) | jnp.isnan(x)
  return jnp.min(jnp.where(hit, index, x.shape[-1]), axis=-1)


def temperature_sample(inputs: Array,
                       cache: PyTree,
                       tokens_to_logits: TokensToLogits,
                       eos_id: int,
                       decode_rng: Optional[Array] = None,
                       num_decodes: int = 1,
                       temperature: float = 1.0,
                       topk: int = 0) -> Tuple[Array, Array]:
  """Samples, or greedily decodes, `num_decodes` continuations per example (T5X
  `decoding.temperature_sample`).

  Greedy when `temperature == 0` or `topk == 1`; else from `softmax(logits / temperature)` over the
  `topk` most likely tokens (0: all; T5X's default is 1). Not here: T5X's top-p, per-example
  temperatures, `initial_index`, `max_decode_steps`, callbacks. `inputs`: int [batch,
  max_decode_len] decoder prompt (module docstring); `cache` leading dim batch; `decode_rng`
  required unless greedy. Returns sequences [batch, num_decodes, max_decode_len] (no BOS, 0 after
  EOS) and float32 [batch, num_decodes] log-prob sums (EOS in, prompt out), ascending (best last).
  ValueError: malformed shapes or arguments, no `decode_rng` when sampling.
  """
  inputs = _check_inputs(inputs, num_decodes)
  temperature, topk = float(temperature), int(topk)
  if temperature < 0:
    raise ValueError(f"temperature_sample: temperature must be >= 0, got {temperature}")
  if topk < 0:
    raise ValueError(f"temperature_sample: topk must be >= 0, got {topk}")
  greedy = temperature == 0.0 or topk == 1
  if not greedy and decode_rng is None:
    raise ValueError("temperature_sample: decode_rng is required when sampling "
                     "(temperature > 0 and topk != 1)")
  batch_size, length = inputs.shape
  _check_cache_batch(cache, batch_size)
  if num_decodes > 1:
    inputs = flat_batch_beam_expand(inputs, num_decodes)
    cache = cache_map(lambda x: flat_batch_beam_expand(x, num_decodes), cache)
  flat_batch = inputs.shape[0]

  # Decoder inputs [flat_batch, length + 1]: BOS at position 0, prompt at 1..length-1 and one
  # extra slot; decoder position j + 1 is returned position j.
  sequences0 = jnp.concatenate([inputs, jnp.zeros((flat_batch, 1), inputs.dtype)], axis=1)
  state0 = SamplingLoopState(
      cur_index=jnp.array(0, jnp.int32),
      sequences=sequences0.at[:, 0].set(0),
      cache=cache,
      ended=jnp.zeros((flat_batch,), bool),
      log_prob=jnp.zeros((flat_batch,), jnp.float32),
      rng=decode_rng if decode_rng is not None else jax.random.PRNGKey(0))  # unused if greedy

  def cond_fn(state: SamplingLoopState) -> Array:
    return (state.cur_index < length) & ~jnp.all(state.ended)

  def body_fn(state: SamplingLoopState) -> SamplingLoopState:
    index = state.cur_index
    rng, step_rng = jax.random.split(state.rng)
    logits, new_cache = tokens_to_logits(
        DecodingState(
            cur_index=jnp.full((flat_batch,), index, jnp.int32),
            sequences=state.sequences[:, :-1],
            cur_token=lax.dynamic_index_in_dim(state.sequences, index, axis=1, keepdims=False),
            cache=state.cache))
    logits = logits.astype(jnp.float32)
    if greedy:
      token = argmax_last(logits)
    else:
      scaled = logits / temperature
      if 0 < topk < logits.shape[-1]:
        kth = lax.top_k(scaled, topk)[0][:, -1:]
        scaled = jnp.where(scaled < kth, NEG_INF, scaled)
      token = jax.random.categorical(step_rng, scaled, axis=-1)
    prompt_token = lax.dynamic_index_in_dim(state.sequences, index + 1, axis=1, keepdims=False)
    in_prompt = prompt_token != 0
    token = jnp.where(in_prompt, prompt_token, token.astype(prompt_token.dtype))
    token_log_prob = jnp.take_along_axis(
        jax.nn.log_softmax(logits, axis=-1), token[:, None].astype(jnp.int32), axis=-1)[:, 0]
    active = ~state.ended
    decoded = active & ~in_prompt
    # Ended rows keep their column (0, or a prompt token that is zeroed at the end).
    sequences = lax.dynamic_update_index_in_dim(
        state.sequences, jnp.where(active, token, prompt_token), index + 1, axis=1)
    return SamplingLoopState(
        cur_index=index + 1,
        sequences=sequences,
        cache=new_cache,
        ended=state.ended | (decoded & (token == eos_id)),
        log_prob=state.log_prob + jnp.where(decoded, token_log_prob, 0.0),
        rng=rng)

  final = lax.while_loop(cond_fn, body_fn, state0)
  sequences = _zero_after_eos(final.sequences[:, 1:], _output_layout(inputs), eos_id)
  sequences = sequences.reshape(batch_size, num_decodes, length)
  log_probs = final.log_prob.reshape(batch_size, num_decodes)
  if num_decodes == 1:
    # Nothing to sort: the sequences then do not depend on the scores, so a caller that drops
    # the scores (`predict_batch`) lets XLA remove their computation from the loop.
    return sequences, log_probs
  order = jnp.argsort(log_probs, axis=-1, stable=True)
  return (jnp.take_along_axis(sequences, order[:, :, None],
                              axis=1), jnp.take_along_axis(log_probs, order, axis=-1))


# ----------------------------------------------------------------------------------------------
# Beam search.
# ----------------------------------------------------------------------------------------------

# Width of the vocabulary blocks `best_extensions` ranks first; 128 divides mT5's and T5's
# embedding sizes (250,112 and 32,128).
EXTENSION_BLOCK_WIDTH = 128


def _extension_log_probs(logits: Array, tokens: Array, shift: Array, log_sum: Array,
                         live_logprobs: Array, prompt_token: Array) -> Array:
  """A beam step's candidate scores, elementwise: `log_softmax(logits)[token] + live_logprob`
  (`jax.nn.log_softmax`'s `(x - max) - log(sum(exp(x - max)))`), 0 + live_logprob for the forced
  prompt token and NEG_INF + live_logprob for the others where `prompt_token != 0` (T5X).

  All arguments broadcast to `tokens`' shape [batch, ...]; `prompt_token` is int [batch].
  """
  per_example = (prompt_token.shape[0],) + (1,) * (tokens.ndim - 1)
  log_probs = (logits - shift) - log_sum
  forced = jnp.where(tokens == prompt_token.reshape(per_example), 0.0, NEG_INF)
  return jnp.where((prompt_token != 0).reshape(per_example), forced, log_probs) + live_logprobs


def best_extensions(logits: Array,
                    live_logprobs: Array,
                    prompt_token: Array,
                    k: int,
                    block_width: Optional[int] = None) -> Tuple[Array, Array]:
  """T5X's beam step choice: `lax.top_k` over [batch, beam * vocab] of `log_softmax(logits)` (the
  prompt token forced) + `live_logprobs`, without materialising those scores.

  `logits` float32 [batch, beam, vocab]; `live_logprobs` float32 [batch, beam]; `prompt_token`
  int [batch] (0: none). Returns (scores float32 [batch, k], flat indices int32 [batch, k], index
  = beam * vocab + token), best first, ties to the lower index: the same values and indices as
  the flat `lax.top_k`. With blocks of `block_width` (default `EXTENSION_BLOCK_WIDTH`) tokens that
  divide the vocabulary into at least `k` per example, it ranks the blocks by their best score
  (the score is non-decreasing in the logit, so a block's best is its largest logit's), keeps the
  k best blocks (they hold the k best extensions) and ranks their tokens; else it scores every
  token.
  """
  batch, beams, vocab = logits.shape
  width = EXTENSION_BLOCK_WIDTH if block_width is None else block_width
  lps = live_logprobs[:, :, None]
  blocked = vocab % width == 0 and beams * (vocab // width) >= k
  if blocked:
    block_max = jnp.max(logits.reshape(batch, beams, vocab // width, width), axis=-1)
    shift = jnp.max(block_max, axis=-1, keepdims=True)  # why: the same value as the logits' max
  else:
    shift = jnp.max(logits, axis=-1, keepdims=True)
  log_sum = jnp.log(jnp.sum(jnp.exp(logits - shift), axis=-1, keepdims=True))
  if not blocked:
    tokens = lax.broadcasted_iota(jnp.int32, logits.shape, 2)
    scores = _extension_log_probs(logits, tokens, shift, log_sum, lps, prompt_token)
    return lax.top_k(scores.reshape(batch, beams * vocab), k)
  # A block's best score; a forced example's blocks score 0 (the block holding the prompt token)
  # or NEG_INF, plus the beam's log-prob, as their best token does.
  first_tokens = lax.broadcasted_iota(jnp.int32, block_max.shape, 2) * width
  holds_prompt = (first_tokens <= prompt_token[:, None, None]) & (
      prompt_token[:, None, None] < first_tokens + width)
  block_scores = jnp.where((prompt_token != 0)[:, None, None],
                           jnp.where(holds_prompt, 0.0, NEG_INF), (block_max - shift) - log_sum)
  block_scores = block_scores + lps
  _, blocks = lax.top_k(block_scores.reshape(batch, beams * (vocab // width)), k)
  # why sorted: the kept tokens then lie in ascending flat index, so the top_k below breaks ties
  # as the flat one does.
  blocks = jnp.sort(blocks, axis=-1)
  flat = (blocks[:, :, None] * width + jnp.arange(width, dtype=blocks.dtype)).reshape(batch, -1)
  beam, token = flat // vocab, flat % vocab
  rows = jnp.arange(batch)[:, None]
  scores = _extension_log_probs(logits[rows, beam, token], token, shift[rows, beam, 0],
                                log_sum[rows, beam, 0], live_logprobs[rows, beam], prompt_token)
  values, chosen = lax.top_k(scores, k)
  return values, jnp.take_along_axis(flat, chosen, axis=1)


def beam_search(inputs: Array,
                cache: PyTree,
                tokens_to_logits: TokensToLogits,
                eos_id: int,
                num_decodes: int = 4,
                alpha: float = 0.6) -> Tuple[Array, Array]:
  """Beam search with the GNMT length penalty (T5X `decoding.beam_search`, without `initial_index`,
  `cache_offset`, `min_log_prob` and callbacks).

  `inputs`: int [batch, max_decode_len] decoder prompt (module docstring); `cache` leading dim
  batch; `num_decodes`: beam size; `alpha` 0: no penalty. Returns sequences [batch, num_decodes,
  max_decode_len] (no BOS, 0 after EOS) and float32 [batch, num_decodes]
  `length_penalized_score`s, ascending (best last); slots without a distinct finished sequence
  score <= NEG_INF / 2. ValueError: malformed shapes or arguments.
  """
  inputs = _check_inputs(inputs, num_decodes)
  batch_size, length = inputs.shape
  beam_size = num_decodes
  _check_cache_batch(cache, batch_size)

  # Decoder positions [batch, length + 1]: BOS 0, the prompt (inputs[:, 1:]) and one extra slot.
  prompt = jnp.concatenate([inputs, jnp.zeros((batch_size, 1), inputs.dtype)], axis=1)
  prompt = prompt.at[:, 0].set(0)
  live_seqs0 = add_beam_dim(prompt, beam_size)  # [batch, beam, length + 1]
  state0 = BeamState(
      cur_index=jnp.array(0, jnp.int32),
      # Only beam 0 is alive at first, so the first step does not yield duplicates.
      live_logprobs=jnp.tile(
          jnp.array([0.0] + [float(NEG_INF)] * (beam_size - 1), jnp.float32), (batch_size, 1)),
      finished_scores=jnp.full((batch_size, beam_size), NEG_INF, jnp.float32),
      live_seqs=live_seqs0,
      finished_seqs=jnp.zeros_like(live_seqs0),
      finished_flags=jnp.zeros((batch_size, beam_size), bool),
      cache=cache_map(lambda x: add_beam_dim(x, beam_size), cache))
  max_penalty_len = brevity_penalty(alpha, length)

  def cond_fn(state: BeamState) -> Array:
    index = state.cur_index
    # Upper bound of any live beam's final score: log-probs only decrease, and the largest
    # penalty over the remaining lengths [index + 1, length] is at one of the ends.
    largest_penalty = jnp.maximum(brevity_penalty(alpha, index + 1), max_penalty_len)
    best_live = jnp.max(state.live_logprobs, axis=1) / largest_penalty
    worst_finished = jnp.where(
        jnp.all(state.finished_flags, axis=1), jnp.min(state.finished_scores, axis=1), NEG_INF)
    search_done = jnp.all(worst_finished > best_live)
    # Early exit only when no live beam can beat the worst finished one: the result equals the one
    # without it.
    return (index < length) & ~search_done

  def body_fn(state: BeamState) -> BeamState:
    index = state.cur_index
    live_seqs = state.live_seqs
    flat_seqs = flatten_beam_dim(live_seqs)
    flat_logits, new_flat_cache = tokens_to_logits(
        DecodingState(
            cur_index=jnp.full((batch_size * beam_size,), index, jnp.int32),
            sequences=flat_seqs[:, :-1],
            cur_token=lax.dynamic_index_in_dim(flat_seqs, index, axis=1, keepdims=False),
            cache=cache_map(flatten_beam_dim, state.cache)))
    vocab_size = flat_logits.shape[-1]
    # Prompt positions are forced (their log-prob does not count).
    prompt_token = lax.dynamic_index_in_dim(prompt, index + 1, axis=1, keepdims=False)
    in_prompt = prompt_token != 0
    topk_log_probs, topk_indices = best_extensions(
        unflatten_beam_dim(flat_logits.astype(jnp.float32), batch_size, beam_size),
        state.live_logprobs, prompt_token, 2 * beam_size)
    topk_parents = topk_indices // vocab_size
    topk_tokens = (topk_indices % vocab_size).astype(live_seqs.dtype)
    topk_seqs = gather_beams(live_seqs, topk_parents, batch_size, 2 * beam_size)
    topk_seqs = lax.dynamic_update_slice(topk_seqs, topk_tokens[:, :, None], (0, 0, index + 1))
    # why: T5X finishes a beam at EOS only; one at the length limit stays live (returned below
    # only for an example with no finished beam).
    newly_finished = (topk_tokens == eos_id) & ~in_prompt[:, None]

    # Live beams: the best non-finished extensions, with their parents' caches.
    new_live_logprobs = topk_log_probs + jnp.where(newly_finished, NEG_INF, 0.0)
    new_live_logprobs, live_choice = lax.top_k(new_live_logprobs, k=beam_size)
    new_live_seqs = gather_beams(topk_seqs, live_choice, batch_size, beam_size)
    live_parents = gather_beams(topk_parents, live_choice, batch_size, beam_size)
    new_cache = cache_map(lambda x: unflatten_beam_dim(x, batch_size, beam_size), new_flat_cache)
    new_cache = gather_beams(new_cache, live_parents, batch_size, beam_size)

    # Finished beams: merge the newly finished extensions by length-penalised score.
    new_scores = topk_log_probs / brevity_penalty(alpha, index + 1)
    new_scores = jnp.where(newly_finished, new_scores, NEG_INF)
    new_flags = newly_finished & (topk_log_probs > NEG_INF / 2)
    all_scores = jnp.concatenate([state.finished_scores, new_scores], axis=1)
    all_seqs = jnp.concatenate([state.finished_seqs, topk_seqs], axis=1)
    all_flags = jnp.concatenate([state.finished_flags, new_flags], axis=1)
    finished_scores, finished_seqs, finished_flags = gather_topk_beams(
        (all_scores, all_seqs, all_flags), all_scores, batch_size, beam_size)
    return BeamState(
        cur_index=index + 1,
        live_logprobs=new_live_logprobs,
        finished_scores=finished_scores,
        live_seqs=new_live_seqs,
        finished_seqs=finished_seqs,
        finished_flags=finished_flags,
        cache=new_cache)

  final = lax.while_loop(cond_fn, body_fn, state0)
  # As T5X: an example with no finished beam returns its live beams and their log-probs.
  any_finished = jnp.any(final.finished_flags, axis=1)
  seqs = jnp.where(any_finished[:, None, None], final.finished_seqs, final.live_seqs)
  scores = jnp.where(any_finished[:, None], final.finished_scores, final.live_logprobs)
  # [:, :, 1:] drops the BOS. Positions after the EOS were never written (0), except a prompt
  # that would continue after it; zero them for the documented invariant.
  sequences = _zero_after_eos(seqs[:, :, 1:], _output_layout(inputs)[:, None], eos_id)
  # top_k order is descending; T5X returns ascending (best last).
  return jnp.flip(sequences, axis=1), jnp.flip(scores, axis=1)
