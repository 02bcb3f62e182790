"""Tests of mcwq_t5x.engine.decoding against brute-force NumPy references on a path-dependent toy model.

The toy "model" keeps in its cache the sum of the tokens fed so far, the token history, a shared
scalar `cache_index` and a per-example bias; its next-token logits depend on all of them, on
`cur_index`, and it returns garbage (token 4 forced) whenever `DecodingState` is inconsistent with
its cache. A decoder that does not expand or gather the cache per beam, or that feeds the wrong
token/index/sequences, therefore gives different results from the references below.
"""
import functools
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mcwq_t5x.engine import decoding

V = 5  # vocabulary: 0 = BOS/pad, 1 = EOS, 2..4 other tokens
EOS = 1
S = 3  # path-sum buckets


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max()
  return x - np.log(np.exp(x).sum())


class ToyModel:
  """A tiny autoregressive model with a path-dependent cache (JAX and NumPy versions)."""

  def __init__(self, seed: int, batch: int, max_len: int, eos_extreme: bool = False):
    rng = np.random.RandomState(seed)
    self.batch, self.max_len, self.eos_extreme = batch, max_len, eos_extreme
    self.table = (1.5 * rng.normal(size=(V, S, V))).astype(np.float32)
    self.history_table = rng.normal(size=(2, V)).astype(np.float32)
    self.position_table = (0.5 * rng.normal(size=(max_len + 1, V))).astype(np.float32)
    self.bias = (2.0 * rng.normal(size=(batch, V))).astype(np.float32)

  def init_cache(self):
    return {
        "decoder": {
            "cache_index": jnp.array(0, jnp.int32),
            "path_sum": jnp.zeros((self.batch,), jnp.int32),
            "history": jnp.zeros((self.batch, self.max_len), jnp.int32),
            "bias": jnp.asarray(self.bias)
        }
    }

  def _eos_rule(self, logits, path_sum, index, xp):
    """Makes EOS either the best or the worst token (then beam 1 == greedy, see tests)."""
    others = xp.where(xp.arange(V) == EOS, -np.inf, logits)
    others_min = xp.where(xp.arange(V) == EOS, np.inf, logits)
    best = (path_sum + 2 * index) % 5 == 4
    eos_logit = xp.where(best, others.max(-1) + 1.0, others_min.min(-1) - 1.0)
    return xp.where(xp.arange(V) == EOS, eos_logit[..., None], logits)

  def tokens_to_logits(self, state: decoding.DecodingState):
    cache = state.cache["decoder"]
    cur = state.cur_token.astype(jnp.int32)
    idx = cache["cache_index"]
    history = cache["history"].at[:, idx].set(cur)
    path_sum = cache["path_sum"] + cur
    count3 = jnp.sum(history == 3, axis=1) % 2
    logits = (
        jnp.asarray(self.table)[cur, path_sum % S] + jnp.asarray(self.history_table)[count3] +
        jnp.asarray(self.position_table)[state.cur_index] + cache["bias"])
    if self.eos_extreme:
      logits = self._eos_rule(logits, path_sum, state.cur_index, jnp)
    # The decoder state must agree with the cache.
    seq = state.sequences.astype(jnp.int32)
    rows = jnp.arange(seq.shape[0])
    fed = jnp.arange(seq.shape[1])[None, :] <= state.cur_index[:, None]
    consistent = ((jnp.sum(jnp.where(fed, seq, 0), axis=1) == path_sum)
                  & (seq[rows, state.cur_index] == cur) & (state.cur_index == idx))
    garbage = 50.0 * jax.nn.one_hot(4, V)
    logits = jnp.where(consistent[:, None], logits, garbage)
    new_cache = {
        "decoder": {
            "cache_index": idx + 1,
            "path_sum": path_sum,
            "history": history,
            "bias": cache["bias"]
        }
    }
    return logits, new_cache

  # NumPy reference: `fed` = decoder inputs so far, starting with BOS 0; cur token = fed[-1].
  def ref_logits(self, b, fed):
    cur, index = fed[-1], len(fed) - 1
    path_sum = sum(fed)
    count3 = sum(1 for t in fed if t == 3) % 2
    logits = (
        self.table[cur, path_sum % S] + self.history_table[count3] + self.position_table[index] +
        self.bias[b])
    if self.eos_extreme:
      logits = self._eos_rule(logits, path_sum, index, np)
    return logits

  def ref_log_probs(self, b, fed):
    return _log_softmax(self.ref_logits(b, fed))

  def ref_score(self, b, tokens, prompt=None):
    """Sum of log-probs of the decoded (non-prompt) tokens up to and including the first EOS."""
    prompt = [0] * len(tokens) if prompt is None else list(prompt)
    fed, total = [0], 0.0
    for j, t in enumerate(tokens):
      if prompt[j]:
        assert t == prompt[j]
      else:
        total += self.ref_log_probs(b, fed)[t]
        if t == EOS:
          break
      fed.append(int(t))
    return total


