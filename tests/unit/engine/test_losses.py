"""The fused output layer + loss (`engine.losses`) against the logits it never builds.

The reference is T5X's computation on the full logits (`model.compute_weighted_cross_entropy`,
`jnp.argmax`, `jax.nn.log_softmax`), jitted as the fused one is: loss, z-loss and accuracy agree
within 1e-6 relative, gradients within 1e-5 (relative to each parameter's norm), for the untied
(mT5) and tied (T5 1.0) output layers, with label smoothing and z-loss on and off, in float32 and
bfloat16, on mT5's 250,112-piece vocabulary and on a 2x2 mesh; the compiled step holds no buffer of
batch x length x vocab elements.
"""
import dataclasses
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mcwq_t5x.engine import losses
from mcwq_t5x.engine import model as model_lib
from mcwq_t5x.engine import network
from mcwq_t5x.engine import partitioning
from tiny_engine import config
from tiny_engine import synthetic_batch

MT5_VOCAB = 250112
CHUNK = 24  # why: 8 rows x 3 positions a chunk; the 10 target positions pad to 12


def _model(cfg, label_smoothing=0.0, z_loss=0.0, chunk=CHUNK):
  return model_lib.EncoderDecoderModel(
      network.Transformer(cfg),
      label_smoothing=label_smoothing,
      z_loss=z_loss,
      loss_chunk_tokens=chunk)


def _params(model, batch):
  shapes = {k: v.shape for k, v in batch.items()}
  return nn.unbox(
      jax.jit(lambda r: model.get_initial_variables(r, shapes))(jax.random.PRNGKey(0))["params"])


def _reference_loss_fn(model, params, batch, dropout_rng=None):
  """`model.loss_fn` as T5X computes it: on the float32 logits [batch, len, vocab]."""
  logits = model._compute_logits(params, batch, dropout_rng)  # pylint: disable=protected-access
  targets = batch["decoder_target_tokens"]
  total, z_term, ce = model_lib.compute_weighted_cross_entropy(logits, targets, None,
                                                               model.label_smoothing, model.z_loss)
  weights = batch["decoder_loss_weights"].astype(jnp.float32)
  correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
  metrics = {
      "loss": jnp.sum(total * weights),
      "cross_ent_loss": jnp.sum(ce * weights),
      "z_loss": jnp.sum(z_term * weights),
      "accuracy_numerator": jnp.sum(correct * weights),
  }
  return jnp.sum(total * weights) / model.loss_normalizer(batch), metrics


def _value_and_grad(loss_fn):
  return jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, b, None), has_aux=True))


def _assert_same(model, params, batch, grad_rtol=1e-5):
  """The fused `model.loss_fn` and the reference agree: loss and metrics 1e-6, gradients."""
  (loss, metrics), grads = _value_and_grad(model.loss_fn)(params, batch)
  (ref_loss,
   ref_metrics), ref_grads = _value_and_grad(lambda p, b, _: _reference_loss_fn(model, p, b))(
       params, batch)
  np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
  for name, value in ref_metrics.items():
    np.testing.assert_allclose(metrics[name], value, rtol=1e-6, atol=1e-12, err_msg=name)
  flat = jax.tree_util.tree_flatten_with_path(grads)[0]
  for (path, g), r in zip(flat, jax.tree_util.tree_leaves(ref_grads)):
    g, r = np.asarray(g, np.float64), np.asarray(r, np.float64)
    assert np.linalg.norm(r) > 0, path
    error = np.linalg.norm(g - r) / np.linalg.norm(r)
    assert error <= grad_rtol, (jax.tree_util.keystr(path), error)
  return metrics


@pytest.mark.parametrize("label_smoothing,z_loss,dtype,tied", [
    (0.0, 0.0, "float32", False),
    (0.1, 0.0, "float32", False),
    (0.0, 1e-4, "float32", False),
    (0.1, 1e-3, "float32", True),
    (0.1, 1e-4, "bfloat16", False),
    (0.0, 0.0, "bfloat16", True),
])
def test_fused_loss_equals_the_logits_loss(label_smoothing, z_loss, dtype, tied):
  cfg = config(dtype=dtype, logits_via_embedding=tied)
  model = _model(cfg, label_smoothing, z_loss)
  batch = synthetic_batch(3)
  metrics = _assert_same(model, _params(model, batch), batch)
  assert metrics["z_loss"] > 0 if z_loss else metrics["z_loss"] == 0


