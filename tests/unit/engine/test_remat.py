"""Tests of mcwq_t5x.engine.remat: the same values and gradients as `jax.checkpoint`, and on XLA:CPU
the activations really recomputed (XLA's memory analysis of the compiled gradient)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mcwq_t5x.engine import remat

D, F, ROWS, LENGTH, LAYERS = 64, 512, 4, 128, 8


def _layer(w, x, ids, scale):
  """A residual MLP block with wide activations; `ids` (int) and `scale` (static) ride along."""
  h = jnp.tanh(x @ w[0] + ids[..., None].astype(x.dtype)) * scale
  return x + jnp.sin(h) @ w[1]


def _grad(layer):

  def loss(ws, x, ids):
    for w in ws:
      x = layer(w, x, ids, 0.5)
    return jnp.sum(x**2)

  return jax.jit(jax.value_and_grad(loss))


@pytest.fixture(scope="module")
def inputs():
  keys = jax.random.split(jax.random.PRNGKey(0), 2 * LAYERS + 1)
  ws = [(jax.random.normal(keys[2 * i], (D, F)) / 8, jax.random.normal(keys[2 * i + 1], (F, D)) / 8)
        for i in range(LAYERS)]
  x = jax.random.normal(keys[-1], (ROWS, LENGTH, D))
  ids = jnp.arange(ROWS * LENGTH, dtype=jnp.int32).reshape(ROWS, LENGTH) % 5
  return ws, x, ids


@pytest.mark.parametrize("policy",
                         [None, jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims])
def test_same_value_and_gradients_as_jax_checkpoint(inputs, policy):
  gated = remat.checkpoint_after_cotangent(_layer, policy, static_argnums=(3,))
  plain = jax.checkpoint(_layer, policy=policy, static_argnums=(3,))
  value, grads = _grad(gated)(*inputs)
  ref_value, ref_grads = _grad(plain)(*inputs)
  np.testing.assert_allclose(value, ref_value, rtol=1e-6)
  for g, r in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)):
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5 * float(jnp.max(jnp.abs(r))))


def test_on_cpu_the_activations_are_recomputed_where_jax_checkpoint_keeps_them(inputs):
  """XLA:CPU merges `jax.checkpoint`'s recomputation into the forward pass (jax-ml/jax#19822):
  its buffers equal keeping everything; the conditional form's hold about one layer's."""
  assert remat.recompute_in_conditional()
  temp = {}
  for name, layer in [("none", _layer),
                      ("jax.checkpoint", jax.checkpoint(_layer, static_argnums=(3,))),
                      ("conditional", remat.checkpoint_after_cotangent(_layer, None, (3,)))]:
    compiled = _grad(layer).lower(*inputs).compile()
    temp[name] = compiled.memory_analysis().temp_size_in_bytes
    if name == "conditional":
      assert compiled.as_text().count(" conditional(") == LAYERS
  hidden = ROWS * LENGTH * F * 4  # float32 bytes of one [rows, length, F] activation
  assert temp["jax.checkpoint"] > 0.8 * temp["none"]
  assert temp["none"] > 2 * LAYERS * hidden  # why: tanh and sin of every layer are kept
  assert temp["conditional"] < 0.4 * temp["none"], temp


def test_the_predicate_is_true_for_every_cotangent():
  for value in [0.0, -0.0, 1.0, float("nan"), float("inf"), -float("inf"), 1e-45]:
    for dtype in (jnp.float32, jnp.bfloat16):
      assert bool(jax.jit(remat._always_true)(jnp.full((2, 3), value, dtype)))
  assert bool(remat._always_true({"ids": jnp.zeros(3, jnp.int32)}))


def test_a_constant_first_cotangent_does_not_fold_the_conditional(inputs):
  """An unused first output has a constant zero cotangent: the predicate reads every leaf, so the
  compiled gradient keeps its conditional."""
  ws, x, ids = inputs
  layer = remat.checkpoint_after_cotangent(lambda w, x: (jnp.zeros(()), _layer(w, x, ids, 0.5)))
  grad = jax.jit(jax.grad(lambda w, x: jnp.sum(layer(w, x)[1]**2)))
  assert grad.lower(ws[0], x).compile().as_text().count(" conditional(") == 1


def test_bad_static_argnums_and_keywords_are_refused():
  with pytest.raises(ValueError, match=r"static_argnums \[4\] out of range for 4"):
    remat.checkpoint_after_cotangent(_layer, None, (4,))(None, None, None, 0.5)

  class Scale(nn.Module):

    @nn.compact
    def __call__(self, x, scale=1.0):
      return x * self.param("w", nn.initializers.ones, (x.shape[-1],)) * scale

  layer = remat.rematerialised(Scale, None)()
  x = jnp.ones((2, 3))
  variables = layer.init(jax.random.PRNGKey(0), x)
  np.testing.assert_array_equal(layer.apply(variables, x, 0.0), 0.0)  # positional: honoured
  with pytest.raises(TypeError, match=r"positional arguments only, got \['scale'\]"):
    layer.apply(variables, x, scale=0.0)
