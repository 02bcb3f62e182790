"""One training at a time per MODEL_DIR, one eval per EVAL_OUTPUT_DIR: an exclusive lock on
`MODEL_DIR/train.lock` (`EVAL_OUTPUT_DIR/eval.lock`).

Two trainings writing one MODEL_DIR corrupt each other without an error (each other's
checkpoints, temporary folders and `train_metrics.jsonl` rows); two evals interleave predictions.
`hold` takes an `fcntl.flock` for the whole run and writes the holder's pid, host, start time and
command into the file; a second run is refused with `ModelDirInUseError` /
`EvalOutputDirInUseError` naming the folder and that holder. In a multi-process run process 0
holds it for all.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import pathlib
import shlex
import socket
import sys
import time
from typing import Any, Iterator, Optional

import jax
import numpy as np

from mcwq_t5x.checkpointing import run_folder

#: The lock file in MODEL_DIR.
LOCK_FILE = run_folder.LOCK_FILE
#: The lock file in EVAL_OUTPUT_DIR.
EVAL_LOCK_FILE = run_folder.EVAL_LOCK_FILE


class FolderInUseError(RuntimeError):
  """Another process holds the folder's lock; the message names the folder and the holder."""


class ModelDirInUseError(FolderInUseError):
  """Another training holds MODEL_DIR; the message names the folder and the holding process."""


class EvalOutputDirInUseError(FolderInUseError):
  """Another eval holds EVAL_OUTPUT_DIR; the message names the folder and the holding process."""


# lock file -> (the folder's name, the run, what two runs overwrite, the error)
_KINDS = {
    LOCK_FILE: ("MODEL_DIR", "training", "checkpoints and metrics", ModelDirInUseError),
    EVAL_LOCK_FILE: ("EVAL_OUTPUT_DIR", "eval", "predictions and metrics", EvalOutputDirInUseError),
}


def command_line() -> str:
  """This process's command as typed: `python -m <module> ARGS` for a module run with `-m`, else
  `python SCRIPT ARGS` (arguments quoted for a POSIX shell)."""
  spec = getattr(sys.modules.get("__main__"), "__spec__", None)
  head = ["python", "-m", spec.name] if getattr(spec, "name", None) else ["python", sys.argv[0]]
  return " ".join(shlex.quote(a) for a in head + sys.argv[1:])


def _holder_description(path: pathlib.Path, attempts: int = 20) -> str:
  """What the lock file says about its holder ("process 123 on host h, started ..., command
  ...")."""
  for _ in range(attempts):
    try:
      info = json.loads(path.read_text() or "null")
    except (OSError, ValueError):
      info = None
    if isinstance(info, dict):
      return (f"process {info.get('pid')} on host {info.get('host')}, started "
              f"{info.get('started')} ({info.get('command')})")
    # The holder writes its details just after taking the lock: read an empty file again.
    time.sleep(0.1)
  return "a process that has not written its details into the lock file"


def _message(folder: pathlib.Path, holder: str, lock_file: str = LOCK_FILE) -> str:
  name, run, what, _ = _KINDS[lock_file]
  return (f"{name} {folder} is in use by another {run}: {holder} holds "
          f"{folder / lock_file}. Two {run}s of one {name} overwrite each other's "
          f"{what}: wait for that run to end (or stop it), or give this one another {name}")


def _try_lock(path: pathlib.Path) -> tuple[Optional[int], Optional[str]]:
  """(open file descriptor holding the lock, None), or (None, the holder's description)."""
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    # The OS releases it when the holder ends, however (SIGKILL too): a dead run never leaves the
    # folder locked. Works across processes and, on NFS, hosts.
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    os.close(fd)
    return None, _holder_description(path)
  except BaseException:
    os.close(fd)
    raise
  info = {
      "pid": os.getpid(),
      "host": socket.gethostname(),
      "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "command": command_line(),
  }
  os.ftruncate(fd, 0)
  os.write(fd, (json.dumps(info) + "\n").encode())
  os.fsync(fd)
  return fd, None


@contextlib.contextmanager
def hold(model_dir: str | os.PathLike,
         lock_file: str = LOCK_FILE) -> Iterator[Optional[dict[str, Any]]]:
  """Context manager holding MODEL_DIR's training lock (`lock_file=EVAL_LOCK_FILE`: the eval lock);
  yields the holder's description in process 0, None in the others. Creates the folder.

  Raises ModelDirInUseError / EvalOutputDirInUseError (in every process; names folder and
  holder), OSError (the folder or lock file cannot be created).
  """
  folder = pathlib.Path(model_dir).absolute()
  path = folder / lock_file
  fd, holder = None, None
  if jax.process_index() == 0:
    folder.mkdir(parents=True, exist_ok=True)
    fd, holder = _try_lock(path)
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    # why: every process of a refused run stops with the same error, none waits for a process 0 that
    # stopped.
    got = int(multihost_utils.broadcast_one_to_all(np.int32(fd is not None)))
    if not got and holder is None:  # a process other than 0: the file names the holder
      holder = _holder_description(path)
  if holder is not None:
    raise _KINDS[lock_file][3](_message(folder, holder, lock_file))
  try:
    yield None if fd is None else json.loads(path.read_text())
  finally:
    if fd is not None:
      os.close(fd)  # releases the lock
