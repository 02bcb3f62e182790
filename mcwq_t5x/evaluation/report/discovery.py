"""Finding prediction files under RESULTS_DIR and naming each one's model, mode, split, language
and test set. One predicted RIR query per line, line-parallel with the gold file; layouts:

  1. upstream `mcwq/results/`: `{model}/{monolingual,zeroshot}/{split}/
     generated_predictions_{lang}.txt` and `..._{lang}-gold.txt` (the gold test set).
  2. simple: `predictions_{split}_{lang}[-gold].txt` anywhere; the model is the first folder
     below RESULTS_DIR, the mode "zeroshot" if a folder on the way is named so.
  3. `mcwq_t5x.train` / `.eval` output: `MODEL_DIR[/eval_<step>]/predictions/{task}_test.txt`,
     task names of `tasks/mcwq.py` (`mcwq_gold_{lang}` takes the split of the other test files
     there, if unique); the model is the run (MODEL_DIR, never `eval_<step>`; outside any
     MODEL_DIR, the run whose checkpoint the metrics JSON records: `checkpoint_run_name`).

A second file of one run and test set is skipped; `_validation.txt` only with `--split validation`.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from typing import Optional, Sequence

from mcwq_t5x.checkpointing import run_folder
from mcwq_t5x.evaluation import score as score_lib
from mcwq_t5x.evaluation.report.common import GOLD
from mcwq_t5x.evaluation.report.common import MODES
from mcwq_t5x.evaluation.report.common import SPLITS

_LANG = r"(?P<lang>[a-z]{2,3})"
_SPLIT = r"(?P<split>[A-Za-z0-9][A-Za-z0-9_]*?)"
_UPSTREAM_RE = re.compile(r"^generated_predictions_%s(?P<gold>-gold)?\.txt$" % _LANG)
_TRAIN_RE = re.compile(
    r"^mcwq_%s(?P<zeroshot>_zeroshot)?_%s(?P<prefixed>_prefixed)?_(?P<part>test|validation)\.txt$" %
    (_SPLIT, _LANG))
_OWN_RE = re.compile(r"^predictions_%s_%s(?P<gold>-gold)?\.txt$" % (_SPLIT, _LANG))


@dataclasses.dataclass(frozen=True)
class PredictionFile:
  """One discovered prediction file: `model` ("mt5_small"), `mode` ("monolingual" | "zeroshot"),
  training `split`, question `language`, `gold` (the human-translated gold test set), `path`."""
  model: str
  mode: str
  split: str
  language: str
  gold: bool
  path: pathlib.Path


def discover(results_dir: str | pathlib.Path, eval_split: str = "test") -> list[PredictionFile]:
  """The prediction files under `results_dir` (recursive), sorted by (model, mode, split, language,
  gold); files matching no layout are ignored.

  `eval_split` "validation" reads the `{task}_validation.txt` files only. FileNotFoundError if
  `results_dir` is not a folder.
  """
  root = pathlib.Path(results_dir)
  if not root.is_dir():
    raise FileNotFoundError(f"{root}: no such results directory")
  found = []
  for path in sorted(root.rglob("*.txt")):
    rel_dirs = path.relative_to(root).parts[:-1]
    m = _UPSTREAM_RE.match(path.name) if eval_split == "test" else None
    if m:
      # Read split/mode/model from the full path, so RESULTS_DIR may be any level of it.
      dirs = path.resolve().parent.parts
      if len(dirs) < 2 or dirs[-1] not in SPLITS:
        continue
      split = dirs[-1]
      if dirs[-2] in MODES:
        mode, model = dirs[-2], (dirs[-3] if len(dirs) >= 3 else "model")
      else:
        mode, model = "monolingual", dirs[-2]
    elif _TRAIN_RE.match(path.name):
      if _TRAIN_RE.match(path.name).group("part") != eval_split:
        continue
      pf = _train_layout_file(path, _TRAIN_RE.match(path.name))
      if pf is not None:
        found.append(pf)
      continue
    else:
      m = _OWN_RE.match(path.name) if eval_split == "test" else None
      if not m:
        continue
      split = m.group("split")
      mode = "zeroshot" if "zeroshot" in rel_dirs else "monolingual"
      model = rel_dirs[0] if rel_dirs and rel_dirs[0] not in MODES else root.resolve().name
      model = prompting_system(path) or model
    found.append(PredictionFile(model, mode, split, m.group("lang"), bool(m.group("gold")), path))
  return sorted(found, key=lambda f: (f.model, f.mode, f.split, f.language, f.gold))


def prompting_system(path: pathlib.Path) -> Optional[str]:
  """The system name of a `mcwq_t5x.prompt` run (its run.json beside `path`, "kind": "prompting",
  e.g. "llama-3-8b_8shot_cover", "ORACLE_..." for an oracle selection), else None."""
  run_json = path.parent / "run.json"
  if not run_json.is_file():
    return None
  try:
    run = json.loads(run_json.read_text(encoding="utf-8"))
  except (OSError, UnicodeDecodeError, json.JSONDecodeError):
    return None
  return run.get("system") if isinstance(run, dict) and run.get("kind") == "prompting" else None


def _train_layout_file(path: pathlib.Path, m: re.Match) -> Optional[PredictionFile]:
  """A `MODEL_DIR/predictions/{task}_test.txt` file of `mcwq_t5x.train` (layout 3)."""
  directory = path.parent
  model = run_name(directory)
  if not run_folder.is_run_folder(run_dir(directory)):
    model = checkpoint_run_name(path) or model
  lang = m.group("lang")
  if m.group("split") != GOLD:
    mode = "zeroshot" if m.group("zeroshot") else "monolingual"
    return PredictionFile(model, mode, m.group("split"), lang, False, path)
  if m.group("part") != "test":
    return None
  # Gold predictions: the training split is that of the run's other test predictions (in this
  # directory, else anywhere in the run folder).
  names = [p.name for p in directory.glob("mcwq_*_test.txt")]
  splits = _test_splits(names)
  if not splits and run_dir(directory) != directory.absolute():
    names = [p.name for p in run_dir(directory).rglob("mcwq_*_test.txt")]
    splits = _test_splits(names)
  if len(splits) != 1:
    return None
  zeroshot = any(
      n in names
      for n in (f"mcwq_{splits[0]}_zeroshot_{lang}{p}_test.txt" for p in ("", "_prefixed")))
  return PredictionFile(model, "zeroshot" if zeroshot else "monolingual", splits[0], lang, True,
                        path)


def checkpoint_run_name(path: pathlib.Path) -> Optional[str]:
  """The MODEL_DIR name of the checkpoint the `metrics/<task>_<split>.json` beside a `mcwq_t5x.eval`
  prediction file records (key "checkpoint"), or None without one (then the folder names it)."""
  directory = path.parent
  if directory.name != run_folder.PREDICTIONS:
    return None
  record_path = directory.parent / run_folder.METRICS / (path.stem + ".json")
  try:
    record = json.loads(record_path.read_text(encoding="utf-8"))
  except (OSError, ValueError):
    return None
  # why: an eval written outside the run folder (EVAL_OUTPUT_DIR=runs/zs_he) is reported with the
  # run it decoded.
  checkpoint = record.get("checkpoint") if isinstance(record, dict) else None
  if not isinstance(checkpoint, str) or not checkpoint.strip():
    return None
  return run_folder.run_name_of_checkpoint(checkpoint)


run_dir = run_folder.run_folder_of  # why: the run folder has one owner
run_name = run_folder.run_name


def _test_splits(names: Sequence[str]) -> list[str]:
  """The training splits named by test prediction files (gold ones aside)."""
  matches = [_TRAIN_RE.match(n) for n in names]
  return sorted({m.group("split") for m in matches if m and m.group("split") != GOLD})


def place(path: pathlib.Path) -> PredictionFile:
  """The `discover` entry of one prediction file (its layout read from its name and folders)."""
  for root in (path.parent, path.parent.parent):
    for f in discover(root):
      if f.path.resolve() == path.resolve():
        return f
  raise score_lib.InputError(
      f"{path}: not a prediction file of a known layout (generated_predictions_<lang>.txt in "
      "<split>/, predictions_<split>_<lang>.txt, or mcwq_<task>_test.txt of mcwq_t5x.train): "
      "name the gold file with --compare_gold")
