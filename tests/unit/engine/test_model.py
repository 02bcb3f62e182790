"""Tests of EncoderDecoderModel (loss and its normalisation, packing, decoding, scoring).

The inputs are built here: four synthetic (input, target) token sequences of different lengths
(no ../shared data), short enough that two fit in one packed row.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mcwq_t5x.engine import decoding
from mcwq_t5x.engine import model as model_lib
from mcwq_t5x.engine import network
import tiny_engine

VOCAB = 160
EOS = 1
CFG = tiny_engine.config(VOCAB, layers=2, emb_dim=48, num_heads=4, head_dim=12, mlp_dim=96)
FACTORS = (None, "NUM_REAL_TARGET_TOKENS", "num_total_target_tokens", "AVERAGE_PER_SEQUENCE", 7.0)
# The default model and its jitted functions, shared by the tests: one compilation per input shape,
# and one `predict_batch` program per decoding method for the random and the trained parameters.
MODEL = model_lib.EncoderDecoderModel(network.Transformer(CFG))
SCORE_BATCH = jax.jit(MODEL.score_batch)
TOKEN_SCORES = jax.jit(MODEL.token_scores)
EVAL_FN = jax.jit(MODEL.eval_fn)
# The network's logits, straight from `Transformer.apply` (the references' input).
_APPLY = jax.jit(network.Transformer(CFG).apply, static_argnames="enable_dropout")


def _pad(rows, length):
  out = np.zeros((len(rows), length), np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out


def _shift_right(targets):
  return np.concatenate([np.zeros_like(targets[:, :1]), targets[:, :-1]], 1)


def _batch(inputs, targets, in_len, tgt_len):
  return tiny_engine.feature_batch(inputs, targets, in_len, tgt_len, weights_dtype=np.float32)


@pytest.fixture(scope="module")
def examples():
  """Token ids (EOS last) of 4 synthetic (input, target) pairs, lengths 5-10."""
  rng = np.random.default_rng(0)
  inputs = [list(rng.integers(2, VOCAB, n)) + [EOS] for n in (6, 9, 5, 8)]
  targets = [list(rng.integers(2, VOCAB, n)) + [EOS] for n in (4, 7, 9, 5)]
  return inputs, targets


@pytest.fixture(scope="module")
def batch(examples):
  inputs, targets = examples
  return _batch(inputs, targets, max(map(len, inputs)) + 3, max(map(len, targets)) + 2)


@pytest.fixture(scope="module")
def params():
  model = model_lib.EncoderDecoderModel(network.Transformer(CFG))
  shapes = {"encoder_input_tokens": (2, 8), "decoder_input_tokens": (2, 8)}
  variables = jax.jit(lambda r: model.get_initial_variables(r, shapes))(jax.random.PRNGKey(0))
  assert isinstance(variables["params"]["encoder"]["encoder_norm"]["scale"],
                    nn.LogicallyPartitioned)
  return nn.unbox(variables["params"])


def _numpy_losses(logits, targets, label_smoothing, z_loss):
  """Per-token (cross-entropy, z-loss) float64 [batch, len], unweighted (T5X formulas)."""
  logits = np.asarray(logits, np.float64)
  v = logits.shape[-1]
  log_z = np.log(np.exp(logits).sum(-1))
  log_p = logits - log_z[..., None]
  conf, low = 1 - label_smoothing, label_smoothing / (v - 1)
  soft = np.full(logits.shape, low)
  np.put_along_axis(soft, targets[..., None], conf, axis=-1)
  const = -(conf * np.log(conf) + (v - 1) * low * np.log(low + 1e-20))
  return -(soft * log_p).sum(-1) - const, z_loss * log_z**2


def _logits(params, batch):
  return np.asarray(
      _APPLY({"params": params},
             batch["encoder_input_tokens"],
             batch["decoder_input_tokens"],
             batch["decoder_target_tokens"],
             enable_dropout=False))


@pytest.mark.parametrize("label_smoothing,factor", [(0.0, None), (0.1, 233472.0)])
def test_loss_matches_t5x_formula(params, batch, label_smoothing, factor):
  model = model_lib.EncoderDecoderModel(
      network.Transformer(CFG),
      label_smoothing=label_smoothing,
      z_loss=1e-3,
      loss_normalizing_factor=factor)
  loss, metrics = jax.jit(model.eval_fn)(params, batch)
  logits = _logits(params, batch)
  weights = batch["decoder_loss_weights"]
  ce, z = _numpy_losses(logits, batch["decoder_target_tokens"], label_smoothing, 1e-3)
  ce, z = (ce * weights).sum(), (z * weights).sum()
  n = weights.sum()
  np.testing.assert_allclose(metrics["cross_ent_loss"], ce, rtol=1e-5)
  np.testing.assert_allclose(metrics["z_loss"], z, rtol=1e-4)
  np.testing.assert_allclose(metrics["loss"], ce + z, rtol=1e-5)
  np.testing.assert_allclose(loss, (ce + z) / (factor or n), rtol=1e-5)
  assert metrics["num_tokens"] == n
  assert metrics["num_examples"] == 4
  correct = (np.argmax(logits, -1) == batch["decoder_target_tokens"]) * weights
  assert metrics["accuracy_numerator"] == correct.sum()
  # Untrained model: cross-entropy per token close to log(vocab).
  assert abs(ce / n - np.log(VOCAB)) < 1.0


def _models(factors):
  return {
      str(f): model_lib.EncoderDecoderModel(network.Transformer(CFG), loss_normalizing_factor=f)
      for f in factors
  }


def test_loss_normalizing_factors(params, batch):
  """T5X's `loss_normalizing_factor` options, against NumPy (metrics do not depend on them)."""
  models = _models(FACTORS)
  out = jax.jit(lambda p, b: {k: m.eval_fn(p, b) for k, m in models.items()})(params, batch)
  total = sum(_numpy_losses(_logits(params, batch), batch["decoder_target_tokens"], 0.0, 1e-4))
  weights = batch["decoder_loss_weights"]
  row_sums = (total * weights).sum(1)
  row_tokens = weights.sum(1)
  assert len(set(row_tokens)) == 4, "rows of different lengths"
  expected = {
      "None": row_sums.sum() / weights.sum(),
      "NUM_REAL_TARGET_TOKENS": row_sums.sum() / weights.sum(),
      "num_total_target_tokens": row_sums.sum() / weights.size,
      "AVERAGE_PER_SEQUENCE": np.mean(row_sums / row_tokens),
      "7.0": row_sums.sum() / 7.0,
  }
  for key, (loss, metrics) in out.items():
    np.testing.assert_allclose(loss, expected[key], rtol=1e-5, err_msg=key)
    np.testing.assert_allclose(metrics["loss"], row_sums.sum(), rtol=1e-5)
  assert models["num_total_target_tokens"].loss_normalizing_factor == ("NUM_TOTAL_TARGET_TOKENS")
  # float32 sums from XLA: their order (and last bit) differs between CPU models, so compare with a
  # tolerance (an exact `== 4.0` got 3.9999995 on another machine of this kind).
  np.testing.assert_allclose(
      float(models["AVERAGE_PER_SEQUENCE"].loss_normalizer(batch)), 4.0, rtol=1e-6)
  np.testing.assert_allclose(float(models["None"].loss_normalizer(batch)), weights.sum(), rtol=1e-6)


