"""Rematerialised layers (activation checkpointing) whose recomputation XLA:CPU keeps apart.

`jax.checkpoint` keeps a layer's recomputation apart from its forward pass with an optimisation
barrier. XLA:CPU removes the barriers before common-subexpression elimination, so the recomputation
is merged back into the forward pass and every activation is kept (jax-ml/jax#19822; measured at
mT5-small's shape in docs/benchmarks.md: 0.68 -> 0.65 GiB a row). Here the backward pass of
`jax.checkpoint(fn, policy)` runs inside a `lax.cond` whose predicate is read from the layer's
output cotangent: a conditional's branch is a computation of its own (no elimination across it) and
cannot start before that cotangent exists, so the layer's activations are recomputed when the
backward pass reaches the layer, as on TPU and GPU. Both branches are the same function, so the
value does not depend on the predicate. On other platforms (XLA:GPU copies a conditional's
predicate to the host) `flax.linen.remat` is used as it is.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
from flax.core import lift
import jax
from jax import lax
import jax.numpy as jnp

Array = jax.Array


def _always_true(cotangents: Any) -> Array:
  """A bool scalar that is true whatever the cotangents hold, but that XLA cannot fold: the bits of
  the first element of every float leaf, OR-ed, OR 1 (NaN and inf included). Every leaf counts, so
  one constant cotangent (an unused output's zeros) does not make the predicate constant."""
  leaves = [
      x for x in jax.tree_util.tree_leaves(cotangents)
      if jnp.issubdtype(x.dtype, jnp.floating) and x.size
  ]
  if not leaves:
    return jnp.asarray(True)
  bits = [lax.bitcast_convert_type(x[(0,) * x.ndim].astype(jnp.float32), jnp.int32) for x in leaves]
  return (functools.reduce(jnp.bitwise_or, bits) | 1) != 0


def checkpoint_after_cotangent(
    fun: Callable[..., Any],
    policy: Optional[Callable[..., bool]] = None,
    static_argnums: Sequence[int] = ()
) -> Callable[..., Any]:
  """`jax.checkpoint(fun, policy=policy, static_argnums=...)`, same values and gradients, whose
  backward pass (the recomputation of what `policy` does not save, then the layer's vjp) runs in a
  `lax.cond` on the output cotangent. Arguments are positional pytrees of arrays (integer and key
  arrays get float0 cotangents) or, at `static_argnums`, Python values. Reverse mode only (a
  `jax.custom_vjp`: no `jvp`, and `fun` may not close over traced values it is differentiated
  in); under `vmap` the predicate is batched and both branches run.

  Raises:
    ValueError: a static argnum that is negative or past the arguments.
  """
  static_argnums = tuple(static_argnums)

  def wrapped(*args):
    bad = [i for i in static_argnums if not 0 <= i < len(args)]
    if bad:
      raise ValueError(f"checkpoint_after_cotangent: static_argnums {bad} out of range for "
                       f"{len(args)} positional arguments")
    static = {i: args[i] for i in static_argnums}
    dynamic = [a for i, a in enumerate(args) if i not in static]

    def bound(*dynamic_args):
      it = iter(dynamic_args)
      return fun(*[static[i] if i in static else next(it) for i in range(len(args))])

    leaves, treedef = jax.tree_util.tree_flatten(dynamic)
    # why: only inexact inputs have cotangents a conditional can return; the rest are float0
    inexact = [jnp.issubdtype(jnp.result_type(x), jnp.inexact) for x in leaves]

    def backward(operands):
      vjp_fn, cotangent = operands
      flat = jax.tree_util.tree_leaves(vjp_fn(cotangent))
      return [g for g, keep in zip(flat, inexact) if keep]

    @jax.custom_vjp
    def layer(*dynamic_args):
      return bound(*dynamic_args)

    def layer_fwd(*dynamic_args):
      # why prevent_cse=False: the conditional separates the recomputation; no barrier needed
      return jax.vjp(jax.checkpoint(bound, policy=policy, prevent_cse=False), *dynamic_args)

    def layer_bwd(vjp_fn, cotangent):
      grads = iter(lax.cond(_always_true(cotangent), backward, backward, (vjp_fn, cotangent)))
      flat = [
          next(grads) if keep else jnp.zeros(jnp.shape(x), jax.dtypes.float0)
          for x, keep in zip(leaves, inexact)
      ]
      return tuple(jax.tree_util.tree_unflatten(treedef, flat))

    layer.defvjp(layer_fwd, layer_bwd)
    return layer(*dynamic)

  return wrapped


def _lifted_checkpoint(
    fn: Callable[..., Any],
    policy: Optional[Callable[..., bool]] = None,
    static_argnums: Sequence[int] = ()
) -> Callable[..., Any]:
  """`checkpoint_after_cotangent` lifted over a Flax scope function, as `flax.core.lift.checkpoint`
  lifts `jax.checkpoint` (every variable collection and rng stream)."""

  def inner(scope_fn, repack_fn, variable_groups, rng_groups, *args, **kwargs):
    if kwargs:  # why: a dropped keyword (`deterministic=True`) would change the result silently
      raise TypeError(
          f"a rematerialised layer takes positional arguments only, got {sorted(kwargs)}")

    def rematted(variable_groups, rng_groups, *args):
      scope = scope_fn(variable_groups, rng_groups)
      y = fn(scope, *args)
      return y, repack_fn(scope)

    # why + 2: the variable and rng groups come first
    return checkpoint_after_cotangent(rematted, policy,
                                      tuple(i + 2 for i in static_argnums))(variable_groups,
                                                                            rng_groups, *args)

  return lift.pack(inner, (True,), (True,), (True,), name="remat", enable_kwargs=True)


def recompute_in_conditional() -> bool:
  """Whether `rematerialised` uses the conditional form: on XLA:CPU, the default backend."""
  return jax.default_backend() == "cpu"


def rematerialised(
    layer: type[nn.Module],
    policy: Optional[Callable[..., bool]],
    static_argnums: Sequence[int] = ()) -> type[nn.Module]:
  """`layer` whose `__call__` is rematerialised as `policy` says (`jax.checkpoint_policies`; the
  same parameter names); `static_argnums` count `self` as 0, as `flax.linen.remat`'s do. The
  conditional form lifts every variable collection and rng stream, and takes positional
  arguments only (TypeError otherwise)."""
  if not recompute_in_conditional():
    return nn.remat(layer, policy=policy, static_argnums=tuple(static_argnums))
  return nn.transforms.lift_transform(
      _lifted_checkpoint, layer, policy=policy,
      static_argnums=tuple(i - 1 for i in static_argnums))  # why - 1: `self` is not passed
