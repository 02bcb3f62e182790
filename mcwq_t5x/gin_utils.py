"""Command-line gin handling shared by the mains (T5X `t5x/gin_utils.py` flags).

Flags (same names as T5X):
  --gin_file=PATH            repeatable; a config file (searched in --gin_search_paths).
  --gin.NAME=VALUE           a binding, e.g. --gin.TRAIN_STEPS=100 --gin.MODEL_DIR="'runs/x'".
  --gin_bindings=BINDING     repeatable; a raw binding "NAME = VALUE".
  --gin_search_paths=A,B     folders searched for files and includes (default: cwd, repo root).

Config errors (unknown configurable or parameter, syntax, a macro no file uses, an include cycle
or a missing include) raise `GinConfigError` naming the file and line or the binding. Nothing is
registered with gin at import: the files use dynamic registration, as T5X's do, and name the
main by its module (`from mcwq_t5x import train as train_script`, T5X: `import __main__`), so the
files of both engines parse in one process.
"""
from __future__ import annotations

import argparse
import difflib
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
  """(remaining argv, ["NAME = VALUE", ...]): `--gin.NAME=VALUE` split off; GinConfigError
  without `=`."""
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
  """Where includes are looked for: the search paths, then `sys.path`."""
  # Installed packages' files (t5x/configs/runs/finetune.gin), as gin's resource reader finds them.
  return list(search_paths) + [d for d in sys.path if d]


def _config_text(files: Sequence[str], search_paths: Sequence[str]) -> str:
  """Text of the files and all they include, in include order, each file once (the unused-macro
  check).

  GinConfigError: an include cycle (each file with the line including the next) or a missing
  include (the including file and line, the folders searched).
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

  The cwd and repo root are always search paths; `finalize` locks the config; `skip_unknown` is
  gin's. Raises GinConfigError: a missing file or include, a cycle, unknown configurable or
  parameter, syntax, or an UPPER_CASE macro binding no file references by its whole name
  (`TRAIN_STEP = 5` beside `%TRAIN_STEPS`: the message suggests the closest, `difflib`).
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
      close = difflib.get_close_matches(name, sorted(used), n=1)
      hint = f"did you mean {close[0]}?" if close else "typo?"
      raise GinConfigError(f"binding {b.strip()!r}: macro {name} is not used by any of the gin "
                           f"files {list(gin_files)} ({hint})")
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
  """The argparse namespace of `argv`'s T5X-style gin flags (plus `extra_args`'), gin configured.

  `command_line_bindings`: the --gin_bindings and --gin.NAME=VALUE as "NAME = VALUE". `epilog`
  follows the options in `--help` (`gin_help`). Raises GinConfigError (`parse_gin`).
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
  """The dtype name the model computes in ("bfloat16"; None if neither gin nor run.json has one).

  Order: a command-line binding of `DTYPE_PARAMETER`, else the run.json at or above
  `checkpoint_path`, else the gin files'; one stderr line says which. Call after parsing gin,
  before building the model. ValueError names an unreadable run.json.
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
  # The model files all bind a dtype, so the gin files' never counts as a choice.
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

  Does nothing under another name (a test importing it).
  """
  main = sys.modules.get("__main__")
  # why: the gin files import the main by name; a second copy's function would be configured, not
  # `__main__`'s.
  if getattr(getattr(main, "__spec__", None), "name", None) == name:
    sys.modules.setdefault(name, main)


def call_configured(fn: Callable[..., Any], *args, **kwargs) -> Any:
  """Calls `fn` with the bindings the parsed config gives it, else plainly (set-up functions such as
  `partitioning.set_host_device_count` that run before `train`/`evaluate`)."""
  try:
    # gin only configures a function it calls itself, unless asked.
    configured = gin.get_configurable(fn)
  except ValueError:  # not configured by any file
    configured = fn
  return configured(*args, **kwargs)


#: The task module that registers a run's task when its run.json records no input prefix (the
#: gin files' MIXTURE_OR_TASK_MODULE).
TASK_MODULE = "tasks.mcwq"


def run_input_prefix(checkpoint_path: Optional[str]) -> Optional[tuple[pathlib.Path, str, dict]]:
  """(run.json, its task, {task: input prefix}) of the run at or above `checkpoint_path`; None
  without a run.json, a recorded task or a known prefix.

  The prefix is run.json's `input_prefix`; for a run.json written before that field, the
  registered task's (`pipeline.input_prefixes`, where SeqIO and `TASK_MODULE` import). ValueError
  names an unreadable run.json.
  """
  # why: run_info imports jax, which inspect_task (a gin_utils user) never needs
  from mcwq_t5x.checkpointing import run_info  # pylint: disable=g-import-not-at-top
  run_path = run_info.find(checkpoint_path) if checkpoint_path else None
  if run_path is None:
    return None
  run = run_info.read(run_path)
  task = run.get("task")
  if not isinstance(task, str):
    return None
  prefixes = run_info.recorded_input_prefix(run)
  if prefixes is None:
    try:
      from mcwq_t5x.data import pipeline  # pylint: disable=g-import-not-at-top
      prefixes = pipeline.input_prefixes(pipeline.get_mixture_or_task(task, TASK_MODULE))
    except (ImportError, ValueError):  # no SeqIO (the inference image), or the task is unknown
      return None
  return run_path, task, prefixes


