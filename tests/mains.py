"""Helpers to run the mains the way users do: in a fresh process (`python -m ...`), or, for quick
checks of configuration errors, through gin in this process with the main standing in for
`__main__` (as under `python -m`)."""
import contextlib
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import sysconfig
import time
from typing import Optional, Sequence

import gin

from mcwq_t5x import gin_utils

REPO = pathlib.Path(__file__).resolve().parents[1]
# A very small tiny-model shape for tests (the preset is 2+2 layers of width 64).
SMALL_MODEL = [
    "network.get_config.emb_dim = 32", "network.get_config.num_heads = 2",
    "network.get_config.head_dim = 16", "network.get_config.mlp_dim = 64",
    "network.get_config.num_encoder_layers = 1", "network.get_config.num_decoder_layers = 1"
]
# For every command the tests start: JAX's persistent compilation cache (tests/conftest.py) also
# keeps programs that compile in under a second (JAX's default keeps only slower ones), so that a
# command's small programs (initialisation, evaluation steps, the decoder of a tiny model) are
# loaded from the cache by the next command that builds them. Not for the tests' own processes,
# where writing every small program costs more than it saves. (XLA's
# `--xla_backend_optimization_level=0` is not set for them: it makes the tests' T5X training runs
# cheaper but their decoding and our 300-step `conftest.our_run` dearer.)
CHILD_ENV = {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}


def console_script(name: str) -> str:
  """The path of an installed command (e.g. `oxigraph`) of the environment that runs the tests:
  its scripts folder, whether or not the environment is activated (on PATH).

  Raises:
    AssertionError: the command is not installed there (every one the tests use is pinned in
      requirements-test.txt).
  """
  path = pathlib.Path(sysconfig.get_path("scripts")) / name
  assert path.exists(), (f"{path} is missing: install the test requirements into this "
                         "environment (README, Tests)")
  return str(path)


def child_env(env: Optional[dict] = None) -> dict:
  """The environment of a command the tests start: the tests' own, less the session's fake
  devices, plus `CHILD_ENV` and `env`."""
  full_env = dict(os.environ)
  full_env.pop("XLA_FLAGS", None)  # the test session's 8 fake devices are not the user's set-up
  for name, value in CHILD_ENV.items():
    full_env.setdefault(name, value)
  full_env.update(env or {})
  return full_env


def without_packages(folder: pathlib.Path, *names: str) -> dict:
  """`env` for a command that must run where the packages `names` are not installed (the GPU
  image has no TensorFlow or SeqIO): a stand-in package of each name under `folder`, first on
  PYTHONPATH, whose import raises ImportError."""
  for name in names:
    (folder / name).mkdir(parents=True, exist_ok=True)
    (folder / name / "__init__.py").write_text(f"raise ImportError('{name} is not installed')\n")
  path = child_env().get("PYTHONPATH", "")
  return {"PYTHONPATH": os.pathsep.join([str(folder)] + ([path] if path else []))}


def run(args: Sequence[str],
        *,
        env: Optional[dict] = None,
        input: Optional[str] = None,
        check: bool = True,
        timeout: int = 900,
        cwd: pathlib.Path = REPO,
        unset: Sequence[str] = ()) -> subprocess.CompletedProcess:
  """Runs `args` (e.g. [sys.executable, "-m", "mcwq_t5x.train", ...]) in a fresh process, with the
  tests' environment plus `env`, less the variables named in `unset`.

  Raises:
    AssertionError: `check` and a non-zero exit status (with the end of stdout and stderr).
  """
  full_env = child_env(env)
  for name in unset:
    full_env.pop(name, None)
  out = subprocess.run(
      list(args),
      cwd=cwd,
      env=full_env,
      input=input,
      capture_output=True,
      text=True,
      timeout=timeout)
  if check:
    assert out.returncode == 0, (f"{' '.join(map(str, args))} exited {out.returncode}\n"
                                 f"stdout: {out.stdout[-3000:]}\nstderr: {out.stderr[-6000:]}")
  return out


