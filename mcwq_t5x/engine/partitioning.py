"""Device mesh, T5X logical axis rules and sharded compilation.

The lean counterpart of T5X's `t5x/partitioning.py` (`PjitPartitioner`): a 2-D mesh
`("data", "model")`, T5X's standard rules from logical axis names (`batch`, `vocab`, `embed`,
`mlp`, `heads`, `kv`, `joined_kv`, `length`, `relpos_buckets`) to mesh axes, and `jax.jit` with
explicit shardings. `initialize_distributed` wraps `jax.distributed.initialize` (T5X's
`--multiprocess_gpu` flags; gloo on CPU); `local_batch_rows` and `make_global_batch` place each
process's rows so that a global batch holds the same examples however many processes feed it.
`param_mesh_specs` and `abstract_params` give parameter shardings without allocating.
`set_host_device_count` is re-exported from `cpu_settings` under the name gin files configure.
No TensorFlow or SeqIO import.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import numpy as np

from mcwq_t5x.engine import cpu_settings

PyTree = Any
LogicalAxisRules = Sequence[tuple[str, Optional[str | tuple[str, ...]]]]

DATA_AXIS = "data"
MODEL_AXIS = "model"


class BatchSizeError(ValueError):
  """A global batch size that the mesh's data-parallel devices or the processes cannot share
  evenly; the message names the size, the divisor and the mesh."""


# The name gin files configure (`partitioning.set_host_device_count.count = N`); the function is
# `cpu_settings.set_host_device_count` (the same object, so one gin binding serves both names).
set_host_device_count = cpu_settings.set_host_device_count


def standard_logical_axis_rules(
    activation_partitioning_dims: int = 1,
    parameter_partitioning_dims: int = 1,
    additional_rules: Optional[LogicalAxisRules] = None) -> tuple[tuple[str, Any], ...]:
  """T5X's default logical-axis -> mesh-axis rules (`t5x.partitioning.standard_logical_axis_rules`),
  as `(logical_name, mesh_axis_or_None)` pairs for `flax.linen.logical_axis_rules`.

  1-D parameter partitioning splits `vocab`, `mlp`, `heads`, `joined_kv` over `model` and the batch
  over `data`; 2-D also `embed` over `data` (ZeRO-3-like); 2-D activations put `embed` on `model`.
  `additional_rules` go first (the first match wins). ValueError: dims not 1 or 2, or (2, 2).
  """
  if activation_partitioning_dims not in (1, 2) or parameter_partitioning_dims not in (1, 2):
    raise ValueError("activation_partitioning_dims and parameter_partitioning_dims must be 1 or 2, "
                     f"got {activation_partitioning_dims} and {parameter_partitioning_dims}")
  if activation_partitioning_dims == 2 and parameter_partitioning_dims == 2:
    raise ValueError("2-D activation and 2-D parameter partitioning together are not supported "
                     "(as in T5X)")
  rules: list[tuple[str, Any]] = [
      ("batch", DATA_AXIS),
      ("vocab", MODEL_AXIS),
      ("mlp", MODEL_AXIS),
      ("heads", MODEL_AXIS),
      ("kv", None),
      ("joined_kv", MODEL_AXIS),
      ("relpos_buckets", None),
      ("abspos_buckets", None),
      ("length", None),
      ("layers", None),
      ("stack", None),
      ("mlp_activations", None),
  ]
  if activation_partitioning_dims == 2:
    rules.append(("embed", MODEL_AXIS))
  elif parameter_partitioning_dims == 2:
    rules.append(("embed", DATA_AXIS))
  else:
    rules.append(("embed", None))
  return tuple(list(additional_rules or ()) + rules)


#: Seconds without a heartbeat after which JAX's coordination service ends a multi-process run
#: (`jax.distributed.initialize(heartbeat_timeout_seconds=)`). JAX's 100 s is exceeded on a shared
#: host whose cores are busy (a process starved while it compiles: "Task 1 heartbeat timeout"); a
#: process that really died is named within `process_watch.TIMEOUT_S` by the run's own watch.
HEARTBEAT_TIMEOUT_S = 600


def initialize_distributed(coordinator_address: Optional[str] = None,
                           num_processes: Optional[int] = None,
                           process_id: Optional[int] = None,
                           initialization_timeout: Optional[int] = None,
                           heartbeat_timeout: Optional[int] = HEARTBEAT_TIMEOUT_S) -> bool:
  """True if it called `jax.distributed.initialize` (a no-op when nothing is configured); run before
  anything touches a device.

  `coordinator_address`: "host:port" of process 0, "auto" (Cloud TPU, SLURM, Open MPI, ...) or
  None; `num_processes`, `process_id` None: detected; `initialization_timeout` (None: JAX's 300 s)
  and `heartbeat_timeout` (default `HEARTBEAT_TIMEOUT_S`; None: JAX's 100 s) in seconds. On CPU
  the collectives become gloo when JAX has none selected. ValueError: `num_processes` < 1 or
  `process_id` outside [0, num_processes).
  """
  if coordinator_address is None:
    return False
  if num_processes is not None and int(num_processes) < 1:
    raise ValueError(f"the number of processes must be at least 1, got {num_processes}")
  if process_id is not None and (int(process_id) < 0 or (num_processes is not None and
                                                         int(process_id) >= int(num_processes))):
    raise ValueError(f"process index {process_id} is outside [0, {num_processes}) (process "
                     "indices count from 0)")
  try:
    if jax.config.jax_cpu_collectives_implementation in (None, "", "none"):
      jax.config.update("jax_cpu_collectives_implementation", "gloo")
  except AttributeError:  # a JAX without the option: nothing to select
    pass
  kwargs = {}
  if initialization_timeout is not None:
    kwargs["initialization_timeout"] = int(initialization_timeout)
  if heartbeat_timeout is not None:
    kwargs["heartbeat_timeout_seconds"] = int(heartbeat_timeout)
  jax.distributed.initialize(
      coordinator_address=None if coordinator_address == "auto" else coordinator_address,
      num_processes=num_processes,
      process_id=process_id,
      **kwargs)
  logging.info("jax.distributed initialised: process %d of %d", jax.process_index(),
               jax.process_count())
  return True


def add_multiprocess_flags(parser: argparse.ArgumentParser) -> None:
  """Adds T5X's multi-process flags (`t5x/train.py`) to a parser: `--multiprocess_gpu`,
  `--coordinator_address=HOST:PORT`, `--process_count=N`, `--process_index=I`,
  `--initialization_timeout=SECONDS`; on GPU, CPU (gloo) and TPU (`--multiprocess_gpu` alone)."""
  group = parser.add_argument_group("multi-process (T5X's flags)")
  group.add_argument(
      "--multiprocess_gpu",
      action="store_true",
      help="initialise the JAX distributed system (jax.distributed.initialize) from "
      "--coordinator_address, --process_count and --process_index (each omitted one is "
      "detected by JAX on a TPU slice or a SLURM/Open MPI cluster)")
  group.add_argument(
      "--coordinator_address", default=None, help="HOST:PORT of process 0 (all processes)")
  group.add_argument("--process_count", type=int, default=None, help="number of processes")
  group.add_argument(
      "--process_index", type=int, default=None, help="index of this process, from 0")
  group.add_argument(
      "--initialization_timeout",
      type=int,
      default=None,
      help="seconds to wait for every process to connect (JAX's default, 300, if unset)")
  group.add_argument(
      "--heartbeat_timeout",
      type=int,
      default=None,
      help="seconds without a heartbeat after which a process counts as dead and the run ends "
      f"(default {HEARTBEAT_TIMEOUT_S}; JAX's is 100, which a busy shared host can exceed; a dead "
      "process is named sooner by the run's own watch)")
  group.add_argument(
      "--lost_process_timeout",
      type=float,
      default=None,
      help="seconds without a report from another process after which the run's watch names it "
      "as gone and stops (mcwq_t5x.train; default mcwq_t5x.engine.process_watch.TIMEOUT_S, 20)")


def initialize_from_flags(args: argparse.Namespace) -> Optional[bool]:
  """None without `--multiprocess_gpu` (a gin-configured `initialize_distributed` may run), else
  `initialize_distributed`'s result. ValueError: a flag without it, a bad count or index."""
  given = [
      f"--{name}" for name in ("coordinator_address", "process_count", "process_index",
                               "initialization_timeout", "heartbeat_timeout",
                               "lost_process_timeout") if getattr(args, name, None) is not None
  ]
  if not getattr(args, "multiprocess_gpu", False):
    if given:
      raise ValueError(f"{', '.join(given)} given without --multiprocess_gpu; add "
                       "--multiprocess_gpu to initialise the processes (as in T5X)")
    return None
  logging.info(
      "initialising the distributed system: coordinator_address=%s process_count=%s "
      "process_index=%s", args.coordinator_address, args.process_count, args.process_index)
  heartbeat = getattr(args, "heartbeat_timeout", None)
  return initialize_distributed(args.coordinator_address or "auto", args.process_count,
                                args.process_index, args.initialization_timeout,
                                HEARTBEAT_TIMEOUT_S if heartbeat is None else heartbeat)


def fit_spec_to_mesh(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
  """A `PartitionSpec`, one entry per dimension of `shape`, without the mesh axes that do not divide
  the dimension they shard (an odd vocabulary over 2 `model` devices: replicated)."""
  entries = list(spec) + [None] * (len(shape) - len(spec))
  fitted = []
  for dim, entry in zip(shape, entries):
    if entry is None:
      fitted.append(None)
      continue
    axes = entry if isinstance(entry, tuple) else (entry,)
    size = int(np.prod([mesh.shape[a] for a in axes]))
    fitted.append(entry if dim % size == 0 else None)
  return PartitionSpec(*fitted)


@dataclasses.dataclass(frozen=True)
class DataShardInfo:
  """Which part of the data this process reads (mirrors `seqio.ShardInfo`)."""
  index: int
  num_shards: int


def create_mesh(num_partitions: int = 1, devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """A `("data", "model")` mesh `(len(devices) // num_partitions, num_partitions)` (T5X's
  `num_partitions`); ValueError unless it divides the number of devices."""
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  if num_partitions < 1 or n % num_partitions:
    raise ValueError(f"num_partitions={num_partitions} must be a positive divisor of the number "
                     f"of devices ({n})")
  shape = (n // num_partitions, num_partitions)
  try:
    device_array = mesh_utils.create_device_mesh(shape, devices=devices)
  except (ValueError, NotImplementedError, AssertionError):  # Unusual topologies: plain order.
    device_array = np.asarray(devices, dtype=object).reshape(shape)
  return Mesh(device_array, (DATA_AXIS, MODEL_AXIS))


class Partitioner:
  """Mesh + logical axis rules + `jax.jit` with explicit shardings (T5X `PjitPartitioner`)."""

  def __init__(self,
               num_partitions: int = 1,
               logical_axis_rules: Optional[LogicalAxisRules] = None,
               devices: Optional[Sequence[jax.Device]] = None):
    """Creates the mesh: `num_partitions` is the `model` axis size; None rules: the standard
    ones."""
    self.num_partitions = num_partitions
    self.mesh = create_mesh(num_partitions, devices)
    self.logical_axis_rules = tuple(
        logical_axis_rules if logical_axis_rules is not None else standard_logical_axis_rules())

  # --- sizes --------------------------------------------------------------------------------
  @property
  def data_parallel_size(self) -> int:
    """Number of data-parallel replicas (size of the `data` axis)."""
    return self.mesh.shape[DATA_AXIS]

  def get_data_shard_info(self) -> DataShardInfo:
    """One data shard per process, as T5X's default (`index=process_index`,
    `num_shards=process_count`)."""
    return DataShardInfo(index=jax.process_index(), num_shards=jax.process_count())

  def check_batch_size(self, global_batch_size: int) -> int:
    """The per-process batch size; BatchSizeError unless a multiple of the data-parallel size and
    processes."""
    if global_batch_size % self.data_parallel_size:
      raise BatchSizeError(
          f"batch size {global_batch_size} must be a multiple of the data-parallel "
          f"size {self.data_parallel_size} (mesh {dict(self.mesh.shape)})")
    if global_batch_size % jax.process_count():
      raise BatchSizeError(f"batch size {global_batch_size} must be a multiple of the number of "
                           f"processes {jax.process_count()}")
    return global_batch_size // jax.process_count()

  # --- data ---------------------------------------------------------------------------------
  def local_batch_rows(self, global_batch_size: int) -> slice:
    """The `slice` of a global batch this process's devices hold: all rows with one process, else a
    contiguous block of `global_batch_size // P`, process 0 first. ValueError: bad size or
    layout."""
    self.check_batch_size(global_batch_size)
    index_map = self.data_sharding.addressable_devices_indices_map((global_batch_size,))
    rows = sorted({(ix[0].start or 0, global_batch_size if ix[0].stop is None else ix[0].stop)
                   for ix in index_map.values()})
    start, stop = rows[0][0], rows[0][1]
    for a, b in rows[1:]:
      if a != stop:
        raise ValueError(f"process {jax.process_index()}'s devices hold rows {rows} of the global "
                         f"batch of {global_batch_size}: not one contiguous block (mesh "
                         f"{self.mesh.devices.tolist()}); order the devices by process")
      stop = b
    return slice(start, stop)

  def make_global_batch(self,
                        local_batch: Mapping[str, np.ndarray],
                        global_batch_size: Optional[int] = None) -> dict[str, jax.Array]:
    """feature -> `jax.Array` [global_batch_size, ...] sharded over `data`, from this process's
    `local_batch_rows` ([rows, ...] numpy; None size: rows * process_count). ValueError on
    mismatch."""
    if global_batch_size is None:
      return {
          k: jax.make_array_from_process_local_data(self.data_sharding, np.asarray(v))
          for k, v in local_batch.items()
      }
    rows = self.local_batch_rows(global_batch_size)
    out = {}
    for k, v in local_batch.items():
      v = np.asarray(v)
      if len(v) != rows.stop - rows.start:
        raise ValueError(f"feature {k!r}: process {jax.process_index()} gives {len(v)} rows, its "
                         f"share of the global batch of {global_batch_size} is rows "
                         f"{rows.start}:{rows.stop}")
      out[k] = jax.make_array_from_process_local_data(self.data_sharding, v,
                                                      (global_batch_size,) + v.shape[1:])
    return out

  # --- shardings ----------------------------------------------------------------------------
  @contextlib.contextmanager
  def context(self):
    """Mesh + logical rules context: needed while tracing for `nn.with_logical_constraint`."""
    with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.logical_axis_rules):
      yield

  def logical_to_mesh_axes(self, logical_specs: PyTree) -> PyTree:
    """Maps a tree of logical `PartitionSpec`s to mesh-axis `PartitionSpec`s."""
    return nn.logical_to_mesh(logical_specs, self.logical_axis_rules)

  def logical_to_mesh_sharding(self, logical_specs: PyTree) -> PyTree:
    """Maps a tree of logical `PartitionSpec`s (None leaves = replicated) to `NamedSharding`s."""

    def to_sharding(spec):
      if spec is None:
        spec = PartitionSpec()
      return NamedSharding(self.mesh, nn.logical_to_mesh_axes(spec, self.logical_axis_rules))

    return jax.tree_util.tree_map(
        to_sharding, logical_specs, is_leaf=lambda x: x is None or isinstance(x, PartitionSpec))

  def param_mesh_specs(self, boxed_params: PyTree, params: PyTree) -> PyTree:
    """A tree like `params` of `PartitionSpec`s: the `logical_axis_rules` of `boxed_params`'s
    `nn.LogicallyPartitioned` names (unboxed leaves replicated), then `fit_spec_to_mesh`."""
    is_spec = lambda x: x is None or isinstance(x, PartitionSpec)
    logical = nn.get_partition_spec(boxed_params)
    mesh_specs = jax.tree_util.tree_map(
        lambda s: PartitionSpec()
        if s is None else nn.logical_to_mesh_axes(s, self.logical_axis_rules),
        logical,
        is_leaf=is_spec)
    return jax.tree_util.tree_map(
        lambda s, a: fit_spec_to_mesh(s, a.shape, self.mesh),
        mesh_specs,
        params,
        is_leaf=lambda x: isinstance(x, PartitionSpec))

  def abstract_params(self,
                      init_params: Callable[[jax.Array], PyTree],
                      rng: Optional[jax.Array] = None) -> PyTree:
    """The unboxed tree of `jax.ShapeDtypeStruct`s with `NamedSharding`s that `init_params` (rng ->
    boxed tree) would create, traced by `jax.eval_shape`, never run."""
    rng = jax.random.PRNGKey(0) if rng is None else rng
    with self.context():
      boxed = jax.eval_shape(init_params, rng)
      shapes = jax.eval_shape(lambda r: nn.unbox(init_params(r)), rng)
    specs = self.param_mesh_specs(boxed, shapes)
    return jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(self.mesh, s)),
        shapes,
        specs,
        is_leaf=lambda x: isinstance(x, PartitionSpec))

  @property
  def replicated(self) -> NamedSharding:
    """Fully replicated sharding."""
    return NamedSharding(self.mesh, PartitionSpec())

  @property
  def data_sharding(self) -> NamedSharding:
    """Sharding of batch arrays: leading (batch) dimension over `data`."""
    return NamedSharding(self.mesh, PartitionSpec(DATA_AXIS))

  def batch_shardings(self, batch: Mapping[str, Any]) -> dict[str, NamedSharding]:
    """`data_sharding` for every feature of a batch dict."""
    return {k: self.data_sharding for k in batch}

  # --- compilation --------------------------------------------------------------------------
  def partition(
      self,
      fn: Callable[..., Any],
      in_shardings: Any,
      out_shardings: Any,
      static_argnums: Sequence[int] = (),
      donate_argnums: Sequence[int] = ()
  ) -> "PartitionedFunction":
    """`jax.jit(fn)` with explicit shardings (as `jax.jit`'s arguments), traced and run inside the
    mesh and rules context."""
    jitted = jax.jit(
        fn,
        in_shardings=in_shardings,
        out_shardings=out_shardings,
        static_argnums=tuple(static_argnums),
        donate_argnums=tuple(donate_argnums))
    return PartitionedFunction(jitted, self)


class PartitionedFunction:
  """A jitted function that is traced and run inside its partitioner's mesh/rules context."""

  def __init__(self, jitted: Callable[..., Any], partitioner: Partitioner):
    self._jitted = jitted
    self._partitioner = partitioner

  def __call__(self, *args, **kwargs):
    with self._partitioner.context():
      return self._jitted(*args, **kwargs)

  def lower(self, *args, **kwargs):
    """As `jax.jit(...).lower`, inside the mesh context."""
    with self._partitioner.context():
      return self._jitted.lower(*args, **kwargs)