def test_microbatch_losses_add_up_to_the_batch_loss(params, batch):
  """Rows split in two, each normalised by the whole batch's normalizer: losses
  and metric sums add up to the whole batch's (the loss contract; the trainer
  test checks the gradients)."""
  models = _models((None, "AVERAGE_PER_SEQUENCE", "NUM_TOTAL_TARGET_TOKENS", 3.0))
  halves = [{k: v[s] for k, v in batch.items()} for s in (slice(0, 1), slice(1, 4))]

  def losses(p):
    return {
        key: (m.loss_fn(p, batch, None),
              [m.loss_fn(p, h, None, normalizer=m.loss_normalizer(batch))
               for h in halves]) for key, m in models.items()
    }

  for key, ((full, full_m), parts) in jax.jit(losses)(params).items():
    np.testing.assert_allclose(parts[0][0] + parts[1][0], full, rtol=1e-5, err_msg=key)
    for m in full_m:
      np.testing.assert_allclose(
          parts[0][1][m] + parts[1][1][m], full_m[m], rtol=1e-5, err_msg=f"{key} {m}")


def _pack(examples, pairs, in_len, tgt_len):
  """Packs examples as seqio's EncDecFeatureConverter(pack=True) does."""
  inputs, targets = examples
  rows = {
      k: [] for k in ("encoder_input_tokens", "decoder_target_tokens", "encoder_segment_ids",
                     "decoder_segment_ids", "encoder_positions", "decoder_positions",
                     "decoder_input_tokens")
  }
  for pair in pairs:
    enc, tgt, eseg, dseg, epos, dpos, dec = [], [], [], [], [], [], []
    for seg, i in enumerate(pair, start=1):
      enc += inputs[i]
      tgt += targets[i]
      dec += [0] + targets[i][:-1]  # shifted within the segment
      eseg += [seg] * len(inputs[i])
      dseg += [seg] * len(targets[i])
      epos += list(range(len(inputs[i])))
      dpos += list(range(len(targets[i])))
    for key, row in zip(
        ("encoder_input_tokens", "decoder_target_tokens", "encoder_segment_ids",
         "decoder_segment_ids", "encoder_positions", "decoder_positions", "decoder_input_tokens"),
        (enc, tgt, eseg, dseg, epos, dpos, dec)):
      rows[key].append(row)
  out = {k: _pad(v, in_len if k.startswith("encoder") else tgt_len) for k, v in rows.items()}
  out["decoder_loss_weights"] = (out["decoder_target_tokens"] > 0).astype(np.float32)
  return out


