"""JAX's persistent compilation cache for the mains: a program compiled once is loaded next time.

`use_persistent_cache` (train, eval and infer call it before compiling) points
`jax_compilation_cache_dir` at `$XDG_CACHE_HOME/mcwq_t5x/jax` (default `~/.cache/mcwq_t5x/jax`);
JAX keys an entry by program, compiler options, devices and JAX/XLA versions, and writes only
programs that took `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` (1 s) to compile.
`MCWQ_T5X_COMPILATION_CACHE=off` opts out, `=/a/folder` moves it; a cache set through JAX's own
`JAX_COMPILATION_CACHE_DIR` is left as it is.
"""
from __future__ import annotations

import os
import pathlib
from typing import Optional

import jax

ENV_VAR = "MCWQ_T5X_COMPILATION_CACHE"
OFF_VALUES = ("0", "off", "false", "no", "none")
# why: a size limit is what makes JAX lock the folder (`use_persistent_cache`); 16 GiB holds a few
# hundred mT5-small/base programs.
DEFAULT_MAX_SIZE_BYTES = 16 << 30


def default_cache_dir() -> pathlib.Path:
  """`$XDG_CACHE_HOME/mcwq_t5x/jax`, or `~/.cache/mcwq_t5x/jax` where XDG_CACHE_HOME is unset."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "mcwq_t5x" / "jax"


def turned_off() -> bool:
  """Whether the user opted out: `MCWQ_T5X_COMPILATION_CACHE` is one of `OFF_VALUES`."""
  return os.environ.get(ENV_VAR, "").strip().lower() in OFF_VALUES


def use_persistent_cache() -> Optional[str]:
  """The cache folder in use, or None when off; must run before the first compilation (JAX reads the
  setting once). A folder that cannot be created turns the cache off with JAX's warning."""
  choice = os.environ.get(ENV_VAR, "").strip()
  if turned_off() or not jax.config.jax_enable_compilation_cache:
    return None
  path = jax.config.jax_compilation_cache_dir  # why: JAX_COMPILATION_CACHE_DIR set by the user wins
  if not path:
    path = str(pathlib.Path(choice).expanduser() if choice else default_cache_dir())
    jax.config.update("jax_compilation_cache_dir", path)
  # `LRUCache.put` writes an entry in place, and JAX locks (`<cache>/.lockfile`) only with a maximum
  # size: a second process could read half an entry.
  if jax.config.jax_compilation_cache_max_size == -1:  # why: -1 (no limit) means no file lock
    jax.config.update("jax_compilation_cache_max_size", DEFAULT_MAX_SIZE_BYTES)
  return path
