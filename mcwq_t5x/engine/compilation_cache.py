"""JAX's persistent compilation cache for the mains: a program compiled once is loaded next time.

`use_persistent_cache` (train, eval and infer call it before compiling) points
`jax_compilation_cache_dir` at `$XDG_CACHE_HOME/mcwq_t5x/jax` (default `~/.cache/mcwq_t5x/jax`);
JAX keys an entry by program, compiler options, devices and JAX/XLA versions, and writes only
programs that took `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` (1 s) to compile.
`MCWQ_T5X_COMPILATION_CACHE=off` opts out, `=/a/folder` moves it; a cache set through JAX's own
`JAX_COMPILATION_CACHE_DIR` is left as it is.

Beyond JAX, in a local folder: an entry that cannot be loaded (truncated, corrupt) is replaced by
the program compiled in its stead, with one warning (JAX keeps the bad entry, and every run would
warn again); a folder that cannot be written (a read-only mount, another user's `.lockfile`) is
still read, without JAX's lock (it could not be taken: every entry would be unusable), and nothing
is added to it (one log line says so); a folder that cannot be created turns the cache off (one
warning says so).
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import pathlib
import tempfile
import time
from typing import Any, Optional

import jax

ENV_VAR = "MCWQ_T5X_COMPILATION_CACHE"
OFF_VALUES = ("0", "off", "false", "no", "none")
# why: a size limit is what makes JAX lock the folder (`use_persistent_cache`); 16 GiB holds a few
# hundred mT5-small/base programs.
DEFAULT_MAX_SIZE_BYTES = 16 << 30
#: JAX's file names in the cache folder (`jax._src.lru_cache`): the lock, `<key>-cache` entries and
#: their `<key>-atime` last-use times (8 bytes, little-endian nanoseconds).
LOCK_FILE = ".lockfile"
ENTRY_SUFFIX = "-cache"
ATIME_SUFFIX = "-atime"


def default_cache_dir() -> pathlib.Path:
  """`$XDG_CACHE_HOME/mcwq_t5x/jax`, or `~/.cache/mcwq_t5x/jax` where XDG_CACHE_HOME is unset."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "mcwq_t5x" / "jax"


def turned_off() -> bool:
  """Whether the user opted out: `MCWQ_T5X_COMPILATION_CACHE` is one of `OFF_VALUES`."""
  return os.environ.get(ENV_VAR, "").strip().lower() in OFF_VALUES


def use_persistent_cache() -> Optional[str]:
  """The cache folder in use, or None when off; must run before the first compilation (JAX reads the
  setting once). A folder that cannot be created turns the cache off, one that cannot be written is
  read only (module docstring); each logs one line."""
  choice = os.environ.get(ENV_VAR, "").strip()
  if turned_off() or not jax.config.jax_enable_compilation_cache:
    return None
  path = jax.config.jax_compilation_cache_dir  # why: JAX_COMPILATION_CACHE_DIR set by the user wins
  if not path:
    path = str(pathlib.Path(choice).expanduser() if choice else default_cache_dir())
    jax.config.update("jax_compilation_cache_dir", path)
  if "://" in path:  # why: a remote store (JAX's epath) is JAX's alone
    unwritable = None
  else:
    unwritable = _why_unwritable(pathlib.Path(path))
  if unwritable is not None and not pathlib.Path(path).is_dir():
    logging.warning("compilation cache off: cannot create %s (%s); every program is compiled", path,
                    unwritable)
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  if unwritable is not None:
    logging.info(
        "compilation cache %s is read-only (%s): its programs are loaded, new ones are "
        "not saved", path, unwritable)
    jax.config.update("jax_compilation_cache_max_size", -1)  # why: -1, no size limit: no file lock
    # why: JAX writes only programs that took this long to compile: none
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
    return path
  # `LRUCache.put` writes an entry in place, and JAX locks (`<cache>/.lockfile`) only with a maximum
  # size: a second process could read half an entry.
  if jax.config.jax_compilation_cache_max_size == -1:  # why: -1 (no limit) means no file lock
    jax.config.update("jax_compilation_cache_max_size", DEFAULT_MAX_SIZE_BYTES)
  if "://" not in path:
    _repair_unloadable_entries()
  return path


def _why_unwritable(folder: pathlib.Path) -> Optional[str]:
  """None if `folder` can be created and its `.lockfile` (JAX's file lock) opened for writing, else
  the reason (e.g. "Read-only file system (EROFS)")."""
  try:
    folder.mkdir(parents=True, exist_ok=True)
    os.close(os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644))  # as `filelock` opens it
  except OSError as e:
    name = errno.errorcode.get(e.errno or 0, "")
    return f"{e.strerror or e}{f' ({name})' if name else ''}"
  return None


class _RepairingCache:
  """JAX's cache object (`jax._src.compilation_cache.CacheInterface`: `get`, `put`, `_path`) around
  JAX's `LRUCache`, replacing the entries JAX read but could not load.

  JAX reads an entry before compiling a program and writes one only after compiling it; an entry
  that was read yet whose program is compiled and written again could not be loaded (JAX warned),
  and `LRUCache.put` keeps an existing entry. `put` replaces such an entry (a temporary file moved
  into place, under JAX's lock) and logs one warning naming it; other writes are JAX's.
  """

  def __init__(self, base: Any):
    self._base = base
    self._read: set[str] = set()  # keys whose entry `get` returned

  @property
  def _path(self) -> Any:
    return self._base._path  # pylint: disable=protected-access

  @_path.setter
  def _path(self, value: Any) -> None:
    self._base._path = value  # pylint: disable=protected-access

  def get(self, key: str) -> Optional[bytes]:
    value = self._base.get(key)
    if value is not None:
      self._read.add(key)
    return value

  def put(self, key: str, value: bytes) -> None:
    if key not in self._read or not getattr(self._base, "eviction_enabled", False):
      self._base.put(key, value)
      return
    self._read.discard(key)
    folder = pathlib.Path(str(self._base.path))
    entry = folder / f"{key}{ENTRY_SUFFIX}"
    with self._base.lock.acquire(timeout=self._base.lock_timeout_secs):
      fd, tmp = tempfile.mkstemp(prefix=f".{entry.name}.tmp-", dir=folder)
      try:
        with os.fdopen(fd, "wb") as f:
          f.write(value)
        os.replace(tmp, entry)  # why: a reader without the lock sees the old entry or the new one
      except BaseException:
        with contextlib.suppress(OSError):
          os.unlink(tmp)
        raise
      (folder / f"{key}{ATIME_SUFFIX}").write_bytes(time.time_ns().to_bytes(8, "little"))
    logging.warning(
        "compilation cache: replaced the entry %s, which could not be loaded, by the program "
        "compiled in its stead", entry)


def _repair_unloadable_entries() -> None:
  """Makes JAX's cache (created at the first compilation) a `_RepairingCache` around its own.

  Uses JAX's private `jax._src.compilation_cache.get_file_cache`; without it (another JAX) the
  cache is JAX's alone."""
  try:
    from jax._src import compilation_cache as jax_cache  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  original = getattr(jax_cache, "get_file_cache", None)
  if original is None or getattr(original, "repairing", False):
    return

  def get_file_cache(path: str):
    made = original(path)
    return None if made is None else (_RepairingCache(made[0]), made[1])

  get_file_cache.repairing = True
  jax_cache.get_file_cache = get_file_cache
