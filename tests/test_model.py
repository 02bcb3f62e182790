"""Tests of EncoderDecoderModel (loss, packing, decoding, scoring).

Real MCWQ questions -> RIR targets from ../shared, tokenised with a small
SentencePiece model trained here on a few hundred MCWQ lines.
"""

import io

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest
import sentencepiece as spm

from mcwq_t5x import decoding
from mcwq_t5x import model as model_lib
from mcwq_t5x import network


VOCAB = 160
CFG = network.T5Config(vocab_size=VOCAB, emb_dim=48, num_heads=4,
                       num_encoder_layers=2, num_decoder_layers=2, head_dim=12,
                       mlp_dim=96, dropout_rate=0.0)


def _pad(rows, length):
  out = np.zeros((len(rows), length), np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out


def _shift_right(targets):
  return np.concatenate([np.zeros_like(targets[:, :1]), targets[:, :-1]], 1)


def _batch(inputs, targets, in_len, tgt_len):
  tgt = _pad(targets, tgt_len)
  return dict(encoder_input_tokens=_pad(inputs, in_len),
              decoder_input_tokens=_shift_right(tgt),
              decoder_target_tokens=tgt,
              decoder_loss_weights=(tgt > 0).astype(np.float32))


@pytest.fixture(scope="module")
def examples(mcwq_dir):
  """Token ids (with EOS) of 4 (question, RIR) pairs of mcd1 dev (en)."""
  base = mcwq_dir / "translations" / "mcd1"
  questions = (base / "dev.en.txt").read_text().splitlines()[:300]
  rirs = (base / "dev.en.sparql").read_text().splitlines()[:300]
  proto = io.BytesIO()
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(questions + rirs), model_writer=proto,
      vocab_size=VOCAB, pad_id=0, eos_id=1, unk_id=2, bos_id=-1,
      character_coverage=1.0, minloglevel=2)
  sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
  # Short examples, so that two fit in one packed row.
  order = sorted(range(300), key=lambda i: len(sp.encode(rirs[i])))[:4]
  inputs = [sp.encode(questions[i]) + [1] for i in order]
  targets = [sp.encode(rirs[i]) + [1] for i in order]
  assert sp.decode(targets[0][:-1]) == rirs[order[0]]
  return inputs, targets


@pytest.fixture(scope="module")
def batch(examples):
  inputs, targets = examples
  return _batch(inputs, targets, max(map(len, inputs)) + 3,
                max(map(len, targets)) + 2)


@pytest.fixture(scope="module")
def params():
  model = model_lib.EncoderDecoderModel(network.Transformer(CFG))
  shapes = {"encoder_input_tokens": (2, 8), "decoder_input_tokens": (2, 8)}
  variables = jax.jit(lambda r: model.get_initial_variables(r, shapes))(
      jax.random.PRNGKey(0))
  assert isinstance(variables["params"]["encoder"]["encoder_norm"]["scale"],
                    nn.LogicallyPartitioned)
  return nn.unbox(variables["params"])


def _numpy_losses(logits, targets, weights, label_smoothing, z_loss):
  logits = np.asarray(logits, np.float64)
  v = logits.shape[-1]
  log_z = np.log(np.exp(logits).sum(-1))
  log_p = logits - log_z[..., None]
  conf, low = 1 - label_smoothing, label_smoothing / (v - 1)
  soft = np.full(logits.shape, low)
  np.put_along_axis(soft, targets[..., None], conf, axis=-1)
  const = -(conf * np.log(conf) + (v - 1) * low * np.log(low + 1e-20))
  ce = (-(soft * log_p).sum(-1) - const) * weights
  z = z_loss * log_z ** 2 * weights
  return ce.sum(), z.sum()


