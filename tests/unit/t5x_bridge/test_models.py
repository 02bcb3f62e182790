"""The real T5X's model on our engine (`mcwq_t5x.t5x_bridge.models.EncoderDecoderModel`) against
T5X's own (`t5x.models.EncoderDecoderModel` over `t5x.examples.t5.network.Transformer`), from the
same T5X-initialised parameters: the same variables tree (`params` and `params_axes`), the same
loss, metrics (every one T5X reports, the timing ones aside) and gradients within float order, with
label smoothing and z-loss on and off, in float32 and bfloat16, for the untied (mT5) and tied
(T5 1.0) output layers, with T5X's loss normalising factors, on mT5's 250,112-piece vocabulary and
on a 2x2 mesh of T5X's partitioner; the same scores (`score_batch`) and greedy and beam-4 decodes
through T5X's `decoding`; the remat policies give the same numbers; gin builds the model of the
experiment files.
"""
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip(
    "t5x.models", reason="the real T5X is not installed (bash scripts/install_t5x.sh)")
# pylint: disable=g-import-not-at-top,wrong-import-position
import seqio
from t5x import adafactor as t5x_adafactor
from t5x import decoding as t5x_decoding
from t5x import models as t5x_models
from t5x import partitioning as t5x_partitioning
from t5x import train_state as t5x_train_state
from t5x.examples.t5 import network as t5x_network

from mcwq_t5x.engine import network
from mcwq_t5x.t5x_bridge import models as bridge

from tiny_engine import synthetic_batch

MT5_VOCAB = 250112
CHUNK = 24  # why: 8 rows x 3 positions a chunk; the 10 target positions pad to 12


def t5x_config(vocab_size=64, dtype="float32", **fields):
  """T5X's `T5Config` of a tiny mT5-layout network: 1+1 layers of width 16, 2 heads of 8, MLP 32,
  gated GELU, untied output layer, no dropout."""
  base = dict(
      vocab_size=vocab_size,
      dtype=dtype,
      emb_dim=16,
      num_heads=2,
      num_encoder_layers=1,
      num_decoder_layers=1,
      head_dim=8,
      mlp_dim=32,
      mlp_activations=("gelu", "linear"),
      dropout_rate=0.0)
  return t5x_network.T5Config(**{**base, **fields})


def both_models(config, decode_fn=t5x_decoding.beam_search, remat_policy=None, **loss):
  """(T5X's own model, ours) of T5X's `config` (a pass-through vocabulary, EOS 1), with T5X's
  loss arguments `loss`."""
  vocabulary = seqio.PassThroughVocabulary(config.vocab_size, eos_id=1)
  theirs = t5x_models.EncoderDecoderModel(
      t5x_network.Transformer(config), vocabulary, vocabulary, None, decode_fn=decode_fn, **loss)
  ours = bridge.EncoderDecoderModel(
      bridge.transformer(config),
      vocabulary,
      vocabulary,
      None,
      decode_fn=decode_fn,
      remat_policy=remat_policy,
      loss_chunk_tokens=CHUNK,
      **loss)
  return theirs, ours


def t5x_variables(model, batch):
  """T5X's initial variables of `model` for `batch`'s shapes (jitted, seed 0)."""
  shapes = {k: v.shape for k, v in batch.items()}
  return jax.jit(lambda rng: model.get_initial_variables(rng, shapes))(jax.random.PRNGKey(0))


def with_correct_last_targets(model, params, batch):
  """`batch` with each row's last weighted target replaced by the argmax of T5X's logits there
  (where that is not padding): an accuracy strictly between 0 and 1, since the teacher-forced
  logits of the weighted positions do not read a row's last target."""
  argmax = np.asarray(jax.jit(model._compute_logits)(params, batch).argmax(-1))  # pylint: disable=protected-access
  targets, inputs = np.array(batch["decoder_target_tokens"]), np.array(
      batch["decoder_input_tokens"])
  for row, weights in enumerate(np.asarray(batch["decoder_loss_weights"])):
    last = np.flatnonzero(weights)[-1]
    if argmax[row, last] > 0:
      targets[row, last] = argmax[row, last]
      if last + 1 < targets.shape[1]:
        inputs[row, last + 1] = argmax[row, last]
  return dict(batch, decoder_target_tokens=targets, decoder_input_tokens=inputs)


