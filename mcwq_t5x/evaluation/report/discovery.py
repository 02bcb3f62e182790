"""Finding prediction files under RESULTS_DIR in the three layouts of the report (the package
docstring lists them) and naming each one's model, mode, split, language and test set."""
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
  """One discovered prediction file.

  Attributes:
    model: model name (e.g. "mt5_small").
    mode: "monolingual" or "zeroshot".
    split: the split the model was trained on (mcd1, mcd2, mcd3, random_split).
    language: language of the questions ("en", "he", "kn", "zh").
    gold: True for predictions on the human-translated gold test set.
    path: the file.
  """
  model: str
  mode: str
  split: str
  language: str
  gold: bool
  path: pathlib.Path


def discover(results_dir: str | pathlib.Path, eval_split: str = "test") -> list[PredictionFile]:
  """Finds the prediction files under `results_dir` (layouts in the module docstring).

  Args:
    results_dir: the folder searched (recursively).
    eval_split: "test" (every layout) or "validation" (`mcwq_t5x.train` output only, the
      `{task}_validation.txt` files).

  Returns:
    Files sorted by (model, mode, split, language, gold). Files matching no layout are
    ignored.

  Raises:
    FileNotFoundError: `results_dir` is not a directory.
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
  """The model name of a prediction file of `mcwq_t5x.eval`, from the checkpoint its metrics JSON
  records (`EVAL_OUTPUT_DIR/metrics/<task>_<split>.json`, key "checkpoint": the CHECKPOINT_PATH
  given, a MODEL_DIR or one of its `checkpoint_<step>` folders): the MODEL_DIR's name. So an eval
  written outside the run folder (EVAL_OUTPUT_DIR=runs/zs_he) is reported with the run it decoded;
  predictions inside a MODEL_DIR keep that folder's name (`_train_layout_file`), also when the
  folder was copied or renamed.

  Returns:
    The name, or None when there is no such JSON or it records no checkpoint (then the folder
    names the model: `run_name`).
  """
  directory = path.parent
  if directory.name != run_folder.PREDICTIONS:
    return None
  record_path = directory.parent / run_folder.METRICS / (path.stem + ".json")
  try:
    record = json.loads(record_path.read_text(encoding="utf-8"))
  except (OSError, ValueError):
    return None
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