@pytest.mark.parametrize("label_smoothing,factor", [(0.0, None), (0.1, 233472.0)])
def test_loss_matches_t5x_formula(params, batch, label_smoothing, factor):
  model = model_lib.EncoderDecoderModel(
      network.Transformer(CFG), label_smoothing=label_smoothing, z_loss=1e-3,
      loss_normalizing_factor=factor)
  loss, metrics = jax.jit(model.eval_fn)(params, batch)
  logits = jax.jit(network.Transformer(CFG).apply,
                   static_argnames="enable_dropout")(
      {"params": params}, batch["encoder_input_tokens"],
      batch["decoder_input_tokens"], batch["decoder_target_tokens"],
      enable_dropout=False)
  weights = batch["decoder_loss_weights"]
  ce, z = _numpy_losses(logits, batch["decoder_target_tokens"], weights,
                        label_smoothing, 1e-3)
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


def test_metric_sums_add_over_microbatches(params, batch):
  model = model_lib.EncoderDecoderModel(network.Transformer(CFG))
  eval_fn = jax.jit(model.eval_fn)
  _, full = eval_fn(params, batch)
  halves = [eval_fn(params, {k: v[s] for k, v in batch.items()})[1]
            for s in (slice(0, 2), slice(2, 4))]
  for key in full:
    np.testing.assert_allclose(halves[0][key] + halves[1][key], full[key],
                               rtol=1e-5, err_msg=key)


def _pack(examples, pairs, in_len, tgt_len):
  """Packs examples as seqio's EncDecFeatureConverter(pack=True) does."""
  inputs, targets = examples
  rows = {k: [] for k in ("encoder_input_tokens", "decoder_target_tokens",
                          "encoder_segment_ids", "decoder_segment_ids",
                          "encoder_positions", "decoder_positions",
                          "decoder_input_tokens")}
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
    for key, row in zip(("encoder_input_tokens", "decoder_target_tokens",
                         "encoder_segment_ids", "decoder_segment_ids",
                         "encoder_positions", "decoder_positions",
                         "decoder_input_tokens"),
                        (enc, tgt, eseg, dseg, epos, dpos, dec)):
      rows[key].append(row)
  out = {k: _pad(v, in_len if k.startswith("encoder") else tgt_len)
         for k, v in rows.items()}
  out["decoder_loss_weights"] = (out["decoder_target_tokens"] > 0).astype(
      np.float32)
  return out


def test_packed_and_unpacked_give_the_same_per_example_loss(params, batch,
                                                            examples):
  inputs, targets = examples
  pairs = [(0, 1), (2, 3)]
  in_len = max(len(inputs[a]) + len(inputs[b]) for a, b in pairs) + 2
  tgt_len = max(len(targets[a]) + len(targets[b]) for a, b in pairs) + 2
  packed = _pack(examples, pairs, in_len, tgt_len)
  model = model_lib.EncoderDecoderModel(network.Transformer(CFG))
  unpacked_scores = np.asarray(jax.jit(model.score_batch)(params, batch))
  token_scores = np.asarray(jax.jit(model.token_scores)(params, packed))
  for row, pair in enumerate(pairs):
    for seg, i in enumerate(pair, start=1):
      in_segment = packed["decoder_segment_ids"][row] == seg
      np.testing.assert_allclose(token_scores[row][in_segment].sum(),
                                 unpacked_scores[i], rtol=1e-5, atol=1e-4)
  _, m_packed = jax.jit(model.eval_fn)(params, packed)
  _, m_unpacked = jax.jit(model.eval_fn)(params, batch)
  for key in ("loss", "cross_ent_loss", "z_loss"):
    np.testing.assert_allclose(m_packed[key], m_unpacked[key], rtol=1e-5)
  for key in ("num_tokens", "num_examples", "accuracy_numerator"):
    assert m_packed[key] == m_unpacked[key], key
  # Without segment ids the packed rows would attend across examples.
  unsegmented = {k: v for k, v in packed.items()
                 if "segment" not in k and "positions" not in k}
  wrong = np.asarray(jax.jit(model.token_scores)(params, unsegmented))
  assert np.abs(wrong - token_scores).max() > 1e-3


@pytest.fixture(scope="module")
def trained(params, batch):
  """The tiny model fitted to the 4 examples (Adam, 150 steps)."""
  model = model_lib.EncoderDecoderModel(network.Transformer(CFG))
  opt = optax.adam(optax.cosine_decay_schedule(1e-2, 150, alpha=0.05))

  @jax.jit
  def step(p, state, rng):
    (loss, _), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(
        p, batch, rng)
    updates, state = opt.update(grads, state, p)
    return optax.apply_updates(p, updates), state, loss

  p, state = params, opt.init(params)
  losses = []
  for i in range(150):
    p, state, loss = step(p, state, jax.random.PRNGKey(i))
    losses.append(float(loss))
  return model, p, losses


