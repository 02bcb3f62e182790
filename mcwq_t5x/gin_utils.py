"""Command-line gin handling shared by the mains (T5X `t5x/gin_utils.py` flags).

Flags (same names as T5X):
  --gin_file=PATH            repeatable; a config file (searched in --gin_search_paths).
  --gin.NAME=VALUE           a binding, e.g. --gin.TRAIN_STEPS=100 --gin.MODEL_DIR="'runs/x'".
  --gin_bindings=BINDING     repeatable; a raw binding "NAME = VALUE".
  --gin_search_paths=A,B     comma-separated folders searched for gin files and includes
                             (default: the current folder and the repository root).

Errors in the config (unknown configurable or parameter, a syntax error, a binding of a macro that no
config file uses, an include cycle, a missing include) are raised as `GinConfigError` naming the
file/line or the binding (a cycle: each of its files and the line that includes the next).

Nothing is registered with gin here or anywhere else in the library at import: the config files
name what they configure by dynamic registration (`from __gin__ import dynamic_registration`,
`from mcwq_t5x.engine import network`, `network.get_config.name = 'mt5_small'`), as T5X's
files do. Our run files name the main by its module (`from mcwq_t5x import train as
train_script`), where T5X's say `import __main__ as train_script`; so the files of both engines
parse in one process, and `use_main_module_as` makes the running `python -m mcwq_t5x.train` that
module (no second import).

The mains also share their console here: `setup_logging`, `one_line_exit` (a user's error as the
last line, no traceback) and `quiet_native_logs` (TensorFlow's, XLA's and SentencePiece's start-up
lines kept out of a command's stderr).
"""
from __future__ import annotations

import argparse
import atexit
import logging
import os
import pathlib
import re
import subprocess
import sys
from typing import Any, Callable, Optional, Sequence

import gin

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


class GinConfigError(ValueError):
  """A gin configuration problem (the message names the file/line or the offending binding)."""


def rewrite_gin_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
  """Splits `--gin.NAME=VALUE` arguments off `argv`.

  Returns:
    (remaining argv, list of "NAME = VALUE" bindings).

  Raises:
    GinConfigError: for `--gin.NAME` without `=VALUE`.
  """
  rest, bindings = [], []
  for arg in argv:
    if arg.startswith("--gin."):
      body = arg[len("--gin."):]
      if "=" not in body:
        raise GinConfigError(f"malformed flag {arg!r}: expected --gin.NAME=VALUE")
      name, value = body.split("=", 1)
      bindings.append(f"{name} = {value}")
    else:
      rest.append(arg)
  return rest, bindings


def _resolve(path: str, search_paths: Sequence[str]) -> Optional[pathlib.Path]:
  p = pathlib.Path(path)
  if p.is_absolute():
    return p if p.is_file() else None
  for base in search_paths:
    cand = pathlib.Path(base) / p
    if cand.is_file():
      return cand
  return None


_INCLUDE_RE = re.compile(r"""^\s*include\s+['"]([^'"]+)['"]""", re.M)


def _include_search_paths(search_paths: Sequence[str]) -> list[str]:
  """Where includes are looked for: the search paths, then `sys.path` (includes of installed
  packages' files, e.g. 't5x/configs/runs/finetune.gin', as gin's own resource reader finds
  them)."""
  return list(search_paths) + [d for d in sys.path if d]


