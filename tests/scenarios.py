"""Expensive scenarios, each run once per test session and shared by every test that reads it.

Under pytest-xdist (`-n 2`, set in `pytest.ini`) every worker is its own process with its own
session fixtures; `once` makes the first worker that needs a scenario build it in a folder shared
by the session's workers while the others wait on a file lock, then every worker reads the same
folder. Without xdist the folder is the session's own temporary folder. Nothing is shared between
sessions: pytest makes a new base folder for each.

`ReadmeRun` runs the README's commands, as printed (with the appended size overrides of
`readme_commands.py`), in a temporary copy of the repository with `../shared` beside it, each at
most once per session and after the commands whose outputs it reads
(`readme_commands.DEPENDS`), whichever test asks first. `python` and `pip` on the commands' PATH
are the interpreter that runs the tests (see `ReadmeRun.shims`).
"""
from __future__ import annotations

import json
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

import filelock

import mains

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

# One run of our engine that learns, shared by the tests that need a trained MODEL_DIR: 300 steps at
# lr 1e-2 of the very small network (tests/mains.py SMALL_MODEL) on the 155 Hebrew gold questions
# (train = test: long enough to learn them; 37.5% exact match on the first 32, BLEU 67, on a 2-core
# machine), periodic evaluations at steps 150 and 300, the final evaluation on 32 questions.
OUR_RUN_STEPS = 300
OUR_RUN = [
    "TASK_FEATURE_LENGTHS = {'inputs': 40, 'targets': 128}", "BATCH_SIZE = 8",
    "LOG_EVERY_STEPS = 50", "CHECKPOINT_PERIOD = 100", "EVAL_PERIOD = 150", "EVAL_STEPS = None",
    "INFER_EVAL_NUM_EXAMPLES = 8", "INFER_BATCH_SIZE = 6", "FINAL_EVAL_NUM_EXAMPLES = 32",
    "WARMUP_STEPS = 20", "LEARNING_RATE = 1e-2", "HOST_DEVICE_COUNT = 2",
    f"TRAIN_STEPS = {OUR_RUN_STEPS}", "MIXTURE_OR_TASK_NAME = 'mcwq_gold_he'",
    "TRAIN_SPLIT = 'test'", "EVAL_SPLIT = 'test'", "FINAL_EVAL_SPLIT = 'test'"
]


def session_root(tmp_path_factory) -> pathlib.Path:
  """The folder shared by the session's xdist workers (the session's base folder without xdist)."""
  base = tmp_path_factory.getbasetemp()
  return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(tmp_path_factory, name: str, build: Callable[[pathlib.Path],
                                                      Any]) -> tuple[pathlib.Path, Any]:
  """Runs `build(folder)` once per session for `name` (across xdist workers) and returns
  `(folder, result)`; `result` must be JSON-serialisable (it is stored beside the folder).

  A build that raised is not recorded: the next caller builds again (and fails the same way)."""
  folder = session_root(tmp_path_factory) / f"scenario_{name}"
  with filelock.FileLock(str(folder) + ".lock"):
    done = folder.with_name(folder.name + ".result.json")  # beside the folder: nothing added in it
    if not done.exists():
      shutil.rmtree(folder, ignore_errors=True)
      folder.mkdir(parents=True)
      result = build(folder)
      done.write_text(json.dumps(result))
    return folder, json.loads(done.read_text())


def copy_repository(dest: pathlib.Path) -> pathlib.Path:
  """A copy of the repository's working tree at `dest/repo` (no `.git`, no `runs/`, no caches) with
  `dest/shared` linking to the real `../shared`, so commands that name `../shared/...` work."""
  anywhere = shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", ".pytest_cache", "*.pyc")
  # A user's outputs (not gin/.../runs/) and CI's virtualenv.
  top_level = {"runs", "build", "dist", ".cache", "tmp", ".venv"}

  def ignore(folder, names):
    skipped = set(anywhere(folder, names))
    if pathlib.Path(folder) == REPO:
      skipped |= top_level & set(names)
    return skipped

  repo = dest / "repo"
  shutil.copytree(REPO, repo, ignore=ignore)
  (dest / "shared").symlink_to(SHARED, target_is_directory=True)
  return repo


_PYTHON_SHIM = """#!/bin/sh
exec {python} "$@"
"""

_PIP_SHIM = """#!/bin/sh
# The README's `pip install -e .` in a throwaway copy of the repository: installing the copy would
# point the user's environment at a folder the tests delete. The tests' interpreter already has the
# project installed (the README's test command installs it; CI runs that command verbatim), and
# `python -m` imports the copy's own modules from the current folder.
if [ "$*" = "install -e ." ]; then echo "pip shim: $* (already installed)"; exit 0; fi
echo "pip shim: unexpected pip command: $*" >&2
exit 2
"""