def unpadded(batch):
  """`batch` without padding in its targets and without `decoder_loss_weights`."""
  targets = np.array(batch["decoder_target_tokens"])
  targets = np.where(targets == 0, 2 + np.arange(targets.size).reshape(targets.shape) % 60, targets)
  inputs = np.concatenate([np.zeros_like(targets[:, :1]), targets[:, :-1]], 1)
  return {
      "encoder_input_tokens": batch["encoder_input_tokens"],
      "decoder_input_tokens": inputs,
      "decoder_target_tokens": targets
  }


def loss_and_grad(model, params, batch):
  """((loss, metrics), gradients) of `model.loss_fn`, jitted."""
  return jax.jit(jax.value_and_grad(lambda p, b: model.loss_fn(p, b, None), has_aux=True))(params,
                                                                                           batch)


def metric_values(metrics):
  """{name: {field: value}} of T5X's metrics (clu's `total`, `count`...), the timing ones
  (wall-clock) left out."""
  return {
      name: {
          field: np.asarray(value, np.float64) for field, value in vars(metric).items()
      } for name, metric in metrics.items() if not name.startswith("timing/")
  }


def assert_same_numbers(theirs, ours, params, batch, rtol=1e-6, grad_rtol=1e-5):
  """Ours' loss, metrics and gradients are T5X's, `rtol` and `grad_rtol` (of each gradient's
  norm) apart; returns T5X's metric values."""
  return assert_close(
      loss_and_grad(theirs, params, batch), loss_and_grad(ours, params, batch), rtol, grad_rtol)


def assert_close(t5x_out, our_out, rtol, grad_rtol):
  """((loss, metrics), gradients) of ours and T5X's are `rtol` and `grad_rtol` (of each gradient's
  norm) apart; returns T5X's metric values."""
  (t_loss, t_metrics), t_grads = t5x_out
  (o_loss, o_metrics), o_grads = our_out
  np.testing.assert_allclose(o_loss, t_loss, rtol=rtol)
  t_values, o_values = metric_values(t_metrics), metric_values(o_metrics)
  assert sorted(o_values) == sorted(t_values)
  for name, values in t_values.items():
    assert sorted(o_values[name]) == sorted(values), name
    for field, t in values.items():
      np.testing.assert_allclose(o_values[name][field], t, rtol=rtol, atol=1e-12, err_msg=name)
  flat = jax.tree_util.tree_flatten_with_path(t_grads)[0]
  assert [p for p, _ in flat] == [p for p, _ in jax.tree_util.tree_flatten_with_path(o_grads)[0]]
  for (path, t), o in zip(flat, jax.tree_util.tree_leaves(o_grads)):
    t, o = np.asarray(t, np.float64), np.asarray(o, np.float64)
    assert np.linalg.norm(t) > 0, path
    error = np.linalg.norm(o - t) / np.linalg.norm(t)
    assert error <= grad_rtol, (jax.tree_util.keystr(path), error)
  return t_values


def test_same_variables_as_t5x_params_and_logical_axes():
  """T5X's `get_initial_variables` of both models: the same tree of `params` (names, shapes,
  float32, T5X's initial values) and `params_axes` (T5X's `AxisMetadata`, which its partitioner
  and Adafactor read)."""
  theirs, ours = both_models(t5x_config())
  batch = synthetic_batch(3)
  t_vars, o_vars = t5x_variables(theirs, batch), t5x_variables(ours, batch)
  assert sorted(o_vars) == sorted(t_vars) == ["params", "params_axes"]
  assert jax.tree_util.tree_structure(o_vars) == jax.tree_util.tree_structure(t_vars)
  assert o_vars["params_axes"] == t_vars["params_axes"]
  assert o_vars["params_axes"]["decoder"]["logits_dense"]["kernel_axes"].names == ("embed", "vocab")
  for t, o in zip(
      jax.tree_util.tree_leaves(t_vars["params"]), jax.tree_util.tree_leaves(o_vars["params"])):
    assert o.shape == t.shape and o.dtype == t.dtype == jnp.float32
  # The same initialisers: the query kernel's extra 1/sqrt(head_dim), the N(0, 1) embedding.
  for name in ("token_embedder",):
    np.testing.assert_allclose(
        np.std(o_vars["params"][name]["embedding"]),
        np.std(t_vars["params"][name]["embedding"]),
        rtol=0.1)