def _decoder_inputs(prompt):
  """Prompt in output coordinates -> decoding `inputs` (decoder-input layout, BOS slot first)."""
  prompt = np.asarray(prompt)
  return jnp.asarray(np.concatenate([np.zeros_like(prompt[:, :1]), prompt[:, :-1]], axis=1))


def _bp(alpha, length):
  return ((5.0 + length) / 6.0)**alpha


def _pad(tokens, length):
  return list(tokens) + [0] * (length - len(tokens))


def ref_greedy(model, b, length, prompt=None):
  prompt = [0] * length if prompt is None else list(prompt)
  fed, out = [0], []
  for pos in range(length):
    t = prompt[pos] if prompt[pos] else int(np.argmax(model.ref_logits(b, fed)))
    out.append(t)
    fed.append(t)
    if t == EOS and not prompt[pos]:
      break
  return _pad(out, length)


def ref_beam_search(model, b, beam_size, alpha, length, prompt=None):
  """Straightforward list-based beam search with T5X's rules; returns [(score, tokens)] best first."""
  prompt = [0] * length if prompt is None else list(prompt)
  live, finished = [([], 0.0)], []
  for i in range(length):
    candidates = []
    for tokens, lp in live:
      if prompt[i]:
        candidates.append((tokens + [prompt[i]], lp, True))
      else:
        log_probs = model.ref_log_probs(b, [0] + tokens)
        candidates += [(tokens + [v], lp + log_probs[v], False) for v in range(V)]
    candidates.sort(key=lambda c: -c[1])
    live = []
    for tokens, lp, forced in candidates[:2 * beam_size]:
      if tokens[-1] == EOS and not forced:  # why: T5X does not finish a beam at the length limit
        finished.append((lp / _bp(alpha, i + 1), _pad(tokens, length)))
      else:
        live.append((tokens, lp))
    live = live[:beam_size]
    finished = sorted(finished, key=lambda f: -f[0])[:beam_size]
  return finished or [(lp, _pad(tokens, length)) for tokens, lp in live]


def all_sequences(length):
  """Every possible output: non-EOS tokens, then EOS or the length limit."""
  non_eos = [t for t in range(V) if t != EOS]
  for n in range(length + 1):
    for prefix in itertools.product(non_eos, repeat=n):
      if n < length:
        yield list(prefix) + [EOS] + [0] * (length - n - 1), n + 1
      else:
        yield list(prefix), length


def _assert_valid(sequences, scores):
  sequences, scores = np.asarray(sequences), np.asarray(scores)
  assert np.all(np.diff(scores, axis=-1) >= 0), scores
  is_eos = sequences == EOS
  after_eos = (np.cumsum(is_eos, axis=-1) - is_eos) > 0
  assert np.all(sequences[after_eos] == 0)


# ------------------------------------------------------------------------------------------------
# Helpers.
# ------------------------------------------------------------------------------------------------