class ReadmeRun:
  """The README's commands, each run at most once per session, in one temporary copy of the
  repository, after the commands whose outputs it reads (`depends`).

  Each command has its own lock and result file, so that commands of independent chains (the main
  job, the T5X runs, the new-language flow...) run on different xdist workers at the same time
  while a command that reads another's outputs waits for it (or runs it first). No lock is held
  while a dependency runs, so no two workers wait on each other.

  Attributes:
    folder: the scenario folder (`repo/`, `shared/`, `bin/`, `result_<i>.json`).
    repo: the copy the commands run in (their current folder).
  """

  def __init__(self,
               tmp_path_factory,
               commands: Sequence[str],
               env_of: Callable[[int], dict],
               with_overrides: Callable[[str, pathlib.Path], str],
               depends: Callable[[int], Sequence[int]],
               same_as: Callable[[int], int] = lambda index: index):
    self.commands = list(commands)
    self._env_of = env_of
    self._with_overrides = with_overrides
    self._depends = depends
    self._same_as = same_as
    self.folder = session_root(tmp_path_factory) / "scenario_readme"
    self.repo = self.folder / "repo"
    with filelock.FileLock(str(self.folder) + ".lock"):
      if not (self.folder / "ready").exists():
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        copy_repository(self.folder)
        self.shims()
        (self.folder / "ready").touch()

  def shims(self) -> pathlib.Path:
    """`bin/python` (the tests' interpreter) and `bin/pip` (see `_PIP_SHIM`), first on PATH."""
    bin_dir = self.folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    # A script, not a symlink: a virtualenv's interpreter finds its environment (`pyvenv.cfg`)
    # from the path it was started by, so a link to it elsewhere would start the base Python
    # without the environment's packages.
    (bin_dir / "python").write_text(_PYTHON_SHIM.format(python=shlex.quote(sys.executable)))
    (bin_dir / "python").chmod(0o755)
    (bin_dir / "pip").write_text(_PIP_SHIM)
    (bin_dir / "pip").chmod(0o755)
    return bin_dir

  def shell(self, command: str, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs `command` with bash in the copy, in the environment of the README's commands: the
    tests' environment variables (less the session's fake devices and xdist's worker name) plus
    `extra_env`, `bin/` first on PATH."""
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the test session's 8 fake devices are not the user's set-up
    env.pop("PYTEST_XDIST_WORKER", None)
    env.update(extra_env or {})
    env["PATH"] = f"{self.folder / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    for name, value in mains.CHILD_ENV.items():
      env.setdefault(name, value)
    return subprocess.run(["bash", "-c", command],
                          cwd=self.repo,
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=1500)

  def result(self, index: int) -> dict:
    """Runs command `index` (after its dependencies) unless it has run, and returns its
    `{"command", "returncode", "stdout", "stderr", "seconds"}` (`returncode` None: not run, an
    `export` line or the test command). A command repeated on another page (`same_as`) is not run
    again: its result is the first one's."""
    if self._same_as(index) != index:
      return self.result(self._same_as(index))
    for dependency in self._depends(index):
      done = self.result(dependency)
      assert done["returncode"] == 0, (f"command {index} reads the outputs of command "
                                       f"{dependency}, which failed:\n" + str(check_message(done)))
    with filelock.FileLock(str(self.folder / f"command_{index}.lock")):
      path = self.folder / f"result_{index}.json"
      if not path.exists():
        path.write_text(json.dumps(self._run(index)))
      return json.loads(path.read_text())

  def _run(self, index: int) -> dict:
    command = self.commands[index]
    if command.startswith("export ") or command.startswith("pip install -e \".[test]\""):
      return {"command": command, "returncode": None, "stdout": "", "stderr": "", "seconds": 0.0}
    full = self._with_overrides(command, self.repo)
    start = time.monotonic()
    out = self.shell(full, self._env_of(index))
    return {
        "command": full,
        "returncode": out.returncode,
        "stdout": out.stdout,
        "stderr": out.stderr,
        "seconds": round(time.monotonic() - start, 1)
    }


def check_message(result: dict) -> str:
  return (
      f"{result['command']}\nexited {result['returncode']}\nstdout: {result['stdout'][-3000:]}\n"
      f"stderr: {result['stderr'][-6000:]}")


def check(result: dict) -> dict:
  """Asserts that a `ReadmeRun.result` exited 0 (with the end of its output) and returns it."""
  assert result["returncode"] == 0, check_message(result)
  return result