def _config_text(files: Sequence[str], search_paths: Sequence[str]) -> str:
  """Text of the files and everything they include (for the unused-macro check), read in
  include order; a file included twice (not in a cycle) is read once.

  Raises:
    GinConfigError: an include cycle (the message names the files of the cycle, each with the
      line that includes the next) or an include that is not found (the message names the
      including file and line, the missing file and the folders searched).
  """
  paths = _include_search_paths(search_paths)
  done: set[pathlib.Path] = set()
  out: list[str] = []

  def visit(path: pathlib.Path, chain: list[tuple[pathlib.Path, int]]) -> None:
    # chain: the files being read, outermost first, each with the line that includes the next.
    text = path.read_text()
    out.append(text)
    for match in _INCLUDE_RE.finditer(text):
      line = text.count("\n", 0, match.start()) + 1
      if "://" in match.group(1):  # read by one of gin's file readers (e.g. gs://): left to gin
        continue
      included = _resolve(match.group(1), paths)
      if included is None:
        raise GinConfigError(
            f"{path}, line {line}: included gin file {match.group(1)!r} not found (searched: "
            f"{', '.join(dict.fromkeys(search_paths))} and sys.path)")
      stack = [p for p, _ in chain] + [path]
      key = included.resolve()
      if key in {p.resolve() for p in stack}:
        start = [p.resolve() for p in stack].index(key)
        links = zip(chain[start:] + [(path, line)], stack[start + 1:] + [included])
        cycle = "; ".join(f"{p}, line {n}, includes {t}" for (p, n), t in links)
        raise GinConfigError(f"gin include cycle: {cycle}")
      if key not in done:
        visit(included, chain + [(path, line)])
    done.add(path.resolve())

  for f in files:
    p = _resolve(f, paths)
    if p is not None and p.resolve() not in done:
      visit(p, [])
  return "\n".join(out)


_MACRO_REF_RE = re.compile(r"%([A-Za-z_][A-Za-z0-9_]*)\b")


def _macro_references(text: str) -> set[str]:
  """The whole macro names referenced (`%NAME`) in gin text: `%TRAIN_STEPS` references
  TRAIN_STEPS, never the prefix TRAIN_STEP."""
  return set(_MACRO_REF_RE.findall(text))


def parse_gin(gin_files: Sequence[str],
              gin_bindings: Sequence[str] = (),
              gin_search_paths: Sequence[str] = (),
              finalize: bool = True,
              skip_unknown: bool = False) -> None:
  """Clears gin, then parses the files and bindings (bindings override the files).

  Args:
    gin_files: config files (relative to a search path or absolute).
    gin_bindings: "NAME = VALUE" bindings.
    gin_search_paths: folders for files and includes (the cwd and the repo root are always added).
    finalize: lock the config after parsing.
    skip_unknown: passed to gin (False: unknown configurables are errors).

  Raises:
    GinConfigError: missing file, an include cycle (naming its files) or a missing include (naming
      the including file and line), unknown configurable/parameter, syntax error, or a macro binding
      (UPPER_CASE name) that no config file references by its whole name (`TRAIN_STEP = 5` is an
      error even though the files reference `%TRAIN_STEPS`).
  """
  search = [str(s) for s in gin_search_paths] + [os.getcwd(), str(REPO_ROOT)]
  gin.clear_config()
  for s in search:
    gin.add_config_file_search_path(s)
  for f in gin_files:
    if _resolve(f, search) is None:
      raise GinConfigError(f"gin file {f!r} not found (searched: {', '.join(search)})")
  used = _macro_references(_config_text(gin_files, search))
  for b in gin_bindings:
    name = b.split("=", 1)[0].strip()
    if re.fullmatch(r"[A-Z][A-Z0-9_]*", name) and name not in used:
      raise GinConfigError(f"binding {b.strip()!r}: macro {name} is not used by any of the gin "
                           f"files {list(gin_files)} (typo?)")
  try:
    gin.parse_config_files_and_bindings(
        list(gin_files), list(gin_bindings), finalize_config=finalize, skip_unknown=skip_unknown)
  except (ValueError, SyntaxError, KeyError, TypeError, OSError) as e:
    raise GinConfigError(f"invalid gin configuration (files {list(gin_files)}, bindings "
                         f"{list(gin_bindings)}): {e}") from e


