"""engine/compilation_cache.py: the mains' persistent compilation cache, in fresh processes."""
import json
import os
import shlex
import sys

import pytest

from tests import mains

# A fresh process: turns the cache on as the mains do, compiles one small program, and prints
# the cache folder and JAX's own counters of persistent-cache hits and misses.
_PROGRAM = """
import json, logging, jax, jax.numpy as jnp
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
from mcwq_t5x.engine import compilation_cache
events = []
jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
path = compilation_cache.use_persistent_cache()
jax.jit(lambda x: jnp.tanh(x) @ x.T + 1.0)(jnp.ones((8, 8))).block_until_ready()
print(json.dumps({"path": path, "max_size": jax.config.jax_compilation_cache_max_size,
                  "hits": events.count("/jax/compilation_cache/cache_hits"),
                  "misses": events.count("/jax/compilation_cache/cache_misses")}))
"""


def _run_process(tmp_path, prefix=(), **env):
  env = {
      "XDG_CACHE_HOME": str(tmp_path / "xdg"),
      "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
      **env
  }
  # why: the tests' own cache (tests/conftest.py) must not stand in for the default folder
  return mains.run(
      [*prefix, sys.executable, "-c", _PROGRAM],
      env=env,
      unset=[] if "JAX_COMPILATION_CACHE_DIR" in env else ["JAX_COMPILATION_CACHE_DIR"])


def _run(tmp_path, **env):
  return json.loads(_run_process(tmp_path, **env).stdout.strip().splitlines()[-1])


def _counts(out):
  result = json.loads(out.stdout.strip().splitlines()[-1])
  return result["hits"], result["misses"]


def test_second_process_loads_what_the_first_compiled(tmp_path):
  folder = tmp_path / "xdg" / "mcwq_t5x" / "jax"
  first = _run(tmp_path)
  assert first["path"] == str(folder)
  assert first["max_size"] > 0  # why: a size limit turns on JAX's file lock
  assert first["hits"] == 0 and first["misses"] >= 1  # why: jnp.ones compiles too
  entries = sorted(p.name for p in folder.glob("*-cache"))
  assert entries, sorted(folder.iterdir())
  second = _run(tmp_path)
  assert (second["hits"], second["misses"]) == (first["misses"], 0)
  assert sorted(p.name for p in folder.glob("*-cache")) == entries


def test_opt_out_and_jax_own_setting_win(tmp_path):
  off = _run(tmp_path, MCWQ_T5X_COMPILATION_CACHE="off")
  assert off["path"] is None and off["hits"] == 0
  assert not (tmp_path / "xdg").exists()
  own = tmp_path / "own"
  mine = _run(tmp_path, JAX_COMPILATION_CACHE_DIR=str(own))
  assert mine["path"] == str(own) and list(own.glob("*-cache"))
  assert not (tmp_path / "xdg").exists()


def _filled(tmp_path):
  """The cache folder `tmp_path/xdg/mcwq_t5x/jax` filled by one process: (folder, its entries, the
  number of programs). In place: JAX's keys depend on the folder's path."""
  first = _run(tmp_path)
  assert first["misses"] >= 1 and first["hits"] == 0
  folder = tmp_path / "xdg" / "mcwq_t5x" / "jax"
  return folder, sorted(folder.glob("*-cache")), first["misses"]


def test_an_entry_that_cannot_be_loaded_is_replaced_once(tmp_path):
  """Entries cut to half their size: the next process compiles their programs, replaces them and
  says so, one line each; the one after loads every program with no warning."""
  folder, entries, programs = _filled(tmp_path)
  for entry in entries:
    entry.write_bytes(entry.read_bytes()[:entry.stat().st_size // 2])
  repairing = _run_process(tmp_path)
  assert _counts(repairing) == (0, programs), repairing.stderr[-3000:]
  replaced = [l for l in repairing.stderr.splitlines() if "compilation cache: replaced" in l]
  assert sorted(replaced) == sorted(
      f"WARNING compilation cache: replaced the entry {e}, which could not be loaded, by the "
      "program compiled in its stead" for e in entries), repairing.stderr[-3000:]
  assert sorted(folder.glob("*-cache")) == entries and not list(folder.glob(".*tmp-*"))
  clean = _run_process(tmp_path)
  assert _counts(clean) == (programs, 0), clean.stderr[-3000:]
  assert "compilation cache" not in clean.stderr and "Error reading" not in clean.stderr


def _read_only(folder):
  """A command prefix under which `folder` is read-only: a read-only bind mount in a mount
  namespace for root (whom permissions do not stop), permissions for anyone else; None where
  neither can be made."""
  if os.geteuid() != 0:
    for path in (folder, *folder.iterdir()):
      path.chmod(path.stat().st_mode & ~0o222)
    return []
  quoted = shlex.quote(str(folder))
  return mains.in_a_mount_namespace(
      f"mount --bind {quoted} {quoted} && mount -o remount,bind,ro {quoted} {quoted}")


def test_a_read_only_cache_is_read(tmp_path):
  """A folder that cannot be written (a read-only mount: no `.lockfile` for JAX's lock) is still
  read: every program loaded, nothing written, one line says so."""
  folder, entries, programs = _filled(tmp_path)
  before = sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir())
  prefix = _read_only(folder)
  if prefix is None:
    pytest.skip("no read-only folder: not root, or no mount namespace (unshare) here")
  out = _run_process(tmp_path, prefix=prefix)
  assert _counts(out) == (programs, 0), out.stderr[-3000:]
  assert f"INFO compilation cache {folder} is read-only (" in out.stderr, out.stderr[-3000:]
  assert "its programs are loaded, new ones are not saved" in out.stderr
  assert "Error reading" not in out.stderr and "Error writing" not in out.stderr
  assert sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir()) == before