def _described(task: str, prefixes: dict) -> str:
  """"mcwq_mcd1_he_prefixed (inputs begin 'translate Hebrew to Sparql: ')", or "... (the bare
  questions)"; a mixture's tasks each so."""
  if len(prefixes) == 1 and task in prefixes:
    p = prefixes[task]
    return f"{task} ({f'inputs begin {p!r}' if p else 'the bare questions'})"
  return f"{task} (" + "; ".join(f"{t}: {f'inputs begin {p!r}' if p else 'the bare questions'}"
                                 for t, p in sorted(prefixes.items())) + ")"


INPUT_PREFIX_MACRO = "INPUT_PREFIX"


def adopt_recorded_input_prefix(checkpoint_path: Optional[str],
                                command_line_bindings: Sequence[str]) -> Optional[str]:
  """The text `infer` puts before each question, by the rule of `adopt_recorded_dtype`: a
  command-line INPUT_PREFIX (or `...input_prefix`) binding, else the one prefix of the run's task
  (`run_input_prefix`, bound to the INPUT_PREFIX macro), else the gin files'. A WARNING names both
  when the command line's differs from the run's, or when the run's tasks have several prefixes (a
  multilingual run: the question's language chooses). Call after parsing gin."""
  explicit = [
      b.strip() for b in command_line_bindings if b.split("=", 1)[0].strip() in (
          INPUT_PREFIX_MACRO,) or b.split("=", 1)[0].strip().endswith(".input_prefix")
  ]
  try:
    bound = gin.query_parameter(f"{INPUT_PREFIX_MACRO}/macro.value")
  except ValueError:  # the config has no INPUT_PREFIX
    return None
  run = run_input_prefix(checkpoint_path)
  if run is None:
    return bound
  run_path, task, prefixes = run
  trained = f"the run was trained on {_described(task, prefixes)}, recorded in {run_path}"
  values = sorted({p for p in prefixes.values() if p is not None})
  if explicit:
    level = logging.INFO if bound in values else logging.WARNING
    logging.log(level, "input prefix: %r, as the command line binds it (%s); %s", bound,
                explicit[-1], trained)
    return bound
  if len(values) != 1:
    logging.warning(
        "input prefix: %r, the gin config's; %s: set --gin.%s=\"'...'\" to the prefix of the "
        "questions' language", bound, trained, INPUT_PREFIX_MACRO)
    return bound
  with gin.unlock_config():  # why: parse_gin finalized (locked) the config
    gin.bind_parameter(f"{INPUT_PREFIX_MACRO}/macro.value", values[0])
  logging.info("input prefix: %r, the run's (%s); --gin.%s=\"'...'\" chooses another", values[0],
               trained, INPUT_PREFIX_MACRO)
  return values[0]


TASK_MACRO = "MIXTURE_OR_TASK_NAME"


def adopt_recorded_task(checkpoint_path: Optional[str], module: Optional[str]) -> Optional[str]:
  """The task `eval` decodes: MIXTURE_OR_TASK_NAME, or when the config leaves it None the run's
  task (recorded in run.json; bound to the macro). A WARNING names both when the task's inputs
  have another form than the run's (bare questions against prefixed ones: the model then sees
  inputs it was not trained on); prefixes of another language (zero-shot) are logged.
  GinConfigError: neither is known; pipeline.UnknownTaskError; ValueError: unreadable run.json."""
  from mcwq_t5x.data import pipeline  # pylint: disable=g-import-not-at-top
  name = macro_value(TASK_MACRO)
  run = run_input_prefix(checkpoint_path)
  if name is None:
    # why not run_input_prefix's: a run.json without a known prefix may still name its task
    from mcwq_t5x.checkpointing import run_info  # pylint: disable=g-import-not-at-top
    run_path = run_info.find(checkpoint_path) if checkpoint_path else None
    task = run_info.read(run_path).get("task") if run_path else None
    if not isinstance(task, str):
      raise GinConfigError(f"{TASK_MACRO} is not set and no run.json at or above CHECKPOINT_PATH "
                           f"{checkpoint_path} records a task: set --gin.{TASK_MACRO}=\"'...'\"")
    with gin.unlock_config():  # why: parse_gin finalized (locked) the config
      gin.bind_parameter(f"{TASK_MACRO}/macro.value", task)
    logging.info("task: %s, the run's (recorded in %s); --gin.%s=\"'...'\" chooses another", task,
                 run_path, TASK_MACRO)
    return task
  if run is None:
    return name
  run_path, task, trained = run
  ours = pipeline.input_prefixes(pipeline.get_mixture_or_task(name, module))
  forms = lambda prefixes: {bool(p) for p in prefixes.values() if p is not None}
  if forms(ours) and forms(trained) and forms(ours) != forms(trained):
    logging.warning(
        "task %s: the run was trained on %s (recorded in %s): the model reads inputs of a form "
        "it was not trained on and its scores say little; leave %s unset to evaluate the run's "
        "task", _described(name, ours), _described(task, trained), run_path, TASK_MACRO)
  elif ours != trained and set(ours.values()) != set(trained.values()):
    logging.info("task %s; the run was trained on %s", _described(name, ours),
                 _described(task, trained))
  return name
