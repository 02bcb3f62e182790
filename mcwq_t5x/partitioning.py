"""Device mesh, T5X logical axis rules and sharded compilation.

This is the lean counterpart of T5X's `t5x/partitioning.py` (`PjitPartitioner`): a 2-D device mesh
with axes `("data", "model")`, T5X's standard logical-axis rules mapping the model's logical axis
names (`batch`, `vocab`, `embed`, `mlp`, `heads`, `kv`, `joined_kv`, `length`, `relpos_buckets`) to
mesh axes, and `jax.jit` with explicit `in_shardings`/`out_shardings` (what `pjit` became in JAX).

Multi-host / multi-process: `initialize_distributed()` wraps `jax.distributed.initialize` (the mains
call it from T5X's flags `--multiprocess_gpu --coordinator_address --process_count --process_index`,
`add_multiprocess_flags` / `initialize_from_flags`; on CPU the cross-process collectives use gloo).
`Partitioner.local_batch_rows()` says which rows of each global batch this process's devices hold
(its data shard), and `Partitioner.make_global_batch()` assembles the globally sharded batch from
the per-process numpy rows with `jax.make_array_from_process_local_data`. Because the rows follow
the mesh, a global batch holds the same examples in the same order however many processes feed
it: 2 processes x 2 devices train exactly like 1 process x 4 devices.

CPU hosts: `set_host_device_count` splits the CPU into XLA host devices, `set_xla_cpu_flags` adds
the XLA CPU compiler flags for training, and `set_host_malloc_options` keeps freed host memory for
reuse; the training main calls all three.

Nothing here imports TensorFlow or SeqIO.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
from typing import Any, Callable, Mapping, Optional, Sequence

import flax.linen as nn
import jax
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import numpy as np

PyTree = Any
LogicalAxisRules = Sequence[tuple[str, Optional[str | tuple[str, ...]]]]

DATA_AXIS = "data"
MODEL_AXIS = "model"


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


def initialize_distributed(coordinator_address: Optional[str] = None,
                           num_processes: Optional[int] = None,
                           process_id: Optional[int] = None,
                           initialization_timeout: Optional[int] = None) -> bool:
  """Calls `jax.distributed.initialize` for multi-process runs (no-op when nothing is configured).

  Must run before anything touches a device (the mains call it right after parsing the flags).
  On CPU, cross-process collectives need a CPU collectives implementation: it is set to gloo when
  the installed JAX has none selected (JAX >= 0.5 selects gloo by default).

  Args:
    coordinator_address: "host:port" of process 0 (every process passes the same); None = single
      process. "auto": let JAX detect the cluster (Cloud TPU, SLURM, Open MPI, ...).
    num_processes: total number of processes (None: detected by JAX).
    process_id: this process's index in [0, num_processes) (None: detected by JAX).
    initialization_timeout: seconds to wait for all processes to connect (None: JAX's default).

  Returns:
    True if `jax.distributed.initialize` was called.

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
      help="seconds to wait for every process to connect (JAX's default if unset)")


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
                               "initialization_timeout") if getattr(args, name, None) is not None
  ]
  if not getattr(args, "multiprocess_gpu", False):
    if given:
      raise ValueError(f"{', '.join(given)} given without --multiprocess_gpu; add "
                       "--multiprocess_gpu to initialise the processes (as in T5X)")
    return None
  logging.info(
      "initialising the distributed system: coordinator_address=%s process_count=%s "
      "process_index=%s", args.coordinator_address, args.process_count, args.process_index)
  return initialize_distributed(args.coordinator_address or "auto", args.process_count,
                                args.process_index, args.initialization_timeout)


def set_host_device_count(count: Optional[int] = None) -> bool:
  """Splits the CPU into `count` XLA host devices (`--xla_force_host_platform_device_count`).

  On a CPU-only machine several host devices run the data-parallel shards of a step in parallel,
  which uses the cores better than one device for small models (measured ~1.7x on 2 cores with the
  tiny model). Must run before JAX initialises its backends (the mains call it right after
  parsing gin, through `gin_utils.call_configured`); it does nothing if XLA_FLAGS already sets
  the flag, and it does not affect accelerators.

  Returns:
    True if XLA_FLAGS was changed.
  """
  if not count:
    return False
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" in flags:
    return False
  os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={int(count)}".strip()
  return True


# XLA CPU settings for training (measured on 2 AMD EPYC cores, jaxlib 0.10.2, the benchmark model of
# `scripts/benchmark_vs_hf.py`; the measurements are in CHANGELOG.md). The matmuls and reductions
# run as YNNPACK fusions; the elementwise ops stay with XLA's own loop fusions (YNN's elementwise
# fusions materialise broadcast constants as full tensors and split the gated-GELU chain into
# several passes). Logits stay within the transformers-parity tolerances.
XLA_CPU_TRAINING_FLAGS = (
    "--xla_cpu_experimental_ynn_fusion_type=dot,reduce",
    "--xla_cpu_use_xnnpack=false",
)