def test_packed_and_unpacked_give_the_same_per_example_loss(params, batch, examples):
  inputs, targets = examples
  pairs = [(0, 1), (2, 3)]
  in_len = max(len(inputs[a]) + len(inputs[b]) for a, b in pairs) + 2
  tgt_len = max(len(targets[a]) + len(targets[b]) for a, b in pairs) + 2
  packed = _pack(examples, pairs, in_len, tgt_len)
  unpacked_scores = np.asarray(SCORE_BATCH(params, batch))
  token_scores = np.asarray(TOKEN_SCORES(params, packed))
  for row, pair in enumerate(pairs):
    for seg, i in enumerate(pair, start=1):
      in_segment = packed["decoder_segment_ids"][row] == seg
      np.testing.assert_allclose(
          token_scores[row][in_segment].sum(), unpacked_scores[i], rtol=1e-5, atol=1e-4)
  # The loss and its metrics; AVERAGE_PER_SEQUENCE averages over segments.
  models = _models((None, "AVERAGE_PER_SEQUENCE"))
  evals = jax.jit(lambda p, b: {k: m.eval_fn(p, b) for k, m in models.items()})
  out_packed, out_unpacked = evals(params, packed), evals(params, batch)
  for key in models:
    np.testing.assert_allclose(out_packed[key][0], out_unpacked[key][0], rtol=1e-5, err_msg=key)
  # 4 segments; a float32 sum from XLA, so with a tolerance (see test_loss_normalizing_factors).
  np.testing.assert_allclose(
      float(models["AVERAGE_PER_SEQUENCE"].loss_normalizer(packed)), 4.0, rtol=1e-6)
  m_packed, m_unpacked = out_packed["None"][1], out_unpacked["None"][1]
  for key in ("loss", "cross_ent_loss", "z_loss"):
    np.testing.assert_allclose(m_packed[key], m_unpacked[key], rtol=1e-5)
  for key in ("num_tokens", "num_examples", "accuracy_numerator"):
    assert m_packed[key] == m_unpacked[key], key
  # Without segment ids the packed rows would attend across examples.
  unsegmented = {k: v for k, v in packed.items() if "segment" not in k and "positions" not in k}
  wrong = np.asarray(TOKEN_SCORES(params, unsegmented))
  assert np.abs(wrong - token_scores).max() > 1e-3


