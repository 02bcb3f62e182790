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

# The name gin files configure (`partitioning.set_host_device_count.count = N`); the function is
# `cpu_settings.set_host_device_count` (the same object, so one gin binding serves both names).
set_host_device_count = cpu_settings.set_host_device_count


def standard_logical_axis_rules(
    activation_partitioning_dims: int = 1,
    parameter_partitioning_dims: int = 1,
    additional_rules: Optional[LogicalAxisRules] = None) -> tuple[tuple[str, Any], ...]:
  """T5X's default logical-axis -> mesh-axis rules.

  Same table as `t5x.partitioning.standard_logical_axis_rules`: with 1-D parameter partitioning the
  large dimensions (`vocab`, `mlp`, `heads`, `joined_kv`) are split over the `model` axis and the
  batch over `data`; with 2-D parameter partitioning `embed` is additionally split over `data`
  (ZeRO-3-like); with 2-D activation partitioning activations' `embed` goes to `model`.

  Args:
    activation_partitioning_dims: 1 or 2.
    parameter_partitioning_dims: 1 or 2.
    additional_rules: rules placed BEFORE the standard ones (the first matching rule wins).

  Returns:
    A tuple of `(logical_name, mesh_axis_or_None)` pairs for `flax.linen.logical_axis_rules`.

  Raises:
    ValueError: for partitioning dims other than 1 or 2, or the unsupported (2, 2) combination.
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
  """Calls `jax.distributed.initialize` for multi-process runs (no-op when nothing is configured).

  Returns True if it was called. Run before anything touches a device. `coordinator_address`:
  process 0's "host:port", "auto" (JAX detects Cloud TPU, SLURM, Open MPI, ...) or None (one
  process); `num_processes`, `process_id` None: detected; `initialization_timeout` in seconds
  (None: JAX's 300 s); `heartbeat_timeout` (s) without a heartbeat before the coordination
  service ends the run (`HEARTBEAT_TIMEOUT_S`; None: JAX's 100 s).
  On CPU the collectives are set to gloo when JAX has none selected.

  Raises:
    ValueError: `num_processes` < 1 or `process_id` outside [0, num_processes).
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
  """Adds T5X's multi-process flags (`t5x/train.py`) to a main's argument parser.

  `--multiprocess_gpu` (initialise `jax.distributed`), `--coordinator_address=HOST:PORT` (process
  0's address, the same for every process), `--process_count=N`, `--process_index=I` and
  `--initialization_timeout=SECONDS`. Despite T5X's name the flags work on any platform: GPU
  hosts, CPU processes (gloo collectives), and a TPU slice (there `--multiprocess_gpu` alone:
  JAX detects the rest).
  """
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
  """Calls `initialize_distributed` as the flags of `add_multiprocess_flags` say.

  Returns:
    None when `--multiprocess_gpu` is not given (the caller may then use a gin-configured
    `initialize_distributed`), else what `initialize_distributed` returns (True).

  Raises:
    ValueError: a multi-process flag without `--multiprocess_gpu`, a bad process count or index.
  """
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
  """`spec` without the mesh axes that do not divide the dimension they shard (e.g. an odd
  vocabulary size over 2 `model` devices): that dimension is replicated instead.

  Args:
    spec: a mesh-axis `PartitionSpec` (may be shorter than `shape`).
    shape: the array's shape.
    mesh: the mesh whose axis sizes count.

  Returns:
    A `PartitionSpec` with one entry per dimension of `shape`.
  """
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
  """A `("data", "model")` mesh of shape `(len(devices) // num_partitions, num_partitions)`.

  `devices` defaults to `jax.devices()` (all processes'); `num_partitions` is T5X's.

  Raises:
    ValueError: if `num_partitions` is not a positive divisor of the number of devices.
  """
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
  """Mesh + logical axis rules + `jax.jit` with explicit shardings (T5X `PjitPartitioner`).

  Attributes:
    mesh: the `("data", "model")` device mesh.
    logical_axis_rules: the rules used for parameters and activations.
  """

  def __init__(self,
               num_partitions: int = 1,
               logical_axis_rules: Optional[LogicalAxisRules] = None,
               devices: Optional[Sequence[jax.Device]] = None):
    """Creates the mesh.

    Args:
      num_partitions: number of model-parallel partitions (size of the `model` mesh axis).
      logical_axis_rules: None = `standard_logical_axis_rules()`.
      devices: None = all devices.
    """
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
    """One data shard per process, as in T5X's default (`index=process_index`,
    `num_shards=process_count`); which rows of a global batch the shard holds:
    `local_batch_rows`."""
    return DataShardInfo(index=jax.process_index(), num_shards=jax.process_count())

  def check_batch_size(self, global_batch_size: int) -> int:
    """Checks the batch divides over data replicas and processes; returns the per-process size.

    Raises:
      ValueError: if `global_batch_size` is not a multiple of the data-parallel size or of the
        number of processes.
    """
    if global_batch_size % self.data_parallel_size:
      raise ValueError(f"batch size {global_batch_size} must be a multiple of the data-parallel "
                       f"size {self.data_parallel_size} (mesh {dict(self.mesh.shape)})")
    if global_batch_size % jax.process_count():
      raise ValueError(f"batch size {global_batch_size} must be a multiple of the number of "
                       f"processes {jax.process_count()}")
    return global_batch_size // jax.process_count()

  # --- data ---------------------------------------------------------------------------------
  def local_batch_rows(self, global_batch_size: int) -> slice:
    """The rows of a global batch that this process's devices hold (`data_sharding`).

    A `slice` into the global batch's leading dimension: all rows with one process, else a
    contiguous block of `global_batch_size // P` rows, process 0 first (`create_mesh`'s order).

    Raises:
      ValueError: bad batch size (`check_batch_size`), or the process's rows are not one
        contiguous block.
    """
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
    """Assembles global `jax.Array`s from this process's rows of the batch.

    Args:
      local_batch: feature -> numpy array `[rows, ...]`: this process's rows
        (`local_batch_rows(global_batch_size)` of the global batch; with one process the whole
        batch).
      global_batch_size: rows of the global batch; None = `rows * process_count`.

    Returns:
      feature -> `jax.Array` of shape `[global_batch_size, ...]`, sharded over `data`.

    Raises:
      ValueError: the local rows do not match this process's share of `global_batch_size`.
    """
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
    """Mesh `PartitionSpec`s of a parameter tree.

    Args:
      boxed_params: the tree as a Flax init returns it, leaves boxed with their logical axis names
        (`nn.LogicallyPartitioned`; arrays or `jax.ShapeDtypeStruct`s); an unboxed leaf is
        replicated.
      params: the same tree unboxed (arrays or `jax.ShapeDtypeStruct`s), for the shapes.

    Returns:
      A tree like `params` of `PartitionSpec`s: `logical_axis_rules` applied, then
      `fit_spec_to_mesh`.
    """
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
    """Shapes, dtypes and shardings of the parameters `init_params` creates, allocating nothing.

    `init_params`: rng -> the tree boxed with logical axis names, traced by `jax.eval_shape`,
    never run. Returns the unboxed tree of `jax.ShapeDtypeStruct`s with their `NamedSharding`s.
    """
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
    """`jax.jit` with explicit shardings; tracing happens inside the mesh/rules context.

    Args:
      fn: the function to compile.
      in_shardings / out_shardings: pytrees of `jax.sharding.Sharding` (as for `jax.jit`).
      static_argnums, donate_argnums: as for `jax.jit`.

    Returns:
      A callable running the compiled function under the mesh context.
    """
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
