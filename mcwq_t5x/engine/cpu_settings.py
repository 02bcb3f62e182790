"""CPU settings of the mains: XLA host devices, XLA CPU compiler flags, glibc `malloc` options.

Process-wide settings, each to be made before JAX initialises its backends (the XLA flags) or once
at the start of a process (the `malloc` options); accelerators ignore them:

* `set_host_device_count`: splits the CPU into XLA host devices (every main; gin:
  `partitioning.set_host_device_count.count`, the name the gin files use);
* `set_xla_cpu_flags` with `XLA_CPU_TRAINING_FLAGS`: the XLA CPU compiler flags for training;
* `set_host_malloc_options`: keeps freed host memory for reuse (CPU training);
* `release_free_host_memory`: returns what a one-off phase freed (the train state's
  initialisation) to the kernel, so that it does not add to the steps' peak.

The decoding mains (eval, infer) run with XLA's defaults: the training flags make greedy decoding
slower (CHANGELOG.md has the figures).

Imports nothing of JAX or of this project: it only edits `XLA_FLAGS` and calls the C library.
"""
from __future__ import annotations

import os
from typing import Optional, Sequence


def set_host_device_count(count: Optional[int] = None) -> bool:
  """Splits the CPU into `count` XLA host devices (`--xla_force_host_platform_device_count`).

  On a CPU-only machine several host devices run the data-parallel shards of a step in parallel,
  which uses the cores better than one device for small models. Must run before JAX initialises
  its backends (the mains call it right after parsing gin, through `gin_utils.call_configured`);
  it does nothing if XLA_FLAGS already sets the flag, and it does not affect accelerators.

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


# XLA CPU settings for training, the fastest on the benchmark model of `scripts/benchmark_vs_hf.py`
# (CHANGELOG.md has the figures). The matmuls and reductions run as YNNPACK fusions; the
# elementwise ops stay with XLA's own loop fusions (YNN's elementwise fusions materialise
# broadcast constants as full tensors and split the gated-GELU chain into several passes). Logits
# stay within the transformers-parity tolerances.
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

  One arena (`M_ARENA_MAX=1`), no `mmap` for large blocks (`M_MMAP_MAX=0`), the heap trimmed only
  above 2 GiB free (`M_TRIM_THRESHOLD`); affects later allocations only. What a one-off phase
  frees stays in the process until `release_free_host_memory` gives it back.
  Returns False (nothing changed) where the C library is not glibc or refuses an option.
  """
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

  Under `set_host_malloc_options` the heap keeps freed blocks, and the train state's jitted
  initialisation frees about twice the parameters' size (its executable, collected with Python's
  garbage, and its temporaries) in pieces too scattered for a step's one temporary buffer, which
  then adds to the peak RSS (CHANGELOG.md, issue 56, has the figures). Returns False where the C
  library is not glibc.
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