def test_fused_loss_on_mt5s_vocabulary():
  """250,112 pieces, 2 rows of 8 targets in chunks of 3 positions (one padded)."""
  model = _model(config(MT5_VOCAB), label_smoothing=0.1, z_loss=1e-4, chunk=6)
  rng = np.random.default_rng(0)
  targets = rng.integers(2, MT5_VOCAB, size=(2, 8)).astype(np.int32)
  batch = {
      "encoder_input_tokens": rng.integers(2, MT5_VOCAB, size=(2, 6)).astype(np.int32),
      "decoder_input_tokens": np.concatenate([np.zeros((2, 1), np.int32), targets[:, :-1]], 1),
      "decoder_target_tokens": targets,
      "decoder_loss_weights": np.ones((2, 8), np.int32),
  }
  params = _params(model, batch)
  _assert_same(model, params, batch)
  # Scoring: each target's log-softmax, as from the full logits.
  scores = jax.jit(model.token_scores)(params, batch)
  logits = jax.jit(model._compute_logits)(params, batch)  # pylint: disable=protected-access
  ref = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(scores, ref, rtol=1e-6)


def _compiled_step(model, batch):
  params = jax.eval_shape(lambda: _params(model, batch))
  step = jax.jit(jax.grad(lambda p, b: model.loss_fn(p, b, None)[0]))
  return step.lower(params, batch).compile()


def _largest_buffer(compiled) -> int:
  """Elements of the largest array shape in the optimised HLO."""
  shapes = re.findall(r"\b(?:f32|bf16|f16|s32|pred|u32|s8|u8)\[([0-9,]+)\]", compiled.as_text())
  return max(int(np.prod([int(d) for d in s.split(",")])) for s in shapes)


def test_the_compiled_step_holds_no_batch_length_vocab_buffer():
  """XLA's memory analysis and buffers of a gradient step at 512 targets x 250,112 pieces: no
  array of batch x length x vocab elements, where the logits' reference has one."""
  rows, length = 2, 512
  batch = {
      "encoder_input_tokens": jax.ShapeDtypeStruct((rows, 16), jnp.int32),
      "decoder_input_tokens": jax.ShapeDtypeStruct((rows, length), jnp.int32),
      "decoder_target_tokens": jax.ShapeDtypeStruct((rows, length), jnp.int32),
      "decoder_loss_weights": jax.ShapeDtypeStruct((rows, length), jnp.int32),
  }
  logits_elements = rows * length * MT5_VOCAB
  model = _model(config(MT5_VOCAB), label_smoothing=0.1, z_loss=1e-4, chunk=64)
  fused = _compiled_step(model, batch)
  assert _largest_buffer(fused) < logits_elements // 8
  assert fused.memory_analysis().temp_size_in_bytes < 2 * logits_elements  # why: < bf16 logits

  class Reference(model_lib.EncoderDecoderModel):
    loss_fn = _reference_loss_fn

  reference = _compiled_step(Reference(model.module, label_smoothing=0.1, z_loss=1e-4), batch)
  assert _largest_buffer(reference) >= logits_elements  # why: the check above can fail
  assert reference.memory_analysis().temp_size_in_bytes > 4 * logits_elements