#: Macros shown by `config_summary` (those a config defines), in this order.
SUMMARY_MACROS = ("MIXTURE_OR_TASK_NAME", "MODEL_DIR", "CHECKPOINT_PATH", "INITIAL_CHECKPOINT_PATH",
                  "TRAIN_SPLIT", "EVAL_SPLIT", "FINAL_EVAL_SPLIT", "SPLIT", "TASK_FEATURE_LENGTHS",
                  "TRAIN_STEPS", "BATCH_SIZE", "LEARNING_RATE", "EVAL_OUTPUT_DIR",
                  "METRIC_NAME_TO_MONITOR", "HOST_DEVICE_COUNT", "NUM_PARTITIONS")


def gin_help(files: Sequence[str], macros: Sequence[str]) -> str:
  """The `--help` epilog of a main: its gin files, main macros and the binding forms."""
  return "\n".join([
      "gin configuration (T5X's flags; later flags override earlier ones):",
      "  --gin_file=FILE       repeatable; e.g.",
      *(f"                          {f}" for f in files),
      "  --gin.NAME=VALUE      a macro or binding; VALUE is a gin literal (strings quoted twice:",
      "                        --gin.MODEL_DIR=\"'runs/x'\" --gin.TRAIN_STEPS=100)",
      "  --gin_bindings='NAME = VALUE'   the same, T5X's raw form",
      "main macros: " + ", ".join(macros),
      "The full operative config is written to MODEL_DIR/config.gin (training) and logged at "
      "DEBUG level; the log shows a summary.",
  ])


def config_summary() -> str:
  """One line: the main macros of the parsed config (the full config is `gin.config_str()`)."""
  parts = []
  for name in SUMMARY_MACROS:
    try:
      value = gin.query_parameter(f"%{name}")
    except ValueError:
      continue
    parts.append(f"{name}={value!r}")
  return ", ".join(parts)