@pytest.mark.parametrize("label_smoothing,z_loss,dtype,fields", [
    (0.0, 0.0, "float32", {}),
    (0.1, 1e-4, "float32", {}),
    (0.1, 1e-3, "float32", dict(mlp_activations=("relu",), logits_via_embedding=True)),
    (0.0, 1e-4, "bfloat16", {}),
    (0.1, 0.0, "bfloat16", dict(logits_via_embedding=True)),
])
def test_same_loss_metrics_and_gradients_as_t5x(label_smoothing, z_loss, dtype, fields):
  theirs, ours = both_models(
      t5x_config(dtype=dtype, **fields), label_smoothing=label_smoothing, z_loss=z_loss)
  batch = synthetic_batch(3)
  params = t5x_variables(theirs, batch)["params"]
  batch = with_correct_last_targets(theirs, params, batch)
  # bfloat16: the two networks round their activations alike; T5X's embedding gradient is a
  # bfloat16 one-hot product, ours a float32 scatter-add.
  values = assert_same_numbers(
      theirs,
      ours,
      params,
      batch,
      rtol=1e-6 if dtype == "float32" else 1e-4,
      grad_rtol=1e-5 if dtype == "float32" else 2e-2)
  assert (values["z_loss"]["total"] > 0) == bool(z_loss)
  assert 0 < values["accuracy"]["total"] < values["accuracy"]["count"]  # correct of weighted


@pytest.mark.parametrize("factor,weights", [
    ("NUM_REAL_TARGET_TOKENS", True),
    ("AVERAGE_PER_SEQUENCE", True),
    (233472.0, True),
    (None, False),
])
def test_same_numbers_with_t5xs_loss_normalizing_factors(factor, weights):
  """T5X's factors; without `decoder_loss_weights` T5X's loss sums every position (unpadded
  rows here: at a padded position T5X's attention row of masked keys is uniform, with a gradient
  through its -1e10 bias, ours has weight 0 and no gradient; T5X's feature converters always
  give the weights)."""
  theirs, ours = both_models(
      t5x_config(), label_smoothing=0.1, z_loss=1e-4, loss_normalizing_factor=factor)
  batch = synthetic_batch(4) if weights else unpadded(synthetic_batch(4))
  params = t5x_variables(theirs, batch)["params"]
  assert_same_numbers(theirs, ours, params, batch)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_same_numbers_and_scores_on_mt5s_vocabulary(dtype):
  """250,112 pieces (T5X's logits: 2 x 8 x 250,112 float32), label smoothing and z-loss; T5X's
  `score_batch` (float32)."""
  theirs, ours = both_models(t5x_config(MT5_VOCAB, dtype), label_smoothing=0.1, z_loss=1e-4)
  rng = np.random.default_rng(0)
  targets = rng.integers(2, MT5_VOCAB, size=(2, 8)).astype(np.int32)
  targets[1, 6:] = 0
  batch = {
      "encoder_input_tokens": rng.integers(2, MT5_VOCAB, size=(2, 6)).astype(np.int32),
      "decoder_input_tokens": np.concatenate([np.zeros((2, 1), np.int32), targets[:, :-1]], 1),
      "decoder_target_tokens": targets,
      "decoder_loss_weights": (targets > 0).astype(np.int32),
  }
  params = t5x_variables(theirs, batch)["params"]
  assert_same_numbers(
      theirs,
      ours,
      params,
      batch,
      rtol=1e-6 if dtype == "float32" else 1e-4,
      grad_rtol=1e-5 if dtype == "float32" else 2e-2)
  if dtype != "float32":
    return
  t_scores = jax.jit(theirs.score_batch)(params, batch)
  o_scores, intermediates = jax.jit(functools.partial(ours.score_batch,
                                                      return_intermediates=True))(params, batch)
  np.testing.assert_allclose(o_scores, t_scores, rtol=1e-6)
  np.testing.assert_allclose(jax.jit(ours.score_batch)(params, batch), t_scores, rtol=1e-6)
  np.testing.assert_allclose(
      np.sum(intermediates["decoder"]["token_scores"][0], -1), o_scores, rtol=1e-6)
  np.testing.assert_array_equal(intermediates["decoder"]["target_tokens"][0], targets)


class _Mesh2x2(t5x_partitioning.PjitPartitioner):
  """T5X's partitioner (its standard logical axis rules) on 2 x 2 of the 8 test devices."""

  @property
  def mesh(self):
    return jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))


