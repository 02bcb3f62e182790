"""Tests of mcwq_t5x.engine.trainer: schedules, optimizer, microbatching, NaN handling, metric summaries."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mcwq_t5x.engine import partitioning
from mcwq_t5x.engine import trainer as trainer_lib
import tiny_engine
from tiny_engine import SHAPES, VOCAB


def tiny_model(dropout_rate=0.0):
  return tiny_engine.tiny_model(dropout_rate)


def synthetic_batch(seed, batch=8):
  # Targets as short as 2 tokens: microbatches get clearly different token counts.
  return tiny_engine.synthetic_batch(seed, batch, min_target_length=2)


class PoisonedModel:
  """Wraps a model; its loss is NaN for batches whose first input token is VOCAB - 1."""

  def __init__(self, inner):
    self.inner = inner
    self.module = inner.module

  def get_initial_variables(self, *a, **k):
    return self.inner.get_initial_variables(*a, **k)

  def loss_normalizer(self, batch):
    return self.inner.loss_normalizer(batch)

  def loss_fn(self, params, batch, rng, normalizer=None):
    loss, metrics = self.inner.loss_fn(params, batch, rng, normalizer)
    poison = batch["encoder_input_tokens"][0, 0] == VOCAB - 1
    metrics = dict(metrics, loss=jnp.where(poison, jnp.nan, metrics["loss"]))
    return jnp.where(poison, jnp.nan, loss), metrics

  def eval_fn(self, params, batch):
    return self.loss_fn(params, batch, None)


def _numpy_params(tr, seed=0):
  """Parameters of `tr`'s shapes drawn by NumPy (N(0, 0.1)): a state without compiling the random
  initialisation, for tests that do not read it."""
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(lambda s: (0.1 * rng.standard_normal(s.shape)).astype(s.dtype),
                                tr.state_shapes(SHAPES).params)


def test_schedules():
  const = trainer_lib.create_learning_rate_schedule(5e-4, "constant")
  assert float(const(0)) == pytest.approx(5e-4) and float(const(10**6)) == pytest.approx(5e-4)
  warm = trainer_lib.create_learning_rate_schedule(3e-5, "constant", warmup_steps=100)
  assert float(warm(0)) == 0.0
  assert float(warm(50)) == pytest.approx(1.5e-5)
  assert float(warm(100)) == pytest.approx(3e-5)
  lin = trainer_lib.create_learning_rate_schedule(1e-3, "linear", warmup_steps=10, decay_steps=110)
  assert float(lin(10)) == pytest.approx(1e-3)
  assert float(lin(60)) == pytest.approx(5e-4)
  assert float(lin(110)) == pytest.approx(0.0, abs=1e-12)
  cos = trainer_lib.create_learning_rate_schedule(
      1e-3, "cosine", warmup_steps=10, decay_steps=110, end_learning_rate_factor=0.1)
  assert float(cos(10)) == pytest.approx(1e-3)
  assert float(cos(35)) == pytest.approx(1e-3 * (0.1 + 0.9 * (1 + np.cos(np.pi / 4)) / 2))
  assert float(cos(60)) == pytest.approx(5.5e-4)  # halfway: 0.1 + 0.9 * (1 + cos(pi / 2)) / 2
  assert float(cos(110)) == pytest.approx(1e-4)
  rsqrt = trainer_lib.create_learning_rate_schedule(0.01, "rsqrt", warmup_steps=100)
  assert float(rsqrt(100)) == pytest.approx(0.01)
  assert float(rsqrt(400)) == pytest.approx(0.005)  # 0.01 * sqrt(100 / 400)
  with pytest.raises(ValueError, match="unknown learning-rate schedule"):
    trainer_lib.create_learning_rate_schedule(1e-3, "exp")
  with pytest.raises(ValueError, match="needs decay_steps"):
    trainer_lib.create_learning_rate_schedule(1e-3, "linear")


def test_make_optimizer():
  lr = trainer_lib.create_learning_rate_schedule(1e-3)
  params = {"w": jnp.ones((256, 256))}
  state = trainer_lib.make_optimizer(lr).init(params)
  # Adafactor keeps factored second moments: a row and a column vector, not a full matrix.
  shapes = sorted(x.shape for x in jax.tree_util.tree_leaves(state))
  assert (256,) in shapes and (256, 256) not in shapes
  with pytest.raises(ValueError, match="unknown optimizer"):
    trainer_lib.make_optimizer(lr, name="sgd")


def _one_step(num_microbatches, optimizer="adamw", init_params=None):
  """(initial params, params after one step, metrics) of the tiny model on a 4x2 mesh; the random
  initialisation unless `init_params`."""
  p = partitioning.Partitioner(num_partitions=2)
  lr = trainer_lib.create_learning_rate_schedule(1e-2)
  tr = trainer_lib.Trainer(
      tiny_model(),
      p,
      lr,
      optimizer=trainer_lib.make_optimizer(lr, optimizer),
      num_microbatches=num_microbatches,
      seed=0)
  state = tr.create_state(SHAPES, init_params=init_params)
  init = jax.device_get(state.params)
  state, metrics = tr.train_step(state, p.make_global_batch(synthetic_batch(7)))
  return init, jax.device_get(state.params), jax.device_get(metrics)


def test_microbatching_equals_one_large_batch():
  """4 microbatches of 2 rows (different token counts) give the same update as one batch of 8.

  The trainer does not depend on the loss normalizing factor (test_model checks the model's
  contract for every factor)."""
  init, p1, m1 = _one_step(1, "adafactor")
  # why: the same parameters as the random initialisation above, without compiling it again
  _, p4, m4 = _one_step(4, "adafactor", init_params=init)
  for k in ("loss", "num_tokens", "accuracy_numerator", "num_examples"):
    np.testing.assert_allclose(m4[k], m1[k], rtol=1e-5, err_msg=k)
  np.testing.assert_allclose(m4["grad_norm"], m1["grad_norm"], rtol=1e-5)
  assert m1["grad_norm"] > 0
  for a, b in zip(jax.tree_util.tree_leaves(p1), jax.tree_util.tree_leaves(p4)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def _dropout_step(use_hardware_rng, seed=0, init_params=None):
  """One AdamW step of the tiny model with dropout 0.5 from the random initialisation (or
  `init_params`); returns (initial params, metrics)."""
  p = partitioning.Partitioner(num_partitions=1)
  lr = trainer_lib.create_learning_rate_schedule(1e-2)
  tr = trainer_lib.Trainer(
      tiny_model(dropout_rate=0.5),
      p,
      lr,
      optimizer=trainer_lib.make_optimizer(lr, "adamw"),
      seed=seed,
      use_hardware_rng=use_hardware_rng)
  state = tr.create_state(SHAPES, init_params=init_params)
  init = jax.device_get(state.params)
  _, metrics = tr.train_step(state, p.make_global_batch(synthetic_batch(7)))
  return init, jax.device_get(metrics)


def test_hardware_rng_changes_dropout_masks_only():
  """USE_HARDWARE_RNG: the same initial parameters, other dropout masks (another loss under
  dropout 0.5), the same masks again for the same seed and others for another seed (from the same
  parameters: only the masks differ)."""
  init_default, m_default = _dropout_step(False)
  init_rbg, m_rbg = _dropout_step(True)
  # why: given the parameters of the random initialisation compared above, not initialised again
  _, m_rbg_again = _dropout_step(True, init_params=init_rbg)
  _, m_rbg_other_seed = _dropout_step(True, seed=1, init_params=init_rbg)
  for a, b in zip(jax.tree_util.tree_leaves(init_default), jax.tree_util.tree_leaves(init_rbg)):
    np.testing.assert_array_equal(a, b)
  assert np.isfinite(m_rbg["loss"]) and m_rbg["grad_norm"] > 0
  assert m_rbg["num_tokens"] == m_default["num_tokens"]
  assert abs(m_rbg["loss"] - m_default["loss"]) > 1e-3 * abs(m_default["loss"])
  assert m_rbg_again["loss"] == m_rbg["loss"]
  assert m_rbg_other_seed["loss"] != m_rbg["loss"]


def test_microbatches_must_divide_batch():
  p = partitioning.Partitioner(num_partitions=1)
  lr = trainer_lib.create_learning_rate_schedule(1e-2)
  tr = trainer_lib.Trainer(tiny_model(), p, lr, num_microbatches=3)
  state = tr.create_state(SHAPES, init_params=_numpy_params(tr))
  with pytest.raises(ValueError, match="not divisible by num_microbatches=3"):
    tr.train_step(state, p.make_global_batch(synthetic_batch(0)))


def test_nan_loss_or_update_raises_and_keeps_state():
  """A NaN loss (step 1), then a finite loss and gradient whose update is not finite: a learning
  rate of Inf (what 1e39 is in float32) from step 2 makes Inf/NaN parameters. Each is refused, the state
  the last good one."""
  p = partitioning.Partitioner(num_partitions=1)
  lr = lambda step: jnp.where(step >= 2, jnp.inf, 1e-2)
  tr = trainer_lib.Trainer(PoisonedModel(tiny_model()), p, lr)
  state = tr.create_state(SHAPES, init_params=_numpy_params(tr))
  state, _ = tr.train_step(state, p.make_global_batch(synthetic_batch(0)))
  good = jax.device_get(state.params)
  bad = synthetic_batch(1)
  bad["encoder_input_tokens"][0, 0] = VOCAB - 1
  # The poisoned loss is a constant NaN: its gradient is 0, the loss alone stops the step.
  message = (r"^non-finite loss, gradient or update at step 1 \(loss sum=nan, grad norm=0.0\); "
             r"the train state was not updated$")
  with pytest.raises(trainer_lib.NonFiniteLossError, match=message) as e:
    tr.train_step(state, p.make_global_batch(bad))
  assert e.value.step == 1 and int(e.value.state.step) == 1
  assert np.isnan(e.value.loss) and e.value.grad_norm == 0.0
  for a, b in zip(
      jax.tree_util.tree_leaves(good),
      jax.tree_util.tree_leaves(jax.device_get(e.value.state.params))):
    np.testing.assert_array_equal(a, b)
  state, _ = tr.train_step(e.value.state, p.make_global_batch(synthetic_batch(2)))
  good = jax.device_get(state)
  with pytest.raises(trainer_lib.NonFiniteLossError, match="at step 2 ") as e:
    tr.train_step(state, p.make_global_batch(synthetic_batch(3)))
  assert np.isfinite(e.value.loss) and 0.0 < e.value.grad_norm < np.inf
  assert e.value.step == 2 and int(e.value.state.step) == 2
  for a, b in zip(jax.tree_util.tree_leaves(good), jax.tree_util.tree_leaves(e.value.state)):
    np.testing.assert_array_equal(a, np.asarray(b))


def test_initial_params_are_used_and_checked():
  p = partitioning.Partitioner(num_partitions=2)
  lr = trainer_lib.create_learning_rate_schedule(1e-2)
  tr = trainer_lib.Trainer(tiny_model(), p, lr, seed=5)
  init = jax.tree_util.tree_map(lambda x: np.full(x.shape, 0.5, x.dtype),
                                tr.state_shapes(SHAPES).params)
  state = tr.create_state(SHAPES, init_params=init)
  emb = state.params["token_embedder"]["embedding"]
  assert emb.sharding.spec == jax.sharding.PartitionSpec("model", None)
  np.testing.assert_array_equal(np.asarray(emb), 0.5)
  init["token_embedder"]["embedding"] = np.zeros((VOCAB + 1, 16), np.float32)
  with pytest.raises(ValueError, match="token_embedder/embedding has shape"):
    tr.create_state(SHAPES, init_params=init)


def test_step_timer_reset():
  timer = trainer_lib.StepTimer()
  timer.add(8, 80)
  timer.add(8, 40)
  first = timer.read_and_reset()
  assert first["examples_per_s"] > 0 and first["tokens_per_s"] == pytest.approx(
      first["examples_per_s"] * 120 / 16)
  second = timer.read_and_reset()  # reset: no steps since
  assert second["examples_per_s"] == 0.0 and second["tokens_per_s"] == 0.0
  timer.add(4, 10)
  timer.reset()
  assert timer.read_and_reset()["examples_per_s"] == 0.0


def test_summarize_metrics():
  s = trainer_lib.summarize_metrics({
      "loss": 30.0,
      "accuracy_numerator": 5.0,
      "num_tokens": 10.0,
      "learning_rate": 5e-4
  })
  assert s["loss"] == 3.0 and s["accuracy"] == 0.5 and s["learning_rate"] == 5e-4
