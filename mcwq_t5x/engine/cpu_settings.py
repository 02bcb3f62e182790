"""CPU settings of the mains: XLA host devices, XLA CPU compiler flags, glibc `malloc` options.

Process-wide, each made before JAX initialises its backends (the XLA flags) or once at the start
(`malloc`); accelerators ignore them. `set_host_device_count` (every main; gin:
`partitioning.set_host_device_count.count`), `set_xla_cpu_flags` with `XLA_CPU_TRAINING_FLAGS`
(training only: they make greedy decoding slower), `set_host_malloc_options` (CPU training),
`release_free_host_memory` (returns what a one-off phase, the train state's initialisation, freed).
Imports nothing of JAX or of this project: it edits `XLA_FLAGS` and calls the C library.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence


def set_host_device_count(count: Optional[int] = None) -> bool:
  """True if it added `--xla_force_host_platform_device_count=count` to XLA_FLAGS (not if set
  there).

  Several host devices run a step's data-parallel shards in parallel: better core use than one
  device for small models. Must run before JAX initialises its backends.
  """
  if not count:
    return False
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" in flags:
    return False
  os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={int(count)}".strip()
  return True


# XLA CPU settings for training, the fastest on the benchmark model of `scripts/benchmark_vs_hf.py`.
# The matmuls and reductions run as YNNPACK fusions; the
# elementwise ops stay with XLA's own loop fusions (YNN's elementwise fusions materialise
# broadcast constants as full tensors and split the gated-GELU chain into several passes). Logits
# stay within the transformers-parity tolerances.
XLA_CPU_TRAINING_FLAGS = (
    "--xla_cpu_experimental_ynn_fusion_type=dot,reduce",
    "--xla_cpu_use_xnnpack=false",
)


def set_xla_cpu_flags(flags: Sequence[str] = XLA_CPU_TRAINING_FLAGS) -> list[str]:
  """The "--name=value" `flags` added to XLA_FLAGS, each unless XLA_FLAGS names it (set it there to
  override); before JAX initialises its backends."""
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
  """Keeps freed host memory for reuse (glibc `mallopt`): one arena, no `mmap` for large blocks,
  trimmed above 2 GiB free; a one-off phase's frees stay until `release_free_host_memory`. False
  where not glibc or an option is refused."""
  # why: XLA's CPU runtime mallocs and frees a step's buffers; glibc returns large blocks to the
  # kernel, so every step faults in fresh pages (a good part of a CPU step's time).
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


def release_free_host_memory() -> bool:
  """Collects Python's garbage and returns the heap's free pages to the kernel (`malloc_trim(0)`).

  Under `set_host_malloc_options` the heap keeps what the train state's initialisation frees
  (about twice the parameters), in pieces too scattered for a step's buffers: without this it adds
  to the peak RSS (about 2 GiB at mT5-small's shape). False where the C library is not glibc.
  """
  import gc
  gc.collect()  # why: the initialisation's executable is freed with a reference cycle
  try:
    import ctypes
    trim = ctypes.CDLL("libc.so.6").malloc_trim
  except (OSError, AttributeError):
    return False
  trim(0)
  return True
