"""The mains' console: logging set-up, a user's error as one last line `"<ErrorType>: <message>"`
(no traceback), and the native libraries' start-up lines kept out of stderr by the filter process
`mcwq_t5x/stderr_filter.py`."""
from __future__ import annotations

import atexit
import logging
import os
import pathlib
import subprocess
import sys

#: The filter process's script, run by path with `-I -S` (no site, nothing of the project).
FILTER_SCRIPT = str(pathlib.Path(__file__).with_name("stderr_filter.py"))


def setup_logging() -> None:
  """Console logging at INFO with timestamps (absl's handler if absl logging is active); the
  native libraries' start-up lines are the business of `quiet_native_logs`."""
  logging.basicConfig(
      level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", force=True)
  for noisy in ("absl", "tensorflow", "jax._src", "orbax"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
  absl_logger = logging.getLogger("absl")
  if not any(isinstance(f, _QuietFilter) for f in absl_logger.filters):
    absl_logger.addFilter(_QuietFilter())


class _QuietFilter(logging.Filter):
  """Drops warnings that say nothing about a run: seqio.Evaluator's "'logger_cls' is empty" (we
  write the metrics ourselves)."""

  def filter(self, record: logging.LogRecord) -> bool:
    return "'logger_cls' is empty" not in str(record.msg)


def original_error(error: BaseException) -> BaseException:
  """The exception itself, or the one gin wrapped (the proxy's `__context__`)."""
  context = error.__context__
  proxy = (
      context is not None and type(context) in type(error).__bases__ and
      type(error).__name__ == type(context).__name__)
  return context if proxy else error


def error_line(error: BaseException, where: str = "") -> str:
  """Every command's error line: `"<ErrorType>: <where><message>"` of `original_error(error)`."""
  error = original_error(error)
  return f"{type(error).__name__}: {where}{error}"


def print_error(error: BaseException, where: str = "") -> None:
  """Prints `error_line(error, where)` to stderr (the command then returns its exit status)."""
  print(error_line(error, where), file=sys.stderr)


def one_line_exit(error: BaseException) -> SystemExit:
  """`SystemExit` (exit status 1) whose message, the last line the command prints, is
  `error_line(error)`; the caller raises it `from error`."""
  return SystemExit(error_line(error))


# Lines that TensorFlow, XLA and tf.text's SentencePiece op write from C++ straight to file
# descriptor 2 (not through Python's logging, so `setup_logging` cannot drop them) and that say
# nothing about a run: absl's notice before its logging is initialised and TensorFlow's start-up
# lines (each of the three twice in a training run, TensorFlow 2.21), and SentencePiece's
# note for every tokenizer op built on a model with identity normalisation (the small offline
# vocabulary: 10 lines in a short training run). TF_CPP_MIN_LOG_LEVEL does not reach the lines
# printed before absl's logging is initialised (TensorFlow 2.21) or SentencePiece's own logging.
NATIVE_NOISE = (
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    r"I\d{4} [\d:.]+ +\d+ port\.cc:\d+\] oneDNN custom operations are on\. .*",
    r"I\d{4} [\d:.]+ +\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine, "
    r"GPU will not be used\.",
    r"normalizer\.cc\(\d+\) LOG\(INFO\) precompiled_charsmap is empty\. use identity "
    r"normalization\.",
)
# On a machine without an NVIDIA driver: TensorFlow's failed CUDA probe, logged as an error.
NO_GPU_NOISE = (r"E\d{4} [\d:.]+ +\d+ cuda_platform\.cc:\d+\] failed call to cuInit: .*",)
TF_LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"


def quiet_native_logs() -> None:
  """Keeps the native libraries' start-up noise out of a command's stderr.

  Called by the mains under `if __name__ == "__main__"`, before TensorFlow is imported. Sets
  `TF_CPP_MIN_LOG_LEVEL` unless set; unless it is "0", fd 2 becomes a pipe to
  `mcwq_t5x/stderr_filter.py`, which drops `NATIVE_NOISE` lines (and `NO_GPU_NOISE` without a
  driver). Nothing happens when stderr is not open or the filter cannot start.
  """
  no_driver = not os.path.exists("/proc/driver/nvidia")
  if TF_LOG_LEVEL_ENV not in os.environ:
    # Without a driver TF runs the data pipeline only; its one error there is the failed cuInit
    # probe.
    os.environ[TF_LOG_LEVEL_ENV] = "3" if no_driver else "1"
  if os.environ[TF_LOG_LEVEL_ENV] == "0":
    return
  patterns = NATIVE_NOISE + (NO_GPU_NOISE if no_driver else ())
  try:
    saved = os.dup(2)
  except OSError:
    return
  read_end, write_end = os.pipe()
  try:
    # why a process: what a crashing command prints last (a fatal native error) still comes out.
    proc = subprocess.Popen([sys.executable, "-I", "-S", FILTER_SCRIPT, *patterns],
                            stdin=read_end,
                            stdout=saved,
                            stderr=saved,
                            start_new_session=True)
  except OSError:
    for fd in (saved, read_end, write_end):
      os.close(fd)
    return
  os.close(read_end)
  sys.stderr.flush()
  os.dup2(write_end, 2)
  os.close(write_end)

  def restore():
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except (OSError, ValueError):
        pass
    os.dup2(saved, 2)  # closes the command's end of the pipe: the filter drains it and ends
    os.close(saved)
    try:
      # Processes the command started may hold the pipe longer.
      proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      pass

  atexit.register(restore)