def start(args: Sequence[str],
          log: pathlib.Path,
          *,
          env: Optional[dict] = None,
          cwd: pathlib.Path = REPO) -> subprocess.Popen:
  """Starts `args` in a fresh process (environment as `run`) without waiting for it; its stdout
  and stderr go to the file `log` (`wait_for_line` reads it)."""
  with open(log, "w") as f:
    return subprocess.Popen(
        list(args), cwd=cwd, env=child_env(env), stdout=f, stderr=subprocess.STDOUT, text=True)


def wait_for_line(log: pathlib.Path,
                  pattern: str,
                  process: subprocess.Popen,
                  timeout: int = 900) -> re.Match:
  """Waits until a line of the file `log` matches the regular expression `pattern` (`re.search`).

  Raises:
    AssertionError: `process` ended first, or `timeout` seconds passed (with the end of the log).
  """
  deadline = time.monotonic() + timeout
  while True:
    text = pathlib.Path(log).read_text(errors="replace")
    match = re.search(pattern, text, re.M)
    if match:
      return match
    assert process.poll() is None, f"exited {process.returncode} first:\n{text[-3000:]}"
    assert time.monotonic() < deadline, f"no line matches {pattern!r}:\n{text[-3000:]}"
    time.sleep(0.2)


def python_m(module: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
  """`python -m module args...` in a fresh process (see `run`)."""
  return run([sys.executable, "-m", module, *args], **kwargs)


_NAMESPACES = (["unshare", "--mount", "--propagation", "private", "--"], [
    "unshare", "--user", "--map-root-user", "--mount", "--propagation", "private", "--"
])


def in_a_mount_namespace(setup: str, after: str = ":") -> Optional[list[str]]:
  """The start of a command line `[*prefix, *command]` that runs, in a private mount namespace (its
  mounts are seen by it alone and end with it: nothing to clean up), the shell commands `setup`
  (e.g. mounting a small tmpfs: a disk that fills up for real), then `command`, then `after` (e.g.
  copying results out); the exit status is the command's. None where no such namespace can be
  made or `setup` fails in it (not root and no user namespaces, no `unshare`): the caller then
  skips, or injects the failure instead."""
  script = f'{setup} || exit 99; "$@"; status=$?; {after}; exit $status'
  for namespace in _NAMESPACES:
    try:
      probe = subprocess.run([*namespace, "sh", "-c", setup], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
      continue
    if probe.returncode == 0:
      return [*namespace, "sh", "-c", script, "sh"]
  return None


def load_script(name: str):
  """`scripts/<name>.py` imported as a module (the scripts folder is not a package), for in-process
  checks of its functions."""
  spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module  # why: dataclasses read their module's namespace while it loads
  spec.loader.exec_module(module)
  return module


def train_losses(model_dir) -> dict[int, float]:
  """{step: training loss} of the rows of `model_dir/train_metrics.jsonl` (what `mcwq_t5x.train`
  writes every LOG_EVERY_STEPS steps)."""
  lines = (pathlib.Path(model_dir) / "train_metrics.jsonl").read_text().splitlines()
  return {r["step"]: r["loss"] for r in map(json.loads, lines)}


def gin_flags(bindings: Sequence[str]) -> list[str]:
  """Bindings as T5X-style `--gin_bindings=...` flags."""
  return [f"--gin_bindings={b}" for b in bindings]


@contextlib.contextmanager
def as_main(module):
  """Lets `module` stand in for `__main__` (what `python -m module` does), for gin files that
  `import __main__ as train_script`."""
  saved = sys.modules["__main__"]
  sys.modules["__main__"] = module
  try:
    yield
  finally:
    sys.modules["__main__"] = saved


def configured(module, fn_name: str, files: Sequence[str], bindings: Sequence[str] = ()):
  """Parses our engine's `files` + `bindings` and returns `module.fn_name` with its bindings (the
  in-process equivalent of `python -m module --gin_file=...`)."""
  gin.clear_config()
  gin_utils.parse_gin(files, bindings)
  return gin.get_configurable(getattr(module, fn_name))