@pytest.mark.parametrize("remat_policy", ["none", "full"])
def test_same_numbers_on_a_2x2_mesh(remat_policy):
  """T5X's partitioner and its standard logical axis rules over our `params_axes` (batch over
  `data`; vocabulary, heads and MLP over `model`): ours gives T5X's own single-device numbers,
  with no all-gather of the output layer's vocabulary axis."""
  vocab = 96  # why: no other dimension of the network is 96, so the HLO check below reads it
  theirs, ours = both_models(
      t5x_config(vocab), remat_policy=remat_policy, label_smoothing=0.1, z_loss=1e-4)
  batch = synthetic_batch(5)
  params = t5x_variables(theirs, batch)["params"]
  partitioner = _Mesh2x2(num_partitions=2)
  state = t5x_train_state.FlaxOptimTrainState.create(t5x_adafactor.Adafactor(),
                                                     t5x_variables(ours, batch))
  mesh_axes = partitioner.get_mesh_axes(state).params
  assert mesh_axes["decoder"]["logits_dense"]["kernel"] == jax.sharding.PartitionSpec(None, "model")
  data = jax.sharding.PartitionSpec("data")
  step = partitioner.partition(
      jax.value_and_grad(lambda p, b: ours.loss_fn(p, b, None), has_aux=True),
      in_axis_resources=(mesh_axes, data),
      out_axis_resources=((None, None), mesh_axes))  # why: the gradients stay sharded, as T5X's
  named = lambda spec: jax.sharding.NamedSharding(partitioner.mesh, spec)
  sharded = (jax.device_put(params,
                            jax.tree_util.tree_map(named,
                                                   mesh_axes)), jax.device_put(batch, named(data)))
  compiled = step.lower(*sharded).compile()
  assert_close(loss_and_grad(theirs, params, batch), compiled(*sharded), rtol=1e-6, grad_rtol=1e-5)
  hlo = compiled.as_text()
  if remat_policy == "full":  # why: the mesh's step really runs the conditional form
    assert hlo.count(" conditional(") == 2
  gathered = re.findall(r"= \w+\[([0-9,]*)\][^\n]* all-gather\(", hlo)
  assert not [s for s in gathered if s.split(",")[-1] == str(vocab)], gathered


@pytest.mark.parametrize("remat_policy", ["minimal"])
def test_remat_policies_give_the_same_numbers(remat_policy):
  theirs, ours = both_models(t5x_config(), remat_policy=remat_policy, z_loss=1e-4)
  assert ours.remat_policy == remat_policy
  batch = synthetic_batch(6)
  assert_same_numbers(theirs, ours, t5x_variables(theirs, batch)["params"], batch)


@pytest.mark.parametrize("num_decodes", [1, 4])
def test_same_greedy_and_beam_decodes_as_t5x(num_decodes):
  """T5X's `predict_batch_with_aux` through `decoding.beam_search` (greedy: 1 beam, as the gin
  files decode; and 4 beams) reads and writes our network's cache as T5X's network's: the same
  tokens and scores of every beam, from T5X's initial parameters (a trained checkpoint:
  e2e/test_t5x_engine.py)."""
  theirs, ours = both_models(t5x_config())
  batch = synthetic_batch(7)
  params = t5x_variables(theirs, batch)["params"]

  def predict(model):
    return jax.jit(
        functools.partial(
            model.predict_batch_with_aux, num_decodes=num_decodes, return_all_decodes=True))(params,
                                                                                             batch)

  (t_tokens, t_aux), (o_tokens, o_aux) = predict(theirs), predict(ours)
  t_tokens, o_tokens = np.asarray(t_tokens), np.asarray(o_tokens)
  assert t_tokens.shape == (8, num_decodes, 10)
  assert len({tuple(r) for r in t_tokens[:, -1]}) > 1  # rows decode differently
  np.testing.assert_array_equal(o_tokens, t_tokens)
  np.testing.assert_allclose(o_aux["scores"], t_aux["scores"], rtol=1e-5, atol=1e-5)


def test_model_of_t5xs_config_and_errors():
  config = t5x_config(dtype="bfloat16", float32_attention_logits=True)
  ours = bridge.transformer(config)
  assert isinstance(ours, network.Transformer)
  assert ours.config.dtype == jnp.bfloat16 and ours.config.float32_attention_logits
  assert ours.config.remat_policy == "none"
  # T5X's default float32_attention_logits (False), not ours (True).
  assert not bridge.network_config(t5x_network.T5Config(vocab_size=8)).float32_attention_logits
  assert bridge.transformer(ours.config) is not ours and bridge.transformer(
      ours.config).config == ours.config
  with pytest.raises(TypeError, match="t5x_own_model.gin"):
    bridge.EncoderDecoderModel(t5x_network.Transformer(config), None, None, None)
  with pytest.raises(ValueError, match="remat_policy"):
    bridge.EncoderDecoderModel(ours, None, None, None, remat_policy="some")
  with pytest.raises(ValueError, match="label_smoothing"):
    bridge.EncoderDecoderModel(ours, None, None, None, label_smoothing=1.0)
