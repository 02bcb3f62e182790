"""Tests of mcwq_t5x.engine.flops: the model FLOPs of a training step (a hand count, the
`dot_general`s of the real step's jaxpr, XLA's `cost_analysis()` of the compiled step), the matmul
peak's bookkeeping (never its speed), and the training main's utilisation figures."""
import dataclasses
import types

import jax
from jax.extend import core as jex_core
import jax.numpy as jnp
import numpy as np
import pytest

from mcwq_t5x import train as train_lib
from mcwq_t5x.engine import flops
from mcwq_t5x.engine import model as model_lib
from mcwq_t5x.engine import network
from mcwq_t5x.engine import partitioning
from mcwq_t5x.engine import trainer as trainer_lib
import tiny_engine

SMALL = tiny_engine.config(
    512, emb_dim=32, head_dim=16, mlp_dim=64, num_decoder_layers=2, dropout_rate=0.1)


def test_hand_count():
  """Every matmul of the forward pass as [M, K] x [K, N] (2 M K N FLOPs), times 3 for forward and
  backward: 1 row of 2 input / 3 target tokens, width 4, 1 head of 2, gated MLP of 5, vocabulary 7,
  1 + 1 layers."""
  config = tiny_engine.config(7, emb_dim=4, num_heads=1, head_dim=2, mlp_dim=5)
  li, lt, d, a, f, v = 2, 3, 4, 2, 5, 7
  forward = [
      # encoder: query, key, value, out; q.k and weights.v; wi_0, wi_1, wo
      (li, d, a),
      (li, d, a),
      (li, d, a),
      (li, a, d),
      (li, a, li),
      (li, li, a),
      (li, d, f),
      (li, d, f),
      (li, f, d),
      # decoder self-attention
      (lt, d, a),
      (lt, d, a),
      (lt, d, a),
      (lt, a, d),
      (lt, a, lt),
      (lt, lt, a),
      # decoder cross-attention: queries from the decoder, keys and values from the encoder
      (lt, d, a),
      (li, d, a),
      (li, d, a),
      (lt, a, d),
      (lt, a, li),
      (lt, li, a),
      # decoder MLP, logits
      (lt, d, f),
      (lt, d, f),
      (lt, f, d),
      (lt, d, v)
  ]
  expected = 3 * sum(2 * m * k * n for m, k, n in forward)
  assert expected == 4200
  assert flops.train_step_flops(config, 1, li, lt) == 4200
  assert flops.train_step_flops(config, 5, li, lt) == 5 * 4200
  one_activation = dataclasses.replace(config, mlp_activations=("relu",))
  assert flops.train_step_flops(config, 1, li, lt) - flops.train_step_flops(
      one_activation, 1, li, lt) == 3 * 2 * (li + lt) * d * f


def _step_and_inputs(config, batch, input_length, target_length, packed):
  """The real training step (`Trainer._train_step`, 1 device) and its arguments, the train state as
  `Trainer.state_shapes` (shapes, dtypes and shardings)."""
  model = model_lib.EncoderDecoderModel(network.Transformer(config), z_loss=0.0)
  lr = trainer_lib.create_learning_rate_schedule(1e-3, "constant")
  trainer = trainer_lib.Trainer(
      model=model,
      partitioner=partitioning.Partitioner(devices=jax.devices()[:1]),
      learning_rate_fn=lr,
      use_hardware_rng=True)
  features = {
      "encoder_input_tokens": input_length,
      "decoder_target_tokens": target_length,
      "decoder_input_tokens": target_length,
      "decoder_loss_weights": target_length
  }
  if packed:
    features.update(encoder_segment_ids=input_length, decoder_segment_ids=target_length)
  data = {k: np.ones((batch, n), np.int32) for k, n in features.items()}
  # why: the state's shapes and shardings, not an initialised state: tracing and lowering the step
  # read no values, and the random initialisation would be compiled for nothing
  state = trainer.state_shapes({k: v.shape for k, v in data.items()}, {k: jnp.int32 for k in data})
  return trainer, (state, data, trainer.dropout_rng, trainer.initial_guard())