def test_training_reduces_loss_and_greedy_reproduces_targets(trained, batch):
  model, p, losses = trained
  assert losses[-1] < 0.2 * losses[0]
  tokens, aux = model.predict_batch_with_aux(p, batch)
  assert tokens.shape == batch["decoder_target_tokens"].shape
  # The memorised targets come back (EOS included, zeros after it).
  matches = (np.asarray(tokens) == batch["decoder_target_tokens"]).all(1)
  assert matches.sum() >= 3
  # Greedy scores are the summed log-probs of the decoded tokens.
  decoded = np.asarray(tokens)
  scored = _batch_from_tokens(batch, decoded)
  np.testing.assert_allclose(aux["scores"], jax.jit(model.score_batch)(p, scored),
                             rtol=1e-4, atol=1e-4)


def _batch_from_tokens(batch, tokens):
  return dict(encoder_input_tokens=batch["encoder_input_tokens"],
              decoder_input_tokens=_shift_right(tokens),
              decoder_target_tokens=tokens,
              decoder_loss_weights=(tokens > 0).astype(np.float32))


def test_beam_search(trained, batch):
  model, p, _ = trained
  length = batch["decoder_target_tokens"].shape[1]
  greedy, g_aux = model.predict_batch_with_aux(p, batch)
  beam1, b_aux = model.predict_batch_with_aux(p, batch, num_decodes=1,
                                              method="beam", alpha=0.0)
  np.testing.assert_array_equal(beam1, greedy)
  np.testing.assert_allclose(b_aux["scores"], g_aux["scores"], rtol=1e-5)

  alpha = 0.6
  beams, aux = model.predict_batch_with_aux(p, batch, num_decodes=4,
                                            alpha=alpha,
                                            return_all_decodes=True)
  beams, scores = np.asarray(beams), np.asarray(aux["scores"])
  assert beams.shape == (4, 4, length) and scores.shape == (4, 4)
  assert (np.diff(scores, axis=1) >= 0).all(), "ascending, best last"
  assert (scores > decoding.NEG_INF / 2).all()
  flat = beams.reshape(16, length)
  rep = {k: np.repeat(v, 4, axis=0) for k, v in batch.items()}
  log_probs = jax.jit(model.score_batch)(p, _batch_from_tokens(rep, flat))
  expected = decoding.length_penalized_score(log_probs, flat, 1, alpha,
                                             max_len=length)
  np.testing.assert_allclose(scores.ravel(), expected, rtol=1e-4, atol=1e-4)
  # The 4 beams of an example are distinct sequences.
  for b in range(4):
    assert len({tuple(s) for s in beams[b]}) == 4
  # The best beam is at least as good as greedy under the beam score.
  g = np.asarray(greedy)
  greedy_scores = decoding.length_penalized_score(
      jax.jit(model.score_batch)(p, _batch_from_tokens(batch, g)), g, 1, alpha,
      max_len=length)
  assert (scores[:, -1] >= np.asarray(greedy_scores) - 1e-4).all()
  assert np.asarray(model.predict_batch(p, batch, num_decodes=4)).shape == (
      4, length)


def test_bad_arguments():
  with pytest.raises(ValueError, match="label_smoothing"):
    model_lib.EncoderDecoderModel(network.Transformer(CFG),
                                  label_smoothing=1.0)
  with pytest.raises(ValueError, match="loss_normalizing_factor"):
    model_lib.EncoderDecoderModel(network.Transformer(CFG),
                                  loss_normalizing_factor="tokens")
  model = model_lib.EncoderDecoderModel(network.Transformer(CFG))
  with pytest.raises(KeyError, match="decoder_input_tokens"):
    model.get_initial_variables(jax.random.PRNGKey(0),
                                {"encoder_input_tokens": (1, 4)})