@pytest.fixture(scope="module")
def trained(params, batch):
  """The tiny model fitted to the 4 examples (Adam, 200 steps)."""
  model = MODEL
  opt = optax.adam(optax.cosine_decay_schedule(1e-2, 200, alpha=0.05))

  def step(carry, rng):
    p, state = carry
    (loss, _), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(p, batch, rng)
    updates, state = opt.update(grads, state, p)
    return (optax.apply_updates(p, updates), state), loss

  @jax.jit
  def fit(p):
    # why: the 200 steps in one program (a scan), not 200 calls from Python
    (p, _), losses = jax.lax.scan(step, (p, opt.init(p)),
                                  jax.vmap(jax.random.PRNGKey)(jnp.arange(200)))
    return p, losses

  p, losses = fit(params)
  return model, p, [float(loss) for loss in losses]


def _batch_from_tokens(batch, tokens):
  return dict(
      encoder_input_tokens=batch["encoder_input_tokens"],
      decoder_input_tokens=_shift_right(tokens),
      decoder_target_tokens=tokens,
      decoder_loss_weights=(tokens > 0).astype(np.float32))


def test_training_reduces_loss_and_greedy_reproduces_targets(trained, batch):
  model, p, losses = trained
  assert losses[-1] < 0.05 * losses[0]
  tokens, aux = model.predict_batch_with_aux(p, batch)
  assert tokens.shape == batch["decoder_target_tokens"].shape
  # The memorised targets come back (EOS included, zeros after it).
  np.testing.assert_array_equal(tokens, batch["decoder_target_tokens"])
  # Greedy scores are the summed log-probs of the decoded tokens.
  scored = _batch_from_tokens(batch, np.asarray(tokens))
  np.testing.assert_allclose(aux["scores"], SCORE_BATCH(p, scored), rtol=1e-4, atol=1e-4)


def test_beam_search(trained, batch):
  model, p, _ = trained
  length = batch["decoder_target_tokens"].shape[1]
  greedy, g_aux = model.predict_batch_with_aux(p, batch)
  beam1, b_aux = model.predict_batch_with_aux(
      p, batch, num_decodes=1, method="beam_search", decoder_params={"alpha": 0.0})
  np.testing.assert_array_equal(beam1, greedy)
  np.testing.assert_allclose(b_aux["scores"], g_aux["scores"], rtol=1e-5)

  alpha = 0.6
  beams, aux = model.predict_batch_with_aux(
      p, batch, num_decodes=4, decoder_params={"alpha": alpha}, return_all_decodes=True)
  beams, scores = np.asarray(beams), np.asarray(aux["scores"])
  assert beams.shape == (4, 4, length) and scores.shape == (4, 4)
  assert (np.diff(scores, axis=1) >= 0).all(), "ascending, best last"
  assert (scores > decoding.NEG_INF / 2).all()
  flat = beams.reshape(16, length)
  rep = {k: np.repeat(v, 4, axis=0) for k, v in batch.items()}
  log_probs = SCORE_BATCH(p, _batch_from_tokens(rep, flat))
  expected = decoding.length_penalized_score(log_probs, flat, EOS, alpha, max_len=length)
  np.testing.assert_allclose(scores.ravel(), expected, rtol=1e-4, atol=1e-4)
  # The 4 beams of an example are distinct sequences.
  for b in range(4):
    assert len({tuple(s) for s in beams[b]}) == 4
  # The best beam is at least as good as greedy under the beam score.
  g = np.asarray(greedy)
  greedy_scores = decoding.length_penalized_score(
      SCORE_BATCH(p, _batch_from_tokens(batch, g)), g, EOS, alpha, max_len=length)
  assert (scores[:, -1] >= np.asarray(greedy_scores) - 1e-4).all()
  best = model.predict_batch(p, batch, num_decodes=4, decoder_params={"alpha": alpha})
  np.testing.assert_array_equal(best, beams[:, -1])


