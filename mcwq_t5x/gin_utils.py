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

The mains' console and error lines are `mcwq_t5x.console`'s.
"""
from __future__ import annotations

import argparse
import logging
import os
import pathlib
import re
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
    The argparse namespace (with `gin_file`, `gin_bindings`, `gin_search_paths` and any extras).

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
  parse_gin(args.gin_file, list(args.gin_bindings) + dotted, search)
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