def parse_flags(argv: Optional[Sequence[str]] = None,
                description: str = "",
                extra_args: Optional[callable] = None,
                prog: Optional[str] = None,
                epilog: Optional[str] = None) -> argparse.Namespace:
  """Parses the T5X-style gin flags of `argv` (default `sys.argv[1:]`) and configures gin.

  Args:
    argv: command-line arguments without the program name.
    description: help text.
    extra_args: optional `fn(parser)` adding main-specific arguments.
    prog: program name in the usage line (e.g. "python -m mcwq_t5x.train").
    epilog: text after the options in `--help` (`gin_help`).

  Returns:
    The argparse namespace (with `gin_file`, `gin_bindings`, `gin_search_paths`,
    `command_line_bindings`: the --gin_bindings and --gin.NAME=VALUE ones as "NAME = VALUE", and
    any extras).

  Raises:
    GinConfigError: see `parse_gin`.
  """
  argv = list(sys.argv[1:] if argv is None else argv)
  argv, dotted = rewrite_gin_args(argv)
  parser = argparse.ArgumentParser(
      prog=prog,
      description=description,
      epilog=epilog,
      formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument(
      "--gin_file", action="append", default=[], help="gin config file (repeatable)")
  parser.add_argument(
      "--gin_bindings",
      action="append",
      default=[],
      help="raw gin binding 'NAME = VALUE' (repeatable)")
  parser.add_argument(
      "--gin_search_paths", default="", help="comma-separated folders searched for gin files")
  if extra_args is not None:
    extra_args(parser)
  args = parser.parse_args(argv)
  search = [s for s in args.gin_search_paths.split(",") if s]
  args.command_line_bindings = list(args.gin_bindings) + dotted
  parse_gin(args.gin_file, args.command_line_bindings, search)
  logging.info("gin: files %s, %d command-line bindings; %s", list(args.gin_file),
               len(args.gin_bindings) + len(dotted), config_summary())
  logging.debug("gin configuration:\n%s", gin.config_str())
  return args


def macro_value(name: str) -> Optional[str]:
  """The string bound to macro `name` in the parsed config (e.g. "MODEL_DIR"), None when it is
  not bound or not a string."""
  try:
    value = gin.query_parameter(f"{name}/macro.value")
  except ValueError:
    return None
  return value if isinstance(value, str) else None


DTYPE_PARAMETER = "network.get_config.dtype"


def adopt_recorded_dtype(checkpoint_path: Optional[str],
                         command_line_bindings: Sequence[str]) -> Optional[str]:
  """Makes the model compute in the dtype its run was trained in, unless the command line chose.

  The dtype used: a command-line binding of `DTYPE_PARAMETER` (--gin.network.get_config.dtype=...
  or --gin_bindings) if there is one, else the network dtype recorded in the run.json at or above
  `checkpoint_path` (`run_info.find`; bound as `DTYPE_PARAMETER`), else the gin files' (the model
  files all bind one, so theirs never counts as a choice). Says on stderr, in one line, which
  dtype is used and why (a warning when it is not the run's). Call it after parsing gin, before
  the model is built (the infer and eval mains).

  Returns:
    The name of the dtype used (e.g. "bfloat16"), None when the gin config does not bind
    `DTYPE_PARAMETER` and no run.json records one.

  Raises:
    ValueError: an unreadable run.json (names it).
  """
  # why: run_info imports jax, which inspect_task (a gin_utils user) never needs
  from mcwq_t5x.checkpointing import run_info  # pylint: disable=g-import-not-at-top

  run_path = run_info.find(checkpoint_path) if checkpoint_path else None
  recorded = (run_info.read(run_path).get("network") or {}).get("dtype") if run_path else None
  explicit = [
      b.strip()
      for b in command_line_bindings
      if b.split("=", 1)[0].strip().endswith("get_config.dtype")  # why: or the module's full name
  ]
  try:
    bound = _dtype_name(gin.query_parameter(DTYPE_PARAMETER))
  except ValueError:  # the config binds no dtype (or has no network.get_config)
    bound = None
  trained = f"the run was trained in {recorded} ({run_path})"
  if explicit:
    level = logging.WARNING if recorded not in (None, bound) else logging.INFO
    logging.log(level, "dtype: computing in %s, as the command line binds it (%s)%s", bound,
                explicit[-1], f"; {trained}" if recorded else "")
    return bound
  if recorded is None:
    logging.info("dtype: computing in %s, as the gin config binds it (%s at or above %s)", bound,
                 "no dtype recorded in run.json" if run_path else "no run.json", checkpoint_path)
    return bound
  try:
    with gin.unlock_config():  # why: parse_gin finalized (locked) the config
      gin.bind_parameter(DTYPE_PARAMETER, recorded)
  except ValueError:  # no network.get_config in the config (another network)
    logging.warning(
        "dtype: %s; the gin config has no %s to bind it to: computing in the "
        "model's own dtype", trained, DTYPE_PARAMETER)
    return None
  logging.info(
      "dtype: computing in %s, the run's (recorded in %s%s); "
      "--gin.%s=\"'...'\" chooses another", recorded, run_path,
      "" if bound in (None, recorded) else f", over the gin config's {bound}", DTYPE_PARAMETER)
  return recorded


def _dtype_name(value: Any) -> str:
  """"bfloat16" for 'bfloat16', jnp.bfloat16 or np.dtype('bfloat16')."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top  # why: jax only when asked
  return jnp.dtype(value).name


def use_main_module_as(name: str) -> None:
  """Under `python -m name`, registers the running `__main__` module as `name` too.

  The gin files import the main by name (`from mcwq_t5x import train as train_script`); without
  this, that import would load a second copy of the module and gin would configure the copy's
  function, not the one `__main__` calls. Does nothing when the module runs under another name
  (imported by a test, say), where the import finds the module itself.
  """
  main = sys.modules.get("__main__")
  if getattr(getattr(main, "__spec__", None), "name", None) == name:
    sys.modules.setdefault(name, main)


def call_configured(fn: Callable[..., Any], *args, **kwargs) -> Any:
  """Calls `fn` with the bindings the parsed config gives it (if a file configured it by dynamic
  registration, e.g. `partitioning.set_host_device_count.count = 4`), else plainly.

  The mains use it for the set-up functions that must run before `train`/`evaluate` is called
  (XLA host devices, `jax.distributed`), which gin would otherwise only configure when it calls
  them itself.
  """
  try:
    configured = gin.get_configurable(fn)
  except ValueError:  # not configured by any file
    configured = fn
  return configured(*args, **kwargs)


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
  """The exception itself, or the one gin wrapped: an exception raised in a configurable reaches
  the caller as a proxy subclassing its type, whose message adds "In call to configurable ...";
  the original is its `__context__`."""
  context = error.__context__
  proxy = (
      context is not None and type(context) in type(error).__bases__ and
      type(error).__name__ == type(context).__name__)
  return context if proxy else error


def one_line_exit(error: BaseException) -> SystemExit:
  """`SystemExit` (exit status 1) whose message, the last line the command prints, is
  `"<ErrorType>: <message>"` of `original_error(error)`; the caller raises it `from error`."""
  error = original_error(error)
  return SystemExit(f"{type(error).__name__}: {error}")


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

# The filter process: copies its stdin (the command's stderr) to its stdout (the terminal or file
# stderr was) line by line, without the lines that fully match a pattern of its arguments. A
# partial line is written once nothing more arrives for 0.2 s (prompts, progress bars). It runs in
# a session of its own and ignores SIGINT, SIGTERM and SIGHUP, so that a signal to the command's
# process group (Ctrl-C, a scheduler's preemption notice) leaves it running while the command
# prints its traceback or saves its checkpoint. It ends when every writer has closed the pipe; if
# its output is closed it keeps reading, so that no writer blocks.
_FILTER_PROGRAM = r"""
import os, re, select, signal, sys
for name in ('SIGINT', 'SIGTERM', 'SIGHUP'):
  signal.signal(getattr(signal, name), signal.SIG_IGN)
noise = re.compile("|".join("(?:%s)" % p for p in sys.argv[1:]).encode())
pending, broken = b"", False
def write(data):
  global broken
  while data and not broken:
    try:
      data = data[os.write(1, data):]
    except OSError:
      broken = True
while True:
  if pending and not select.select([0], [], [], 0.2)[0]:
    write(pending)
    pending = b""
    continue
  try:
    chunk = os.read(0, 1 << 16)
  except InterruptedError:
    continue
  if not chunk:
    break
  *lines, pending = (pending + chunk).split(b"\n")
  write(b"".join(l + b"\n" for l in lines if not noise.fullmatch(l)))
if pending and not noise.fullmatch(pending):
  write(pending)
"""


def quiet_native_logs() -> None:
  """Keeps the native libraries' start-up noise out of a command's stderr (the mains call it under
  `if __name__ == "__main__"`, before TensorFlow is imported; never in a library user's process).

  * `TF_CPP_MIN_LOG_LEVEL`, unless the user set it: 3 without an NVIDIA driver (TensorFlow runs
    the data pipeline only; its one error there is the failed CUDA probe, "failed call to
    cuInit"), else 1 (no INFO lines). TensorFlow's errors still raise Python exceptions.
  * Unless `TF_CPP_MIN_LOG_LEVEL=0` (the user asks for everything), file descriptor 2 becomes a
    pipe to a small filter process (`_FILTER_PROGRAM`, the same interpreter run with `-I -S`)
    that writes every line to the original stderr except those matching `NATIVE_NOISE` (and
    `NO_GPU_NOISE` without a driver). A separate process, so that what a crashing command prints
    last (a fatal native error, a traceback) still comes out. At exit the original stderr is put
    back once the filter has written everything (up to 10 s: processes the command started may
    hold the pipe longer).

  Nothing happens when stderr is not open or the filter cannot be started.
  """
  no_driver = not os.path.exists("/proc/driver/nvidia")
  if TF_LOG_LEVEL_ENV not in os.environ:
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
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _FILTER_PROGRAM, *patterns],
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
      proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      pass

  atexit.register(restore)