def test_brevity_penalty_and_lengths():
  np.testing.assert_allclose(decoding.brevity_penalty(0.6, 1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(decoding.brevity_penalty(0.6, 7), 2.0**0.6, rtol=1e-6)
  np.testing.assert_allclose(decoding.brevity_penalty(0.0, 100), 1.0)
  seqs = jnp.array([[3, 1, 0, 0], [2, 2, 2, 2], [1, 0, 0, 0]])
  np.testing.assert_array_equal(decoding.sequence_lengths(seqs, EOS), [2, 4, 1])
  np.testing.assert_array_equal(decoding.sequence_lengths(seqs, EOS, max_len=6), [2, 6, 1])
  # An EOS inside the prompt does not end the sequence (inputs are in decoder-input layout).
  np.testing.assert_array_equal(
      decoding.sequence_lengths(jnp.array([[1, 2, 1, 0]]), EOS, inputs=jnp.array([[0, 1, 0, 0]])),
      [3])
  scores = decoding.length_penalized_score(jnp.array([-1.0, -2.0, -3.0]), seqs, EOS, 0.6)
  np.testing.assert_allclose(scores, [-1.0 / (7 / 6)**0.6, -2.0 / 1.5**0.6, -3.0], rtol=1e-6)


def test_beam_dim_helpers():
  x = jnp.arange(6).reshape(2, 3)
  np.testing.assert_array_equal(
      decoding.flat_batch_beam_expand(x, 2), [[0, 1, 2], [0, 1, 2], [3, 4, 5], [3, 4, 5]])
  beamed = decoding.add_beam_dim(x, 3)
  assert beamed.shape == (2, 3, 3)
  np.testing.assert_array_equal(
      decoding.unflatten_beam_dim(decoding.flatten_beam_dim(beamed), 2, 3), beamed)
  scalar = jnp.array(7)
  assert decoding.flat_batch_beam_expand(scalar, 4) is scalar
  y = jnp.arange(2 * 3).reshape(2, 3) * 10
  gathered = decoding.gather_beams({"y": y, "i": scalar}, jnp.array([[2, 0], [1, 1]]), 2, 2)
  np.testing.assert_array_equal(gathered["y"], [[20, 0], [40, 40]])
  assert int(gathered["i"]) == 7
  top = decoding.gather_topk_beams(y, jnp.array([[0.1, 0.9, 0.5], [3.0, 2.0, 1.0]]), 2, 2)
  np.testing.assert_array_equal(top, [[10, 20], [30, 40]])
  with pytest.raises(ValueError, match="unflatten_beam_dim"):
    decoding.unflatten_beam_dim(jnp.zeros((5, 2)), 2, 3)


# ------------------------------------------------------------------------------------------------
# Greedy decoding and sampling.
# ------------------------------------------------------------------------------------------------


def test_argmax_last_is_argmax():
  """First index of the maximum, ties and NaN (first NaN) included, any leading shape."""
  x = np.random.RandomState(0).randint(0, 4, size=(3, 5, 7)).astype(np.float32)
  x[0, 0, 3] = np.nan
  x[1, 2, [1, 5]] = np.nan
  x[2, 1] = -np.inf
  got = decoding.argmax_last(jnp.asarray(x))
  np.testing.assert_array_equal(got, jnp.argmax(jnp.asarray(x), axis=-1))
  assert got.dtype == jnp.int32


def test_greedy_matches_python_loop():
  batch, length = 3, 6
  model = ToyModel(seed=4, batch=batch, max_len=length)
  inputs = jnp.zeros((batch, length), jnp.int32)
  seqs, log_probs = decoding.temperature_sample(
      inputs, model.init_cache(), model.tokens_to_logits, EOS, temperature=0.0)
  assert seqs.shape == (batch, 1, length) and log_probs.shape == (batch, 1)
  assert seqs.dtype == jnp.int32 and log_probs.dtype == jnp.float32
  expected = [ref_greedy(model, b, length) for b in range(batch)]
  np.testing.assert_array_equal(seqs[:, 0], expected)
  np.testing.assert_allclose(
      log_probs[:, 0], [model.ref_score(b, expected[b]) for b in range(batch)],
      rtol=1e-5,
      atol=1e-5)
  assert len({tuple(e) for e in expected}) > 1, "examples should decode differently"
  _assert_valid(seqs, log_probs)
  # topk=1 with a temperature is greedy too (no rng needed), with the same log-probs.
  seqs_topk1, lp_topk1 = decoding.temperature_sample(
      inputs, model.init_cache(), model.tokens_to_logits, EOS, temperature=0.7, topk=1)
  np.testing.assert_array_equal(seqs_topk1, seqs)
  np.testing.assert_array_equal(lp_topk1, log_probs)


def test_greedy_with_prompt():
  batch, length = 2, 6
  model = ToyModel(seed=11, batch=batch, max_len=length)
  prompt = np.zeros((batch, length), np.int32)
  prompt[:, :2] = [[3, 4], [2, 3]]
  inputs = _decoder_inputs(prompt)  # [[0, 3, 4, 0, 0, 0], [0, 2, 3, 0, 0, 0]] as in T5X.
  np.testing.assert_array_equal(inputs[:, :3], [[0, 3, 4], [0, 2, 3]])
  seqs, log_probs = decoding.temperature_sample(
      inputs, model.init_cache(), model.tokens_to_logits, EOS, temperature=0.0)
  for b in range(batch):
    expected = ref_greedy(model, b, length, prompt[b])
    assert expected[:2] == list(prompt[b, :2])
    np.testing.assert_array_equal(seqs[b, 0], expected)
    np.testing.assert_allclose(
        log_probs[b, 0], model.ref_score(b, expected, prompt[b]), rtol=1e-5, atol=1e-5)


def test_prompt_after_a_decoded_eos_is_zeroed():
  """Only a decoded EOS ends a row; prompt tokens after it become padding (both decoders)."""

  def always_eos(state):
    logits = jnp.where(jnp.arange(V) == EOS, 5.0, 0.0)
    return jnp.tile(logits, (state.cur_token.shape[0], 1)), state.cache

  cache = {"cache_index": jnp.array(0, jnp.int32)}
  # Row 0: prompt 4 at returned position 1, after the EOS decoded at 0. Row 1: 3 forced, then EOS.
  inputs = jnp.array([[0, 0, 4, 0], [0, 3, 0, 0]], jnp.int32)
  eos_log_prob = 5.0 - np.log(np.exp(5.0) + V - 1)
  seqs, log_probs = decoding.temperature_sample(inputs, cache, always_eos, EOS, temperature=0.0)
  np.testing.assert_array_equal(seqs[:, 0], [[1, 0, 0, 0], [3, 1, 0, 0]])
  np.testing.assert_allclose(log_probs[:, 0], [eos_log_prob] * 2, rtol=1e-6)
  beams, scores = decoding.beam_search(inputs, cache, always_eos, EOS, num_decodes=2, alpha=0.0)
  np.testing.assert_array_equal(beams[:, -1], [[1, 0, 0, 0], [3, 1, 0, 0]])
  np.testing.assert_allclose(scores[:, -1], [eos_log_prob] * 2, rtol=1e-6)


def test_sampling_distribution_topk_and_log_probs():
  batch, length, n = 2, 3, 1024
  model = ToyModel(seed=3, batch=batch, max_len=length)
  inputs = jnp.zeros((batch, length), jnp.int32)
  temperature = 0.8
  seqs, log_probs = decoding.temperature_sample(
      inputs,
      model.init_cache(),
      model.tokens_to_logits,
      EOS,
      decode_rng=jax.random.PRNGKey(0),
      num_decodes=n,
      temperature=temperature,
      topk=0)
  assert seqs.shape == (batch, n, length)
  _assert_valid(seqs, log_probs)
  seqs, log_probs = np.asarray(seqs), np.asarray(log_probs)
  for b in range(batch):
    probs = np.exp(_log_softmax(model.ref_logits(b, [0]) / temperature))
    freq = np.bincount(seqs[b, :, 0], minlength=V) / n
    np.testing.assert_allclose(freq, probs, atol=0.05)
    for k in range(0, n, 97):  # Log-probs are the model's (untempered) token log-probs.
      np.testing.assert_allclose(log_probs[b, k], model.ref_score(b, seqs[b, k]), atol=1e-4)
  assert not np.array_equal(seqs[0], seqs[1])
  # topk=2: every decoded token is one of the two most likely given its prefix.
  seqs2, _ = decoding.temperature_sample(
      inputs,
      model.init_cache(),
      model.tokens_to_logits,
      EOS,
      decode_rng=jax.random.PRNGKey(1),
      num_decodes=64,
      temperature=1.5,
      topk=2)
  seqs2 = np.asarray(seqs2)
  seen = set()
  for b in range(batch):
    for k in range(64):
      fed = [0]
      for t in seqs2[b, k]:
        top2 = np.argsort(-model.ref_logits(b, fed))[:2]
        assert t in top2
        seen.add(int(t))
        if t == EOS:
          break
        fed.append(int(t))
  assert len(seen) > 2


def test_temperature_sample_errors():
  model = ToyModel(seed=0, batch=2, max_len=3)
  inputs = jnp.zeros((2, 3), jnp.int32)
  with pytest.raises(ValueError, match="decode_rng"):
    decoding.temperature_sample(
        inputs, model.init_cache(), model.tokens_to_logits, EOS, temperature=1.0, topk=0)
  with pytest.raises(ValueError, match="temperature must be >= 0"):
    decoding.temperature_sample(
        inputs,
        model.init_cache(),
        model.tokens_to_logits,
        EOS,
        decode_rng=jax.random.PRNGKey(0),
        temperature=-1.0)
  with pytest.raises(ValueError, match="topk must be >= 0"):
    decoding.temperature_sample(
        inputs,
        model.init_cache(),
        model.tokens_to_logits,
        EOS,
        decode_rng=jax.random.PRNGKey(0),
        topk=-2)
  with pytest.raises(ValueError, match="num_decodes must be >= 1"):
    decoding.beam_search(inputs, model.init_cache(), model.tokens_to_logits, EOS, num_decodes=0)
  bad_cache = model.init_cache()
  bad_cache["decoder"]["history"] = jnp.zeros((3, 3), jnp.int32)
  with pytest.raises(ValueError, match=r"\['decoder'\]\['history'\].*batch size 2"):
    decoding.beam_search(inputs, bad_cache, model.tokens_to_logits, EOS)
  with pytest.raises(ValueError, match=r"\[batch, max_decode_len\]"):
    decoding.beam_search(inputs[0], model.init_cache(), model.tokens_to_logits, EOS)


# ------------------------------------------------------------------------------------------------
# Beam search.
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_wide_beam_equals_brute_force(alpha):
  """A beam of 160 keeps every prefix (4**3 * 5 = 320 = 2 * 160 candidates): exhaustive search."""
  batch, length, beam = 2, 4, 160
  model = ToyModel(seed=7, batch=batch, max_len=length)
  seqs, scores = decoding.beam_search(
      jnp.zeros((batch, length), jnp.int32),
      model.init_cache(),
      model.tokens_to_logits,
      EOS,
      num_decodes=beam,
      alpha=alpha)
  assert seqs.shape == (batch, beam, length) and scores.shape == (batch, beam)
  _assert_valid(seqs, scores)
  for b in range(batch):
    # Only sequences ending in EOS finish (T5X): 85 of them, the other slots stay empty.
    ranked = sorted(
        ((model.ref_score(b, s) / _bp(alpha, n), s) for s, n in all_sequences(length) if EOS in s),
        key=lambda x: -x[0])[:beam]
    k = len(ranked)
    assert k == 85
    np.testing.assert_allclose(scores[b, ::-1][:k], [r[0] for r in ranked], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(seqs[b, ::-1][:k], [r[1] for r in ranked])
    assert (np.asarray(scores[b, ::-1][k:]) <= decoding.NEG_INF / 2).all()
  # The returned scores are length_penalized_score of the re-scored sequences.
  top = np.asarray(seqs)[:, -85:]
  rescored = np.array([[model.ref_score(b, s) for s in top[b]] for b in range(batch)])
  np.testing.assert_allclose(
      decoding.length_penalized_score(rescored, top, EOS, alpha, max_len=length),
      np.asarray(scores)[:, -85:],
      rtol=1e-5,
      atol=1e-5)


# The flat top_k of T5X's beam step and its block-ranked form, each compiled once.
_FLAT_EXTENSIONS = jax.jit(
    functools.partial(decoding.best_extensions, block_width=10**9), static_argnums=3)
_BLOCKED_EXTENSIONS = jax.jit(
    functools.partial(decoding.best_extensions, block_width=8), static_argnums=3)

CASES = ["random", "ties", "tie_across_blocks", "prompt", "one_live_beam"]


@pytest.mark.parametrize("case", CASES)
def test_best_extensions_ranked_by_blocks_equals_the_flat_top_k(case):
  """Ranking 8-token blocks first keeps T5X's flat `top_k` choice: the same indices (ties to the
  lower beam * vocab index, as `lax.top_k` breaks them) and scores, where k best blocks hold
  ties across blocks and beams, forced prompt tokens, and beams at NEG_INF."""
  batch, beams, vocab, k = 3, 4, 64, 8
  rng = np.random.RandomState(CASES.index(case))
  logits = rng.normal(size=(batch, beams, vocab)).astype(np.float32)
  live = -rng.uniform(0, 2, size=(batch, beams)).astype(np.float32)
  prompt_token = np.zeros((batch,), np.int32)
  if case == "ties":  # why: integer logits and equal beams: many candidates share the k-th score
    logits = np.round(logits).astype(np.float32)
    live[:] = -1.0
  if case == "tie_across_blocks":
    # Beam 0 alone: token 60 best; then 1.0 at tokens 0..15 and 61. The best block (56..63)
    # holds a tied token of a higher index than the 7 that must win.
    logits[:] = 0.0
    logits[:, 0, :16] = logits[:, 0, 61] = 1.0
    logits[:, 0, 60] = 3.0
    live[:, 1:] = decoding.NEG_INF
  if case == "prompt":
    prompt_token[[0, 2]] = [5, 63]
  if case == "one_live_beam":  # the first step: beams 1.. are NEG_INF
    live[:, 1:] = decoding.NEG_INF
  flat_scores, flat_index = _FLAT_EXTENSIONS(logits, live, prompt_token, k)
  scores, index = _BLOCKED_EXTENSIONS(logits, live, prompt_token, k)
  np.testing.assert_array_equal(index, flat_index)
  np.testing.assert_allclose(scores, flat_scores, rtol=1e-6)
  # The reference: log_softmax + live log-prob in float64, forced rows 0 / NEG_INF, ranked.
  for b in range(batch):
    ref = np.stack([_log_softmax(row) for row in logits[b]]) + live[b][:, None]
    if prompt_token[b]:
      ref = np.where(np.arange(vocab) == prompt_token[b], 0.0, decoding.NEG_INF) + live[b][:, None]
    order = sorted(range(beams * vocab), key=lambda i: (-ref.ravel()[i], i))[:k]
    np.testing.assert_allclose(scores[b], ref.ravel()[order], rtol=1e-5, atol=1e-5)
    if case != "ties":  # why: float32 and float64 may order exact ties' neighbours differently
      np.testing.assert_array_equal(index[b], order)
  if case == "tie_across_blocks":
    np.testing.assert_array_equal(index[:, :3], [[60, 0, 1]] * batch)


@pytest.mark.parametrize("beam,alpha", [(2, 0.0), (4, 1.5)])
def test_beam_search_matches_reference(beam, alpha):
  batch, length = 3, 5
  model = ToyModel(seed=beam, batch=batch, max_len=length)
  seqs, scores = decoding.beam_search(
      jnp.zeros((batch, length), jnp.int32),
      model.init_cache(),
      model.tokens_to_logits,
      EOS,
      num_decodes=beam,
      alpha=alpha)
  _assert_valid(seqs, scores)
  best = []
  for b in range(batch):
    expected = ref_beam_search(model, b, beam, alpha, length)
    np.testing.assert_allclose(scores[b, ::-1], [e[0] for e in expected], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(seqs[b, ::-1], [e[1] for e in expected])
    best.append(tuple(expected[0][1]))
  assert len(set(best)) > 1, "examples should decode differently"


def test_beam_search_with_prompt():
  batch, length, beam, alpha = 2, 5, 3, 0.6
  model = ToyModel(seed=21, batch=batch, max_len=length)
  prompt = np.zeros((batch, length), np.int32)
  prompt[0, :2] = [2, 3]
  prompt[1, :1] = [4]
  inputs = _decoder_inputs(prompt).at[:, 0].set(3)  # The BOS slot inputs[:, 0] is ignored.
  seqs, scores = decoding.beam_search(
      inputs, model.init_cache(), model.tokens_to_logits, EOS, num_decodes=beam, alpha=alpha)
  assert seqs.shape == (batch, beam, length)
  _assert_valid(seqs, scores)
  for b in range(batch):
    expected = ref_beam_search(model, b, beam, alpha, length, prompt[b])
    np.testing.assert_array_equal(seqs[b, ::-1], [e[1] for e in expected])
    np.testing.assert_allclose(scores[b, ::-1], [e[0] for e in expected], rtol=1e-5, atol=1e-5)
    rescored = [model.ref_score(b, s, prompt[b]) for s in seqs[b]]
    np.testing.assert_allclose(
        decoding.length_penalized_score(
            np.array(rescored), seqs[b], EOS, alpha, inputs=_decoder_inputs(prompt)[b]),
        scores[b],
        rtol=1e-5,
        atol=1e-5)
  np.testing.assert_array_equal(seqs[0, :, :2], [[2, 3]] * beam)
  np.testing.assert_array_equal(seqs[1, :, 0], [4] * beam)


def test_beam_one_equals_greedy():
  # With EOS always best or worst, the runner-up is never an early EOS, so beam 1 == greedy.
  batch, length, alpha = 4, 6, 0.6
  model = ToyModel(seed=13, batch=batch, max_len=length, eos_extreme=True)
  inputs = jnp.zeros((batch, length), jnp.int32)
  beam_seqs, beam_scores = decoding.beam_search(
      inputs, model.init_cache(), model.tokens_to_logits, EOS, num_decodes=1, alpha=alpha)
  greedy_seqs, greedy_lp = decoding.temperature_sample(
      inputs, model.init_cache(), model.tokens_to_logits, EOS, temperature=0.0)
  # why: as T5X, a beam at the length limit without EOS does not finish, so only the examples
  # whose greedy decode ends in EOS must agree.
  ended = np.asarray((greedy_seqs == EOS).any(-1)).reshape(batch)
  assert 2 <= ended.sum() < batch  # why: both kinds of example
  beam_seqs, beam_scores = np.asarray(beam_seqs)[ended], np.asarray(beam_scores)[ended]
  greedy_seqs, greedy_lp = np.asarray(greedy_seqs)[ended], np.asarray(greedy_lp)[ended]
  np.testing.assert_array_equal(beam_seqs, greedy_seqs)
  np.testing.assert_allclose(
      beam_scores,
      decoding.length_penalized_score(greedy_lp, greedy_seqs, EOS, alpha),
      rtol=1e-5,
      atol=1e-5)


def test_under_jit():
  batch, length, beam, alpha = 2, 5, 3, 0.6
  model = ToyModel(seed=2, batch=batch, max_len=length)
  inputs = jnp.zeros((batch, length), jnp.int32)
  jitted = jax.jit(
      functools.partial(
          decoding.beam_search,
          tokens_to_logits=model.tokens_to_logits,
          eos_id=EOS,
          num_decodes=beam,
          alpha=alpha))
  seqs, scores = jitted(inputs, model.init_cache())
  for b in range(batch):
    expected = ref_beam_search(model, b, beam, alpha, length)
    np.testing.assert_array_equal(seqs[b, ::-1], [e[1] for e in expected])
    np.testing.assert_allclose(scores[b, ::-1], [e[0] for e in expected], rtol=1e-5, atol=1e-5)
  sample = jax.jit(
      functools.partial(
          decoding.temperature_sample,
          tokens_to_logits=model.tokens_to_logits,
          eos_id=EOS,
          num_decodes=8,
          temperature=2.0,
          topk=0))
  seqs, log_probs = sample(inputs, model.init_cache(), decode_rng=jax.random.PRNGKey(4))
  _assert_valid(seqs, log_probs)
  seqs, log_probs = np.asarray(seqs), np.asarray(log_probs)
  assert all(len({tuple(s) for s in seqs[b]}) > 2 for b in range(batch))
  # The same key gives the same samples.
  again, _ = sample(inputs, model.init_cache(), decode_rng=jax.random.PRNGKey(4))
  np.testing.assert_array_equal(again, seqs)
  for b in range(batch):
    np.testing.assert_allclose(log_probs[b], [model.ref_score(b, s) for s in seqs[b]], atol=1e-4)


class TinyLM(nn.Module):
  """A one-layer causal self-attention LM with flax's KV cache (`decode=True`)."""
  dim: int = 16

  @nn.compact
  def __call__(self, tokens, decode: bool = False):
    x = nn.Embed(V, self.dim)(tokens)
    mask = None if decode else nn.make_causal_mask(tokens)
    x = x + nn.MultiHeadDotProductAttention(
        num_heads=2, qkv_features=self.dim, decode=decode)(
            x, mask=mask)
    return nn.Dense(V)(jnp.tanh(x)) * 3.0


def test_flax_kv_cache_model():
  """Greedy and beam search with a real flax cache equal references recomputing full prefixes."""
  batch, length, beam, alpha = 2, 5, 3, 0.6
  module = TinyLM()
  params = module.init(jax.random.PRNGKey(0), jnp.zeros((1, length), jnp.int32))["params"]
  cache = module.init(
      jax.random.PRNGKey(0), jnp.zeros((batch, length), jnp.int32), decode=True)["cache"]
  leaves = jax.tree_util.tree_leaves_with_path(cache)
  assert any(leaf.ndim == 0 for _, leaf in leaves)  # the scalar cache_index
  assert any(leaf.ndim == 4 and leaf.shape[0] == batch for _, leaf in leaves)  # cached_key

  def tokens_to_logits(state):
    logits, variables = module.apply({
        "params": params,
        "cache": state.cache
    },
                                     state.cur_token[:, None],
                                     decode=True,
                                     mutable=["cache"])
    return logits[:, 0], variables["cache"]

  full_forward = jax.jit(lambda tokens: module.apply({"params": params}, tokens))

  class Reference:
    """`ref_logits` for ref_greedy / ref_beam_search: full forward pass over the prefix."""

    def ref_logits(self, b, fed):
      del b
      # why: one program for every prefix: TinyLM is causal, so the logits at the prefix's last
      # position do not read the padding after it
      padded = np.zeros((1, length), np.int32)
      padded[0, :len(fed)] = fed
      return np.asarray(full_forward(jnp.asarray(padded))[0, len(fed) - 1], np.float64)

    def ref_log_probs(self, b, fed):
      return _log_softmax(self.ref_logits(b, fed))

  reference = Reference()
  inputs = jnp.zeros((batch, length), jnp.int32)
  seqs, _ = decoding.temperature_sample(inputs, cache, tokens_to_logits, EOS, temperature=0.0)
  np.testing.assert_array_equal(seqs[:, 0], [ref_greedy(reference, 0, length)] * batch)
  seqs, scores = decoding.beam_search(
      inputs, cache, tokens_to_logits, EOS, num_decodes=beam, alpha=alpha)
  expected = ref_beam_search(reference, 0, beam, alpha, length)
  for b in range(batch):
    np.testing.assert_array_equal(seqs[b, ::-1], [e[1] for e in expected])
    np.testing.assert_allclose(scores[b, ::-1], [e[0] for e in expected], rtol=1e-4, atol=1e-4)