def test_temperature_sample(params, batch):
  """Sampling through predict_batch: T5X's temperature/topk/num_decodes, scores =
  the model's log-probs, top-k respected, reproducible per rng."""
  model = MODEL
  length = batch["decoder_target_tokens"].shape[1]
  n, topk = 6, 3
  kwargs = dict(
      method="temperature_sample",
      num_decodes=n,
      decoder_params={
          "temperature": 1.0,
          "topk": topk
      },
      return_all_decodes=True)
  samples, aux = model.predict_batch_with_aux(params, batch, rng=jax.random.PRNGKey(0), **kwargs)
  samples, scores = np.asarray(samples), np.asarray(aux["scores"])
  assert samples.shape == (4, n, length) and scores.shape == (4, n)
  assert (np.diff(scores, axis=1) >= 0).all(), "ascending, best last"
  # An untrained model: the samples of an example differ.
  assert all(len({tuple(s) for s in samples[b]}) > n // 2 for b in range(4))
  flat = samples.reshape(4 * n, length)
  rep = {k: np.repeat(v, n, axis=0) for k, v in batch.items()}
  scored = _batch_from_tokens(rep, flat)
  np.testing.assert_allclose(scores.ravel(), SCORE_BATCH(params, scored), rtol=1e-4, atol=1e-4)
  # Every sampled token (EOS included) is among the topk most likely given its
  # prefix: rank < topk under the teacher-forced logits of the sample itself.
  logits = np.asarray(jax.jit(model._compute_logits)(params, scored))
  target_logit = np.take_along_axis(logits, flat[..., None], -1)
  rank = (logits > target_logit).sum(-1)
  assert rank[flat > 0].max() < topk
  assert rank[flat > 0].max() > 0, "sampling, not greedy"
  # The same rng gives the same samples, another rng others.
  again = model.predict_batch(params, batch, rng=jax.random.PRNGKey(0), **kwargs)
  np.testing.assert_array_equal(again, samples)
  other = model.predict_batch(params, batch, rng=jax.random.PRNGKey(1), **kwargs)
  assert not np.array_equal(other, samples)
  # Temperature 0 is greedy decoding (no rng needed).
  greedy = model.predict_batch(params, batch)
  cold = model.predict_batch(
      params, batch, method="temperature_sample", decoder_params={"temperature": 0.0})
  np.testing.assert_array_equal(cold, greedy)


def test_prompt_with_targets(trained, batch):
  """Forced prefixes (T5X `prompt_with_targets`): the first two tokens of another
  example's target; the rest is decoded, and only it is scored."""
  model, p, _ = trained
  targets = batch["decoder_target_tokens"]
  prefix = np.zeros_like(targets)
  prefix[:, :2] = np.roll(targets, 1, axis=0)[:, :2]
  prompted = dict(batch, decoder_input_tokens=_shift_right(prefix))
  tokens, aux = model.predict_batch_with_aux(p, prompted, prompt_with_targets=True)
  tokens = np.asarray(tokens)
  np.testing.assert_array_equal(tokens[:, :2], prefix[:, :2])
  assert (tokens[:, 2:] > 0).any()
  token_scores = np.asarray(TOKEN_SCORES(p, _batch_from_tokens(batch, tokens)))
  np.testing.assert_allclose(aux["scores"], token_scores[:, 2:].sum(1), rtol=1e-4, atol=1e-4)
  # EOS in decoder_input_tokens is dropped from the prompt (T5X): the full
  # targets as a prompt leave the EOS position to be decoded.
  full, _ = model.predict_batch_with_aux(p, batch, prompt_with_targets=True)
  np.testing.assert_array_equal(full, targets)


def test_bad_arguments(params, batch):
  with pytest.raises(ValueError, match="label_smoothing"):
    model_lib.EncoderDecoderModel(network.Transformer(CFG), label_smoothing=1.0)
  for bad in ("tokens", 0.0, -1, True):
    with pytest.raises(ValueError, match="loss_normalizing_factor"):
      model_lib.EncoderDecoderModel(network.Transformer(CFG), loss_normalizing_factor=bad)
  model = model_lib.EncoderDecoderModel(network.Transformer(CFG))
  with pytest.raises(KeyError, match="decoder_input_tokens"):
    model.get_initial_variables(jax.random.PRNGKey(0), {"encoder_input_tokens": (1, 4)})
  bad_calls = [
      (dict(method="nucleus"), "unknown method 'nucleus'"),
      (dict(num_decodes=2, method="greedy"), "greedy decoding gives one"),
      (dict(num_decodes=0), "num_decodes must be >= 1"),
      (dict(decoder_params={"alpha": 0.6}), r"\['alpha'\] are not taken by"),
      (dict(num_decodes=4, decoder_params={"temperature": 0.5}),
       r"\['temperature'\] are not taken by method 'beam_search'"),
      (dict(method="temperature_sample"), "pass rng="),
      (dict(prompt_with_targets=True, max_decode_length=3), "differs"),
  ]
  for kwargs, message in bad_calls:
    with pytest.raises(ValueError, match=message):
      model.predict_batch(params, batch, **kwargs)
  with pytest.raises(ValueError, match="give max_decode_length"):
    model.predict_batch(params, {"encoder_input_tokens": batch["encoder_input_tokens"]})
  with pytest.raises(ValueError, match="packed"):
    model.predict_batch(params, dict(batch, encoder_segment_ids=batch["encoder_input_tokens"]))


def test_loss_reads_decoder_loss_weights(params, batch):
  """`decoder_loss_weights` that differ from `targets > 0` (a zero on a real target token, a
  weight of 3) are the ones the loss, its normaliser and the metrics use."""
  weights = batch["decoder_loss_weights"].copy()
  weights[0, 0] = 0.0
  weights[1, 2] = 3.0
  reweighted = dict(batch, decoder_loss_weights=weights)
  loss, metrics = EVAL_FN(params, reweighted)
  total = sum(_numpy_losses(_logits(params, batch), batch["decoder_target_tokens"], 0.0, 1e-4))
  np.testing.assert_allclose(metrics["num_tokens"], weights.sum(), rtol=1e-6)
  np.testing.assert_allclose(metrics["loss"], (total * weights).sum(), rtol=1e-5)
  np.testing.assert_allclose(loss, (total * weights).sum() / weights.sum(), rtol=1e-5)


# why: one alpha (each compiles both searches); any alpha > 0 tells ((5+len)/6)**alpha from len**alpha
@pytest.mark.parametrize("alpha", [0.6])
def test_beam_search_equals_t5x(trained, params, batch, monkeypatch, request, alpha):
  """Our beam search gives the real T5X `decoding.beam_search`'s beams and scores (ascending, best
  last) through the same model, weights, prompt and alpha: the trained tiny model and the random
  one (whose beams end at varied lengths, so the brevity penalty decides)."""
  t5x_decoding = pytest.importorskip("t5x.decoding")
  model, fitted, _ = trained
  # why: ours ranks blocks of 16 of the 160 tokens first, as it does mT5's 250,112 in blocks of
  # 128 (the flat top_k of a vocabulary without such blocks is T5X's own code).
  monkeypatch.setattr(decoding, "EXTENSION_BLOCK_WIDTH", 16)
  jax.clear_caches()  # why: other tests traced the model's beam search with the default width
  ours = {
      name:
          model.predict_batch_with_aux(
              p, batch, num_decodes=4, decoder_params={"alpha": alpha}, return_all_decodes=True)
      for name, p in (("trained", fitted), ("random", params))
  }

  calls = []

  def t5x_beam_search(inputs, cache, tokens_to_logits, eos_id, num_decodes, alpha):
    calls.append(alpha)

    def t5x_tokens_to_logits(
        state):  # why: T5X's cur_token is [batch * beams, 1], ours [batch * beams]
      return tokens_to_logits(state.replace(cur_token=state.cur_token[:, 0]))

    return t5x_decoding.beam_search(
        inputs, cache, t5x_tokens_to_logits, eos_id, num_decodes=num_decodes, alpha=alpha)

  monkeypatch.setattr(decoding, "beam_search", t5x_beam_search)
  jax.clear_caches()  # why: the model's jitted decoding traced ours above
  # why: and T5X's below, for MODEL's later callers
  request.addfinalizer(jax.clear_caches)
  lengths = set()
  for name, p in (("trained", fitted), ("random", params)):
    beams, aux = model.predict_batch_with_aux(
        p, batch, num_decodes=4, decoder_params={"alpha": alpha}, return_all_decodes=True)
    np.testing.assert_array_equal(ours[name][0], beams, err_msg=name)
    np.testing.assert_allclose(ours[name][1]["scores"], aux["scores"], rtol=1e-5, atol=1e-5)
    lengths |= set((np.asarray(beams) > 0).sum(-1).ravel().tolist())
  assert calls and set(calls) == {alpha}, "the model decoded with T5X's beam search"
  assert len(lengths) > 2, "beams of several lengths"