def set_xla_cpu_flags(flags: Sequence[str] = XLA_CPU_TRAINING_FLAGS) -> list[str]:
  """Adds XLA CPU compiler flags to XLA_FLAGS, each unless XLA_FLAGS already names it.

  Must run before JAX initialises its backends (as `set_host_device_count`); accelerators ignore
  these flags. The training main calls it; set a flag in XLA_FLAGS yourself to override it.

  Args:
    flags: "--name=value" strings (default `XLA_CPU_TRAINING_FLAGS`).

  Returns:
    The flags added.
  """
  current = os.environ.get("XLA_FLAGS", "")
  added = [f for f in flags if f.split("=")[0] not in current]
  if added:
    os.environ["XLA_FLAGS"] = " ".join([current] + added).strip()
  return added


# glibc `mallopt` parameters (<malloc.h>).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


def set_host_malloc_options() -> bool:
  """Keeps freed host memory in the process for reuse (glibc `mallopt`), for CPU training.

  The XLA CPU runtime allocates a step's temporary buffers with `malloc` and frees them after the
  step. By default glibc gives such large blocks back to the kernel (fresh `mmap`s, and the
  per-thread arenas of XLA's worker threads shrink), so every step touches new pages: about
  160,000 minor page faults (about 630 MiB) and 0.44 s of system time per 1.3 s step of the
  benchmark model of `scripts/benchmark_vs_hf.py` (2 cores, packed rows of 40/72, 2 devices).
  With one arena (`M_ARENA_MAX=1`), no `mmap` for large blocks (`M_MMAP_MAX=0`) and the heap
  trimmed only above 2 GiB of free memory at its top (`M_TRIM_THRESHOLD`), the same step had no
  page faults and no system time and took 1.06-1.11 s. Peak RSS is the same high-water mark;
  memory freed below it stays with the process instead of going back to the kernel.

  Call it once at the start of a CPU training process (the training main does, after JAX has
  chosen its backend, only when that backend is the CPU); it affects later allocations only.

  Returns:
    True if the options were set; False where the C library is not glibc (macOS, musl) or
    refused an option, in which case nothing else changes.
  """
  try:
    import ctypes
    libc = ctypes.CDLL("libc.so.6")
    mallopt = libc.mallopt
  except (OSError, AttributeError):
    return False
  ok = True
  for param, value in ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1)):
    ok = bool(mallopt(param, value)) and ok
  return ok


# XLA CPU flags and host malloc options of the decoding mains (eval, infer; `mcwq_t5x.eval.main`,
# `mcwq_t5x.infer.main` call `set_inference_cpu_options`). None so far: with the training flags
# (`XLA_CPU_TRAINING_FLAGS`) greedy decoding of 640 questions by the `tiny` model (batch 64,
# 2 loaded cores, one run each, interleaved) compiled in 21 s instead of 13-15 s and decoded in
# 7.7 s instead of 1.6-1.9 s; the malloc options are not measured for decoding yet.
XLA_CPU_INFERENCE_FLAGS: tuple[str, ...] = ()
INFERENCE_MALLOC_OPTIONS = False


def set_inference_cpu_options() -> list[str]:
  """The decoding mains' CPU settings: `XLA_CPU_INFERENCE_FLAGS` (unless XLA_FLAGS names them)
  and, if `INFERENCE_MALLOC_OPTIONS`, `set_host_malloc_options`.

  Must run before JAX initialises its backends; accelerators ignore the flags.

  Returns:
    The XLA flags added.
  """
  added = set_xla_cpu_flags(XLA_CPU_INFERENCE_FLAGS)
  if INFERENCE_MALLOC_OPTIONS:
    set_host_malloc_options()
  return added


@dataclasses.dataclass(frozen=True)
class DataShardInfo:
  """Which part of the data this process reads (mirrors `seqio.ShardInfo`)."""
  index: int
  num_shards: int


def create_mesh(num_partitions: int = 1, devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
  """Builds a `("data", "model")` mesh over `devices` (default: all devices of all processes).

  Args:
    num_partitions: size of the `model` axis (T5X's `num_partitions`); must divide the device count.
    devices: devices to use; None = `jax.devices()`.

  Returns:
    A `jax.sharding.Mesh` of shape `(num_devices // num_partitions, num_partitions)`.

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

    With one process: all rows. With P processes on a `data` x `model` mesh whose data replicas
    are grouped by process (what `create_mesh` builds): a contiguous block of
    `global_batch_size // P` rows, process 0 first. A process whose devices span several data
    replicas of other processes (an unusual device order) gets a clear error.

    Args:
      global_batch_size: rows of the global batch (all processes together).

    Returns:
      `slice(start, stop)` into the global batch's leading dimension.

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