@pytest.mark.parametrize("remat_policy", ["none", "full"])
def test_fused_loss_on_a_2x2_mesh_keeps_the_vocabulary_sharded(remat_policy):
  """Batch over `data`, vocabulary over `model` (2 x 2 devices): the single-device values, and no
  all-gather of the output layer's vocabulary axis; with the layers rematerialised
  (`engine.remat`'s conditionals under the mesh) against the single device's without."""
  vocab = 96  # why: no other dimension of the network is 96, so the HLO check below reads it
  cfg = config(vocab)
  model = _model(cfg, label_smoothing=0.1, z_loss=1e-4, chunk=16)
  batch = synthetic_batch(5)
  params = _params(model, batch)
  (loss, metrics), grads = _value_and_grad(model.loss_fn)(params, batch)

  model = _model(
      dataclasses.replace(cfg, remat_policy=remat_policy),
      label_smoothing=0.1,
      z_loss=1e-4,
      chunk=16)
  part = partitioning.Partitioner(num_partitions=2, devices=jax.devices()[:4])
  with part.context():
    boxed = jax.eval_shape(
        lambda r: model.get_initial_variables(r, {
            k: v.shape for k, v in batch.items()
        })["params"], jax.random.PRNGKey(0))
  specs = part.param_mesh_specs(boxed, params)
  assert specs["decoder"]["logits_dense"]["kernel"] == jax.sharding.PartitionSpec(None, "model")
  shardings = jax.tree_util.tree_map(
      lambda s: jax.sharding.NamedSharding(part.mesh, s),
      specs,
      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
  step = part.partition(
      jax.value_and_grad(lambda p, b: model.loss_fn(p, b, None), has_aux=True),
      in_shardings=(shardings, part.batch_shardings(batch)),
      out_shardings=None)
  sharded_params = jax.device_put(params, shardings)
  sharded_batch = part.make_global_batch(batch)
  (s_loss, s_metrics), s_grads = step(sharded_params, sharded_batch)
  np.testing.assert_allclose(s_loss, loss, rtol=1e-6)
  for name in ("loss", "z_loss", "accuracy_numerator"):
    np.testing.assert_allclose(s_metrics[name], metrics[name], rtol=1e-6, err_msg=name)
  for g, s in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(s_grads)):
    np.testing.assert_allclose(s, g, rtol=1e-4, atol=1e-7)
  with part.context():
    hlo = step.lower(sharded_params, sharded_batch).compile().as_text()
  if remat_policy == "full":  # why: the mesh's step really runs the conditional form
    assert hlo.count(" conditional(") == cfg.num_encoder_layers + cfg.num_decoder_layers
  gathered = re.findall(r"= \w+\[([0-9,]*)\][^\n]* all-gather\(", hlo)
  assert not [s for s in gathered if s.split(",")[-1] == str(vocab)], gathered


def test_argmax_ties_are_broken_as_jnp_argmax():
  """A zero kernel ties every piece (argmax 0); duplicated columns tie at their first index."""
  rng = np.random.default_rng(1)
  hidden = jnp.asarray(rng.normal(size=(3, 5, 4)), jnp.float32)
  targets = jnp.asarray(rng.integers(0, 7, size=(3, 5)), jnp.int32)
  layer = losses.OutputLayer(chunk_tokens=6)
  zero = losses.token_statistics(hidden, jnp.zeros((4, 7)), targets, layer)
  np.testing.assert_array_equal(zero.argmax, 0)
  np.testing.assert_allclose(zero.log_z, np.log(7.0), rtol=1e-6)
  kernel = rng.normal(size=(4, 7)).astype(np.float32)
  kernel[:, 5] = kernel[:, 2]
  kernel[:, 6] = kernel[:, 2]
  stats = jax.jit(losses.token_statistics, static_argnums=3)(hidden, kernel, targets, layer)
  logits = jnp.einsum("bte,ev->btv", hidden, kernel)
  np.testing.assert_array_equal(stats.argmax, jnp.argmax(logits, -1))
  assert 2 in np.asarray(stats.argmax) and 5 not in np.asarray(stats.argmax)
  np.testing.assert_allclose(stats.log_z, jax.nn.logsumexp(logits, -1), rtol=1e-6)
  np.testing.assert_allclose(stats.log_prob_sum, jnp.sum(jax.nn.log_softmax(logits), -1), rtol=1e-5)


def test_bad_output_layers():
  with pytest.raises(ValueError, match="label_smoothing"):
    losses.OutputLayer(label_smoothing=1.0)
  with pytest.raises(ValueError, match="chunk_tokens"):
    _model(config(), chunk=0)
  tied = _model(dataclasses.replace(config(), logits_via_embedding=True))
  assert tied.output_layer.transposed and tied.output_layer.divisor == pytest.approx(4.0)