def _dot_flops(jaxpr, table_shape=None) -> int:
  """2 x (output elements) x (contracted size) summed over every `dot_general` of `jaxpr` and of
  the jaxprs inside it (jit, custom derivatives, scans), but those with an operand or result of
  `table_shape` (the relative position table [heads, buckets]: its one-hot lookup and gradient)."""
  total = 0
  for eqn in jaxpr.eqns:
    shapes = {tuple(v.aval.shape) for v in (*eqn.invars, *eqn.outvars) if hasattr(v, "aval")}
    if eqn.primitive.name == "dot_general" and table_shape not in shapes:
      (contracting, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2 * int(np.prod(eqn.outvars[0].aval.shape)) * int(
          np.prod([lhs[i] for i in contracting]))
    for sub in jex_core.jaxprs_in_params(eqn.params):
      total += _dot_flops(sub, table_shape)
  return total


@pytest.mark.parametrize(
    "config,shape,packed",
    [(SMALL, (4, 8, 12), True), (SMALL, (4, 8, 12), False),
     (dataclasses.replace(SMALL, mlp_activations=("relu",)), (3, 5, 7), True),
     (dataclasses.replace(SMALL, logits_via_embedding=True), (3, 5, 7), True)],
    ids=["packed", "unpacked", "relu", "tied"])
def test_equals_the_dots_of_the_training_step(config, shape, packed):
  trainer, args = _step_and_inputs(config, *shape, packed=packed)
  jaxpr = jax.make_jaxpr(trainer._train_step)(*args)  # pylint: disable=protected-access
  table = (config.num_heads, config.relative_attention_num_buckets)
  counted = _dot_flops(jaxpr.jaxpr, table)
  assert counted > 0
  assert flops.train_step_flops(config, *shape) == counted
  # The lookup's contractions are there (forward and the table's gradient, once per stack: its
  # layers share the bias), and are all that is left out: a model FLOP the formula missed would
  # show above.
  lookup = _dot_flops(jaxpr.jaxpr) - counted
  b, li, lt = shape
  h, nb = table
  assert lookup == 4 * h * nb * (li * li + lt * lt), lookup


def test_close_to_xla_cost_analysis_of_the_compiled_step():
  """XLA counts the elementwise work too: ours is a little lower, the matmuls being nearly all."""
  config = tiny_engine.config(512, emb_dim=128, head_dim=64, mlp_dim=512)
  trainer, args = _step_and_inputs(config, 8, 16, 24, packed=True)
  state = args[0]
  step = trainer.compile_train_step(jax.tree_util.tree_map(lambda x: x.sharding, state), args[1])
  analysis = step.lower(*args).compile().cost_analysis()
  if isinstance(analysis, list):
    analysis = analysis[0]
  if not analysis or "flops" not in analysis:
    pytest.skip("this XLA backend gives no cost analysis")
  ours = flops.train_step_flops(config, 8, 16, 24)
  assert 0.93 * analysis["flops"] < ours <= analysis["flops"], (ours, analysis["flops"])


def test_batch_train_step_flops():
  shapes = {"encoder_input_tokens": (6, 10), "decoder_target_tokens": (6, 20)}
  assert flops.batch_train_step_flops(SMALL, shapes) == flops.train_step_flops(SMALL, 6, 10, 20)
  assert flops.batch_train_step_flops(None, shapes) is None
  assert flops.batch_train_step_flops(SMALL, {"encoder_input_tokens": (6, 10)}) is None


def test_decode_flops_is_the_teacher_forced_forward_pass_with_causal_self_attention():
  """Greedy decoding of n tokens with a KV cache does the forward pass's matmuls over those n
  tokens, except that step t attends t cached keys (n (n + 1) / 2 key rows, not n^2); beams repeat
  the decoder's work, not the encoder's."""
  li, n = 7, 5
  a = SMALL.num_heads * SMALL.head_dim
  causal_saving = SMALL.num_decoder_layers * 2 * (n * n - n * (n + 1) // 2) * a * 2
  forward = flops.train_step_flops(SMALL, 1, li, n) / 3
  assert flops.decode_flops(SMALL, [li], [n]) == forward - causal_saving
  encoder_only = types.SimpleNamespace(**{
      **dataclasses.asdict(SMALL), "num_decoder_layers": 0,
      "vocab_size": 0
  })
  encoder = flops.train_step_flops(encoder_only, 1, li, n) / 3
  one = flops.decode_flops(SMALL, [li], [n])
  assert flops.decode_flops(SMALL, [li], [n], beams=4) == encoder + 4 * (one - encoder)
  assert flops.decode_flops(SMALL, [li, 3], [n, 2]) == one + flops.decode_flops(SMALL, [3], [2])
  with pytest.raises(ValueError, match="2 input lengths, 1 generated"):
    flops.decode_flops(SMALL, [1, 2], [3])


def test_time_matmul_is_two_n_cubed_over_the_best_call(monkeypatch):
  clock = iter([0.0, 0.5, 1.0, 1.25, 2.0, 2.4])  # calls of 0.5, 0.25 and 0.4 s
  monkeypatch.setattr(flops.time, "perf_counter", lambda: next(clock))
  calls = []
  assert flops.time_matmul(
      lambda: calls.append(1), 1000, repeats=3) == pytest.approx(2e9 / 0.25 / 1e9)
  assert len(calls) == 3
  with pytest.raises(ValueError, match="repeats must be >= 1"):
    flops.time_matmul(lambda: None, 10, repeats=0)


def test_matmul_peak_picks_the_fastest_kernel():
  products = []

  def extra(x, y):
    assert x.shape == y.shape == (64, 64) and x.dtype == np.float32
    products.append(np.matmul(x, y))

  peak = flops.matmul_peak(n=64, repeats=2, extra={"mine": extra})
  assert set(peak.measured) == {"numpy", "XLA", "mine"}
  assert len(products) == 3  # one untimed call, then 2 timed
  assert peak.kernel == max(peak.measured, key=peak.measured.get)
  assert peak.gflops == peak.measured[peak.kernel] > 0 and peak.n == 64
  assert peak.describe().startswith(f"{peak.kernel} 64x64 float32 matmul (numpy ")
  only_numpy = flops.matmul_peak(n=32, repeats=1, kernels=("numpy",))
  assert list(only_numpy.measured) == ["numpy"]
  with pytest.raises(ValueError, match=r"unknown kernel\(s\) \['BLAS'\]"):
    flops.matmul_peak(kernels=("BLAS",))
  with pytest.raises(ValueError, match="no kernel timed"):
    flops.matmul_peak(n=8, kernels=("numpy",), platform="gpu")


def test_step_timer_adds_flops():
  timer = trainer_lib.StepTimer()
  timer.add(8, 80, 4e9)
  timer.add(8, 40, 4e9)
  out = timer.read_and_reset()
  assert out["model_gflops_per_s"] == pytest.approx(out["examples_per_s"] * 8 / 16)
  timer.add(8, 80)  # no FLOP count: no figure
  assert "model_gflops_per_s" not in timer.read_and_reset()


def test_the_step_lines_utilisation():
  peak = flops.MatmulPeak(gflops=80.0, kernel="XLA", measured={"numpy": 60.0, "XLA": 80.0}, n=2048)
  assert train_lib.utilisation({"model_gflops_per_s": 20.0},
                               peak) == ("  20.0 GFLOP/s = 25.0% of the XLA matmul's 80.0")
  assert train_lib.utilisation({"model_gflops_per_s": 20.0}, None) == "  20.0 GFLOP/s"
  assert train_lib.utilisation({}, peak) == ""
