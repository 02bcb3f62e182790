"""engine/compilation_cache.py: the mains' persistent compilation cache, in fresh processes."""
import json
import sys

from tests import mains

# A fresh process: turns the cache on as the mains do, compiles one small program, and prints
# the cache folder and JAX's own counters of persistent-cache hits and misses.
_PROGRAM = """
import json, jax, jax.numpy as jnp
from mcwq_t5x.engine import compilation_cache
events = []
jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
path = compilation_cache.use_persistent_cache()
jax.jit(lambda x: jnp.tanh(x) @ x.T + 1.0)(jnp.ones((8, 8))).block_until_ready()
print(json.dumps({"path": path, "max_size": jax.config.jax_compilation_cache_max_size,
                  "hits": events.count("/jax/compilation_cache/cache_hits"),
                  "misses": events.count("/jax/compilation_cache/cache_misses")}))
"""


def _run(tmp_path, **env):
  env = {
      "XDG_CACHE_HOME": str(tmp_path / "xdg"),
      "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
      **env
  }
  # why: the tests' own cache (tests/conftest.py) must not stand in for the default folder
  out = mains.run([sys.executable, "-c", _PROGRAM],
                  env=env,
                  unset=[] if "JAX_COMPILATION_CACHE_DIR" in env else ["JAX_COMPILATION_CACHE_DIR"])
  return json.loads(out.stdout.strip().splitlines()[-1])


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
