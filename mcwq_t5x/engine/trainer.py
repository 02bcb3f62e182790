"""Training state, optimizer, learning-rate schedules and the sharded train/eval steps.

Lean counterpart of T5X's `t5x/trainer.py`, `t5x/utils.py` (train-state creation) and
`t5x/optimizers.py`: `TrainState` (step, params, optax state), `make_optimizer` (Adafactor as T5X
fine-tuning, or AdamW), `create_learning_rate_schedule` (constant, linear, rsqrt, cosine, linear
warm-up; the MCWQ paper, Cui et al. TACL 2022 Sec. 5, uses 5e-4 for mT5) and `Trainer`: the
state created sharded, `train_step` accumulating `num_microbatches` with `lax.scan` under the
model's loss contract (`engine.model`), dropout rng `fold_in(fold_in(seed, step), microbatch)`,
optionally XLA's `RngBitGenerator` (`use_hardware_rng`, T5X's `unsafe_rbg`; dropout only), and
`eval_step`. A non-finite loss, gradient or updated state leaves the state unchanged and raises
`NonFiniteLossError` (at once from `train_step`; from `check_finite` for `train_step_async`,
whose device-side `FiniteGuard` freezes the state at the first bad step). No TensorFlow or SeqIO.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Optional

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec
import numpy as np
import optax

from mcwq_t5x.engine import cpu_settings
from mcwq_t5x.engine import partitioning as partitioning_lib

PyTree = Any
Batch = Mapping[str, jax.Array]


class NonFiniteLossError(FloatingPointError):
  """A train step produced a NaN/Inf loss, gradient or updated state (parameters, optimizer
  state); the train state was not updated.

  `step` = `int(state.step)` of the failed update; `state` the last good `TrainState`; `loss` the
  summed token loss and `grad_norm` (both may be finite when only the update is not). `note`, the
  caller's (which checkpoint to resume from), ends the message.
  """

  def __init__(self, step: int, state: "TrainState", loss: float, grad_norm: float, note: str = ""):
    self.step = int(step)
    self.state = state
    self.loss = float(loss)
    self.grad_norm = float(grad_norm)
    super().__init__(f"non-finite loss, gradient or update at step {self.step} (loss sum="
                     f"{self.loss}, grad norm={self.grad_norm}); the train state was not "
                     f"updated{note}")


@flax.struct.dataclass
class FiniteGuard:
  """Device-side record of the first non-finite step: `bad_step` int32 (-1 while all finite), its
  `loss` and `grad_norm` float32 (0 while none)."""
  bad_step: jax.Array
  loss: jax.Array
  grad_norm: jax.Array


@flax.struct.dataclass
class TrainState:
  """Training state (a pytree): `step` int32 updates so far, `params` float32 T5X-named,
  `opt_state`."""
  step: jax.Array
  params: PyTree
  opt_state: PyTree


# --------------------------------------------------------------------------------------------
# Learning-rate schedules and optimizers
# --------------------------------------------------------------------------------------------
def create_learning_rate_schedule(
    base_learning_rate: float = 5e-4,
    schedule: str = "constant",
    warmup_steps: int = 0,
    decay_steps: Optional[int] = None,
    end_learning_rate_factor: float = 0.0,
) -> Callable[[jax.Array], jax.Array]:
  """`fn(step) -> float32` optax schedule; ValueError for an unknown schedule or missing
  `decay_steps`.

  `base_learning_rate`: the peak (paper Sec. 5: 5e-4 for mT5). `schedule`: "constant"; "linear"
  (peak at `warmup_steps` to `end_learning_rate_factor * peak` at `decay_steps`); "rsqrt" (T5's
  `peak * sqrt(max(warmup_steps, 1) / max(step, warmup_steps))`); "cosine". Linear warm-up from 0.
  """
  peak = float(base_learning_rate)
  if schedule == "constant":
    main = optax.constant_schedule(peak)
  elif schedule in ("linear", "cosine"):
    if not decay_steps:
      raise ValueError(f"schedule {schedule!r} needs decay_steps (e.g. TRAIN_STEPS)")
    n = max(int(decay_steps) - int(warmup_steps), 1)
    if schedule == "linear":
      main = optax.linear_schedule(peak, peak * end_learning_rate_factor, n)
    else:
      main = optax.cosine_decay_schedule(peak, n, alpha=end_learning_rate_factor)
  elif schedule == "rsqrt":
    w = float(max(warmup_steps, 1))

    def main(count):  # count is relative to the end of warm-up.
      return peak * jnp.sqrt(w / jnp.maximum(count + w, w))
  else:
    raise ValueError(f"unknown learning-rate schedule {schedule!r}; expected one of "
                     "'constant', 'linear', 'rsqrt', 'cosine'")
  if warmup_steps > 0:
    warm = optax.linear_schedule(0.0, peak, int(warmup_steps))
    return optax.join_schedules([warm, main], [int(warmup_steps)])
  return main


def make_optimizer(learning_rate_fn: Callable[[jax.Array], jax.Array],
                   name: str = "adafactor",
                   weight_decay: float = 0.0,
                   grad_clip_norm: Optional[float] = None,
                   adafactor_decay_rate: float = 0.8,
                   adafactor_multiply_by_parameter_scale: bool = True,
                   adafactor_clipping_threshold: Optional[float] = 1.0,
                   adam_b1: float = 0.9,
                   adam_b2: float = 0.999,
                   adam_eps: float = 1e-8) -> optax.GradientTransformation:
  """The optax optimizer: "adafactor" (T5X fine-tuning's defaults) or "adamw" (HF Trainer's).

  `weight_decay` is decoupled (AdamW) or Adafactor's `weight_decay_rate`; `grad_clip_norm` clips
  the global norm first (the paper's recipe: 1.0). ValueError: unknown name.
  """
  if name == "adafactor":
    tx = optax.adafactor(
        learning_rate=learning_rate_fn,
        decay_rate=adafactor_decay_rate,
        multiply_by_parameter_scale=adafactor_multiply_by_parameter_scale,
        clipping_threshold=adafactor_clipping_threshold,
        weight_decay_rate=weight_decay or None)
  elif name == "adamw":
    tx = optax.adamw(learning_rate_fn, adam_b1, adam_b2, adam_eps, weight_decay=weight_decay)
  else:
    raise ValueError(f"unknown optimizer {name!r}; expected 'adafactor' or 'adamw'")
  if grad_clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(grad_clip_norm), tx)
  return tx


# --------------------------------------------------------------------------------------------
# Sharding of the optimizer state
# --------------------------------------------------------------------------------------------
def _path_keys(path) -> tuple[str, ...]:
  out = []
  for k in path:
    if isinstance(k, jax.tree_util.DictKey):
      out.append(str(k.key))
    elif isinstance(k, jax.tree_util.GetAttrKey):
      out.append(k.name)
    elif isinstance(k, jax.tree_util.SequenceKey):
      out.append(str(k.idx))
    else:
      out.append(str(k))
  return tuple(out)


def optimizer_state_specs(opt_state_shapes: PyTree, params_shapes: PyTree,
                          params_specs: PyTree) -> PyTree:
  """Mesh PartitionSpecs of an optax state from the parameters' (T5X: `logical_factor_rules`)."""
  param_index: dict[tuple[str, ...], tuple[tuple[int, ...], PartitionSpec]] = {}
  for (path, leaf), spec in zip(
      jax.tree_util.tree_flatten_with_path(params_shapes)[0],
      jax.tree_util.tree_leaves(params_specs, is_leaf=lambda x: isinstance(x, PartitionSpec))):
    param_index[_path_keys(path)] = (tuple(leaf.shape), spec)
  max_len = max((len(k) for k in param_index), default=0)

  def spec_for(path, leaf):
    keys = _path_keys(path)
    shape = tuple(getattr(leaf, "shape", ()))
    for n in range(min(len(keys), max_len), 0, -1):
      hit = param_index.get(keys[-n:])
      if hit is None:
        continue
      p_shape, p_spec = hit
      entries = list(p_spec) + [None] * (len(p_shape) - len(p_spec))
      # Adam moments, Adafactor's unfactored `v`: the parameter's spec.
      if shape == p_shape:
        return PartitionSpec(*entries)
      # Adafactor's factored `v_row`/`v_col`: the spec less that dimension; counts are replicated.
      if len(shape) == len(p_shape) - 1:
        for i in reversed(range(len(p_shape))):
          if p_shape[:i] + p_shape[i + 1:] == shape:
            return PartitionSpec(*(entries[:i] + entries[i + 1:]))
      return PartitionSpec()
    return PartitionSpec()

  return jax.tree_util.tree_map_with_path(spec_for, opt_state_shapes)


# --------------------------------------------------------------------------------------------
# Trainer
# --------------------------------------------------------------------------------------------
def _split_microbatches(batch: Batch, num_microbatches: int) -> Batch:
  """[B, ...] -> [num_microbatches, B // num_microbatches, ...] (contiguous split, as T5X)."""

  def split(x):
    b = x.shape[0]
    if b % num_microbatches:
      raise ValueError(f"batch size {b} is not divisible by num_microbatches={num_microbatches}")
    return x.reshape((num_microbatches, b // num_microbatches) + x.shape[1:])

  return jax.tree_util.tree_map(split, dict(batch))


def summarize_metrics(sums: Mapping[str, Any]) -> dict[str, float]:
  """{"loss", "cross_ent_loss", "z_loss" per target token, "accuracy" in [0, 1], "learning_rate",
  "num_tokens", "num_examples"} from the step's metric SUMS."""
  n = max(float(sums.get("num_tokens", 1.0)), 1.0)
  out = {"loss": float(sums["loss"]) / n}
  for k in ("cross_ent_loss", "z_loss"):
    if k in sums:
      out[k] = float(sums[k]) / n
  if "accuracy_numerator" in sums:
    out["accuracy"] = float(sums["accuracy_numerator"]) / n
  for k in ("learning_rate", "num_tokens", "num_examples", "grad_norm"):
    if k in sums:
      out[k] = float(sums[k])
  return out


def _all_finite(tree: PyTree) -> jax.Array:
  """A bool scalar: every element of the floating-point leaves of `tree` is finite."""
  leaves = [x for x in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  finite = [jnp.all(jnp.isfinite(x)) for x in leaves]
  return jnp.all(jnp.stack(finite)) if finite else jnp.bool_(True)


class Trainer:
  """Creates the sharded train state and runs compiled train/eval steps (T5X `Trainer`).

  `model`: `get_initial_variables`, `loss_normalizer`, `loss_fn(params, batch, rng,
  normalizer=None)`, `eval_fn` (the `engine.model` loss contract). `optimizer` default
  `make_optimizer(learning_rate_fn)`; `num_microbatches` accumulation steps; `seed` for init and
  dropout; `use_hardware_rng`: dropout masks from `unsafe_rbg` (XLA `RngBitGenerator`, T5X
  `USE_HARDWARE_RNG`), same init either way.
  """

  def __init__(self,
               model: Any,
               partitioner: partitioning_lib.Partitioner,
               learning_rate_fn: Callable[[jax.Array], jax.Array],
               optimizer: Optional[optax.GradientTransformation] = None,
               num_microbatches: Optional[int] = None,
               seed: int = 0,
               use_hardware_rng: bool = False):
    self.model = model
    self.partitioner = partitioner
    self.learning_rate_fn = learning_rate_fn
    self.optimizer = optimizer if optimizer is not None else make_optimizer(learning_rate_fn)
    self.num_microbatches = int(num_microbatches or 1)
    self.seed = int(seed)
    if use_hardware_rng:  # a typed key: fold_in keeps its implementation
      self.dropout_rng = jax.random.key(self.seed + 1, impl="unsafe_rbg")
    else:
      self.dropout_rng = jax.random.PRNGKey(self.seed + 1)
    self._state_shardings = None
    self._train_step_fn = None
    self._eval_step_fn = None

  # --- state --------------------------------------------------------------------------------
  def _init_fn(self, input_shapes, input_types):

    def init(rng):
      variables = self.model.get_initial_variables(rng, input_shapes, input_types)
      params = nn.unbox(variables["params"])
      return TrainState(
          step=jnp.zeros((), jnp.int32), params=params, opt_state=self.optimizer.init(params))

    return init

  def state_shardings(self,
                      input_shapes: Mapping[str, tuple[int, ...]],
                      input_types: Optional[Mapping[str, Any]] = None) -> TrainState:
    """NamedShardings of the train state (params from their logical axes, optimizer derived)."""
    if self._state_shardings is not None:
      return self._state_shardings
    p = self.partitioner
    rng = jax.random.PRNGKey(self.seed)
    with p.context():
      boxed = jax.eval_shape(
          lambda r: self.model.get_initial_variables(r, input_shapes, input_types)["params"], rng)
      state_shapes = jax.eval_shape(self._init_fn(input_shapes, input_types), rng)
    mesh_specs = p.param_mesh_specs(boxed, state_shapes.params)
    opt_specs = optimizer_state_specs(state_shapes.opt_state, state_shapes.params, mesh_specs)
    opt_specs = jax.tree_util.tree_map(
        lambda s, a: partitioning_lib.fit_spec_to_mesh(s, getattr(a, "shape", ()), p.mesh),
        opt_specs,
        state_shapes.opt_state,
        is_leaf=lambda x: isinstance(x, PartitionSpec))
    to_sharding = lambda s: jax.sharding.NamedSharding(p.mesh, s)
    is_spec = lambda x: isinstance(x, PartitionSpec)
    self._state_shardings = TrainState(
        step=p.replicated,
        params=jax.tree_util.tree_map(to_sharding, mesh_specs, is_leaf=is_spec),
        opt_state=jax.tree_util.tree_map(to_sharding, opt_specs, is_leaf=is_spec))
    self._state_shapes = state_shapes
    return self._state_shardings

  def state_shapes(self, input_shapes, input_types=None) -> TrainState:
    """`jax.ShapeDtypeStruct` tree of the train state, each leaf carrying its sharding."""
    shardings = self.state_shardings(input_shapes, input_types)
    return jax.tree_util.tree_map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                                  self._state_shapes, shardings)

  def create_state(self,
                   input_shapes: Mapping[str, tuple[int, ...]],
                   input_types: Optional[Mapping[str, Any]] = None,
                   init_params: Optional[PyTree] = None) -> TrainState:
    """A `TrainState` initialised directly sharded over the mesh.

    `input_shapes`: feature -> global batch shape; `init_params` (e.g. a pretrained checkpoint)
    replaces the random init. ValueError if its structure or shapes differ from the model's.
    """
    shardings = self.state_shardings(input_shapes, input_types)
    p = self.partitioner
    if init_params is None:
      init = p.partition(
          self._init_fn(input_shapes, input_types),
          in_shardings=p.replicated,
          out_shardings=shardings)
      return self._released(init(jax.random.PRNGKey(self.seed)))
    expected = self._state_shapes.params
    exp_struct = jax.tree_util.tree_structure(expected)
    got_struct = jax.tree_util.tree_structure(init_params)
    if exp_struct != got_struct:
      raise ValueError("initial checkpoint parameters do not match the model's parameter tree:\n"
                       f"expected {exp_struct}\n got {got_struct}")
    for (path, e), g in zip(
        jax.tree_util.tree_flatten_with_path(expected)[0], jax.tree_util.tree_leaves(init_params)):
      if tuple(e.shape) != tuple(np.shape(g)):
        raise ValueError(f"initial checkpoint parameter {'/'.join(_path_keys(path))} has shape "
                         f"{tuple(np.shape(g))}, the model expects {tuple(e.shape)}")
    params = jax.tree_util.tree_map(lambda g, e, s: jax.device_put(jnp.asarray(g, e.dtype), s),
                                    init_params, expected, shardings.params)

    def init_opt(params):
      return TrainState(
          step=jnp.zeros((), jnp.int32), params=params, opt_state=self.optimizer.init(params))

    fn = p.partition(init_opt, in_shardings=(shardings.params,), out_shardings=shardings)
    return self._released(fn(params))

  @staticmethod
  def _released(state: TrainState) -> TrainState:
    """`state` once computed, with the host memory its initialisation freed given back
    (`cpu_settings.release_free_host_memory`: no part of the steps' peak)."""
    jax.block_until_ready(state)
    cpu_settings.release_free_host_memory()
    return state

  # --- steps --------------------------------------------------------------------------------
  def _loss_grads_and_metrics(self, params, batch, rng):
    """The batch's loss, gradient and metric sums, accumulated over microbatches."""
    # why: each microbatch divided by the whole batch's D, so the sums are the batch's loss and
    # gradient.
    normalizer = self.model.loss_normalizer(batch)

    def loss_fn(p, mb, r):
      return self.model.loss_fn(p, mb, r, normalizer=normalizer)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if self.num_microbatches <= 1:
      (loss, metrics), grads = grad_fn(params, batch, jax.random.fold_in(rng, 0))
      return loss, grads, metrics
    mbs = _split_microbatches(batch, self.num_microbatches)

    def body(carry, xs):
      i, mb = xs
      (loss, metrics), grads = grad_fn(params, mb, jax.random.fold_in(rng, i))
      return jax.tree_util.tree_map(jnp.add, carry, (loss, grads, metrics)), None

    first = jax.tree_util.tree_map(lambda x: x[0], mbs)
    (loss_shape, m_shapes), _ = jax.eval_shape(lambda: grad_fn(params, first, rng))
    zeros = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), (loss_shape, m_shapes))
    init = (zeros[0], jax.tree_util.tree_map(jnp.zeros_like, params), zeros[1])
    totals, _ = jax.lax.scan(body, init, (jnp.arange(self.num_microbatches), mbs))
    return totals

  def _train_step(self, state: TrainState, batch: Batch, base_rng: jax.Array, guard: FiniteGuard):
    rng = jax.random.fold_in(base_rng, state.step)
    loss, grads, metrics = self._loss_grads_and_metrics(state.params, batch, rng)
    updates, new_opt_state = self.optimizer.update(grads, state.opt_state, state.params)
    new_params = optax.apply_updates(state.params, updates)
    grad_norm = optax.tree.norm(grads)
    # why the new state too: a finite gradient times a huge learning rate makes Inf/NaN parameters
    finite = jnp.isfinite(loss) & jnp.isfinite(metrics["loss"]) & jnp.isfinite(grad_norm)
    finite = finite & _all_finite((new_params, new_opt_state))
    halted = guard.bad_step >= 0
    new_state = TrainState(step=state.step + 1, params=new_params, opt_state=new_opt_state)
    # Keep the old state when the step is not finite, or an earlier one was not (the state stays
    # frozen at the last good one until the caller checks the guard): nothing bad is saved.
    new_state = jax.tree_util.tree_map(lambda n, o: jnp.where(finite & ~halted, n, o), new_state,
                                       state)
    first_bad = ~finite & ~halted
    new_guard = FiniteGuard(
        bad_step=jnp.where(first_bad, state.step, guard.bad_step).astype(jnp.int32),
        loss=jnp.where(first_bad, metrics["loss"].astype(jnp.float32), guard.loss),
        grad_norm=jnp.where(first_bad, grad_norm.astype(jnp.float32), guard.grad_norm))
    metrics = dict(metrics)
    metrics["learning_rate"] = jnp.asarray(self.learning_rate_fn(state.step), jnp.float32)
    metrics["grad_norm"] = grad_norm
    metrics["is_finite"] = finite
    return new_state, metrics, new_guard

  def compile_train_step(self, state_shardings: TrainState, batch: Batch):
    """Compiles `(state, batch, dropout_rng, guard) -> (new_state, metrics, new_guard)`, state
    donated."""
    p = self.partitioner
    return p.partition(
        self._train_step,
        in_shardings=(state_shardings, p.batch_shardings(batch), p.replicated, p.replicated),
        out_shardings=(state_shardings, p.replicated, p.replicated),
        donate_argnums=(0,))

  def train_step_async(self, state: TrainState, batch: Batch,
                       guard: FiniteGuard) -> tuple[TrainState, dict[str, jax.Array], FiniteGuard]:
    """(new_state, metric sums as device scalars, new guard): one update, no host sync.

    From the first NaN/Inf step on the state stays the last good one until `check_finite` raises:
    check before saving or logging.
    """
    if self._train_step_fn is None:
      shardings = jax.tree_util.tree_map(lambda x: x.sharding, state)
      self._train_step_fn = self.compile_train_step(shardings, batch)
    return self._train_step_fn(state, dict(batch), self.dropout_rng, guard)

  def initial_guard(self) -> "FiniteGuard":
    """A `FiniteGuard` with no bad step (bad_step -1), replicated over the mesh."""
    guard = FiniteGuard(
        bad_step=np.array(-1, np.int32),
        loss=np.array(0.0, np.float32),
        grad_norm=np.array(0.0, np.float32))
    return jax.device_put(guard, self.partitioner.replicated)

  @staticmethod
  def check_finite(guard: "FiniteGuard", state: TrainState) -> None:
    """Waits for `guard`; NonFiniteLossError (first bad step, its loss and norm, last good
    `state`)."""
    host = jax.device_get(guard)
    if int(host.bad_step) >= 0:
      raise NonFiniteLossError(int(host.bad_step), state, float(host.loss), float(host.grad_norm))

  def train_step(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict[str, jax.Array]]:
    """(new_state, metric sums): `train_step_async` then `check_finite`; NonFiniteLossError."""
    new_state, metrics, guard = self.train_step_async(state, batch, self.initial_guard())
    self.check_finite(guard, new_state)
    return new_state, metrics

  def _eval_step(self, params, batch):
    _, metrics = self.model.eval_fn(params, batch)
    return metrics

  def eval_step(self, state: TrainState, batch: Batch) -> dict[str, jax.Array]:
    """Metric sums (loss, accuracy numerator, token count) of a batch without dropout."""
    if self._eval_step_fn is None:
      p = self.partitioner
      shardings = jax.tree_util.tree_map(lambda x: x.sharding, state.params)
      self._eval_step_fn = p.partition(
          self._eval_step,
          in_shardings=(shardings, p.batch_shardings(batch)),
          out_shardings=p.replicated)
    return self._eval_step_fn(state.params, dict(batch))


class StepTimer:
  """Wall-clock throughput between two log points (step time, examples/s, tokens/s, and with
  model FLOPs given, GFLOP/s)."""

  def __init__(self):
    self.reset()

  def reset(self) -> None:
    """Starts a new measurement: now, with no steps."""
    self._t = time.perf_counter()
    self._examples = 0.0
    self._tokens = 0.0
    self._flops: Optional[float] = None
    self._steps = 0

  def add(self, num_examples: float, num_tokens: float, flops: Optional[float] = None) -> None:
    """Records one step's examples, (target) tokens and model FLOPs (None: not counted)."""
    self._examples += num_examples
    self._tokens += num_tokens
    if flops is not None:
      self._flops = (self._flops or 0.0) + flops
    self._steps += 1

  def read_and_reset(self) -> dict[str, float]:
    """{"step_time_s", "examples_per_s", "tokens_per_s"} since the last call, and
    "model_gflops_per_s" (10^9 FLOPs/s) when the steps' FLOPs were given."""
    now = time.perf_counter()
    dt = max(now - self._t, 1e-9)
    out = {
        "step_time_s": dt / max(self._steps, 1),
        "examples_per_s": self._examples / dt,
        "tokens_per_s": self._tokens / dt
    }
    if self._flops is not None:
      out["model_gflops_per_s"] = self._flops / dt / 1e9
    self.reset()
    return out
