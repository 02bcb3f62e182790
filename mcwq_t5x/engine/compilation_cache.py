"""JAX's persistent compilation cache for the mains: a program compiled once is loaded next time.

`use_persistent_cache` (called by the train, eval and infer mains before they compile anything)
points JAX's cache (`jax_compilation_cache_dir`) at `$XDG_CACHE_HOME/mcwq_t5x/jax` (default
`~/.cache/mcwq_t5x/jax`), so that a second run of the same job with the same shapes, XLA flags and
devices loads its training step and decoders instead of compiling them. JAX keys an entry by the
program, the compiler options, the devices and the JAX/XLA versions.

Opt out with `MCWQ_T5X_COMPILATION_CACHE=off`; point it elsewhere with
`MCWQ_T5X_COMPILATION_CACHE=/a/folder`; a cache already set through JAX's own
`JAX_COMPILATION_CACHE_DIR` (or `jax.config`) is left as it is. JAX's other settings apply: an
entry is written only for programs that took at least `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`
(default 1 s) to compile.

Two processes sharing the folder: JAX's `LRUCache.put` writes an entry with `Path.write_bytes`
in place, not through a temporary file and a rename, so a reader could see half an entry; JAX
only serialises its reads and writes with a file lock (`filelock`, `<cache>/.lockfile`) when a
maximum size is set. `use_persistent_cache` therefore sets `jax_compilation_cache_max_size`
(`DEFAULT_MAX_SIZE_BYTES`, least recently used entries evicted beyond it) unless it is set.
"""
from __future__ import annotations

import os
import pathlib
from typing import Optional

import jax

ENV_VAR = "MCWQ_T5X_COMPILATION_CACHE"
OFF_VALUES = ("0", "off", "false", "no", "none")
# why: a size limit is what makes JAX lock the folder (module docstring); 16 GiB holds a few
# hundred mT5-small/base programs.
DEFAULT_MAX_SIZE_BYTES = 16 << 30


def default_cache_dir() -> pathlib.Path:
  """`$XDG_CACHE_HOME/mcwq_t5x/jax`, or `~/.cache/mcwq_t5x/jax` where XDG_CACHE_HOME is unset."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "mcwq_t5x" / "jax"


def use_persistent_cache() -> Optional[str]:
  """Turns on JAX's persistent compilation cache (module docstring) unless opted out.

  Must run before the process compiles its first program (JAX reads the setting once, at the
  first compilation). A folder that cannot be created turns the cache off with a warning from JAX,
  never an error.

  Returns:
    The cache folder in use, or None when the cache is off (`MCWQ_T5X_COMPILATION_CACHE=off`, or
    JAX's `jax_enable_compilation_cache` false).
  """
  choice = os.environ.get(ENV_VAR, "").strip()
  if choice.lower() in OFF_VALUES or not jax.config.jax_enable_compilation_cache:
    return None
  path = jax.config.jax_compilation_cache_dir  # why: JAX_COMPILATION_CACHE_DIR set by the user wins
  if not path:
    path = str(pathlib.Path(choice).expanduser() if choice else default_cache_dir())
    jax.config.update("jax_compilation_cache_dir", path)
  if jax.config.jax_compilation_cache_max_size == -1:  # why: -1 (no limit) means no file lock
    jax.config.update("jax_compilation_cache_max_size", DEFAULT_MAX_SIZE_BYTES)
  return path
