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
import os
import pathlib
import re
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence, Union

from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import run_folder
from mcwq_t5x.data import readers
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
_MIXTURE_RE = re.compile(
    r"^mcwq_%s_multilingual(?P<prefixed>_prefixed)?_(?P<part>test|validation)\.txt$" % _SPLIT)
_OWN_RE = re.compile(r"^predictions_%s_%s(?P<gold>-gold)?\.txt$" % (_SPLIT, _LANG))
_EVAL_STEP_RE = re.compile(r"^eval_(?P<step>\d+)$")
#: Display names of the `network.CONFIGS` presets (the "model size" column).
SIZE_TITLES = {
    "tiny": "tiny",
    "mt5_small": "mT5-small",
    "mt5_base": "mT5-base",
    "mt5_large": "mT5-large",
    "t5_1_1_base": "T5.1.1-base",
    "t5_base": "T5-base"
}
#: The training part of the upstream `mcwq/results/` predictions (the paper's models, §5).
UPSTREAM_TRAIN_PART = "train"
MULTILINGUAL = "multilingual"


@dataclasses.dataclass(frozen=True)
class PredictionFile:
  """One discovered prediction file: `model` ("mt5_small"), `mode` ("monolingual" | "zeroshot"),
  training `split`, question `language`, `gold` (the human-translated gold test set), `path`;
  `step` (the checkpoint step it decoded, None if unknown), `final` (the run's final evaluation,
  `MODEL_DIR/predictions/`), `train_part` ("train", "dev": the MCWQ part the run trained on) and
  `size` ("mT5-small", "tiny", "d_model 128, 4+4 layers"), None if unknown; `train_languages`
  ("multilingual" for a mixture run); `mixture`: the languages of a mixture file in file order
  (empty: a file of one language); `run_json`: the run.json these facts come from; `run`: the
  run's name where `model` names one of several results of it apart (`build.name_apart`)."""
  model: str
  mode: str
  split: str
  language: str
  gold: bool
  path: pathlib.Path
  step: Optional[int] = None
  final: bool = False
  train_part: Optional[str] = None
  size: Optional[str] = None
  train_languages: Optional[str] = None
  mixture: tuple[str, ...] = ()
  run_json: Optional[str] = None
  run: Optional[str] = None


def discover(results_dirs: Union[str, pathlib.Path, Sequence[Union[str, pathlib.Path]]],
             eval_split: str = "test",
             languages_of: Optional[Callable[[str], Sequence[str]]] = None) -> list[PredictionFile]:
  """The prediction files under `results_dirs` (one folder or several; recursive, following
  symbolic links), sorted by (model, mode, split, language, gold, path); files matching no layout
  are ignored.

  `eval_split` "validation" reads the `{task}_validation.txt` files only. `languages_of(split)`:
  the languages of a mixture file whose metrics JSON does not name its tasks (default: those
  `readers.discover` finds in the default data folder). FileNotFoundError if a results folder is
  not a folder.
  """
  roots = ([results_dirs] if isinstance(results_dirs, (str, os.PathLike)) else list(results_dirs))
  found = []
  for root in map(pathlib.Path, roots):
    if not root.is_dir():
      raise FileNotFoundError(f"{root}: no such results directory")
    for path in _text_files(root):
      found += _entries(root, path, eval_split, languages_of)
  return sorted(found, key=lambda f: (f.model, f.mode, f.split, f.language, f.gold, str(f.path)))


def _text_files(root: pathlib.Path) -> Iterator[pathlib.Path]:
  """The `*.txt` files under `root` in path order, through symbolic links to folders (each real
  folder once: a link back up is not followed again)."""
  seen = set()
  for folder, dirs, files in os.walk(root, followlinks=True):
    real = os.path.realpath(folder)
    if real in seen:
      dirs[:] = []
      continue
    seen.add(real)
    dirs.sort()
    for name in sorted(files):
      if name.endswith(".txt"):
        yield pathlib.Path(folder) / name


def _entries(root: pathlib.Path, path: pathlib.Path, eval_split: str,
             languages_of: Optional[Callable[[str], Sequence[str]]]) -> list[PredictionFile]:
  """The `PredictionFile`s of one file (several for a mixture, none for another file)."""
  rel_dirs = path.relative_to(root).parts[:-1]
  m = _UPSTREAM_RE.match(path.name) if eval_split == "test" else None
  if m:
    # Read split/mode/model from the full path, so RESULTS_DIR may be any level of it: as given
    # (a link's own name), else as resolved (the name of the folder it points to).
    for dirs in (pathlib.Path(os.path.normpath(path.absolute())).parent.parts,
                 path.resolve().parent.parts):
      if len(dirs) >= 2 and dirs[-1] in SPLITS:
        break
    else:
      return []
    split = dirs[-1]
    if dirs[-2] in MODES:
      mode, model = dirs[-2], (dirs[-3] if len(dirs) >= 3 else "model")
    else:
      mode, model = "monolingual", dirs[-2]
    return [
        PredictionFile(
            model,
            mode,
            split,
            m.group("lang"),
            bool(m.group("gold")),
            path,
            train_part=UPSTREAM_TRAIN_PART,
            size=SIZE_TITLES.get(model))
    ]
  m = _TRAIN_RE.match(path.name) or _MIXTURE_RE.match(path.name)
  if m:
    if m.group("part") != eval_split:
      return []
    return _train_layout_files(path, m, languages_of)
  m = _OWN_RE.match(path.name) if eval_split == "test" else None
  if not m:
    return []
  mode = "zeroshot" if "zeroshot" in rel_dirs else "monolingual"
  model = rel_dirs[0] if rel_dirs and rel_dirs[0] not in MODES else root.resolve().name
  model = prompting_system(path) or model
  facts = run_facts(_run_json_above(path.parent))
  return [
      PredictionFile(model, mode, m.group("split"), m.group("lang"), bool(m.group("gold")), path,
                     **facts)
  ]


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


def _train_layout_files(
    path: pathlib.Path, m: re.Match,
    languages_of: Optional[Callable[[str], Sequence[str]]]) -> list[PredictionFile]:
  """The entries of a `MODEL_DIR/predictions/{task}_test.txt` file of `mcwq_t5x.train` (layout
  3): one, or one per language of a mixture; none for a gold file whose split is unknown."""
  directory = path.parent
  model = run_name(directory)
  record = _metrics_record(path)
  if not run_folder.is_run_folder(run_dir(directory)):
    model = checkpoint_run_name(path) or model
  step = record.get("step") if isinstance(record.get("step"), int) else _eval_step(directory)
  facts = dict(
      step=step,
      final=(directory.name == run_folder.PREDICTIONS and
             run_folder.is_run_folder(directory.parent)),
      **run_facts(_run_json_of(path, record)))
  if "lang" not in m.groupdict():  # a mixture
    return _mixture_files(path, m, model, record, facts, languages_of)
  lang = m.group("lang")
  if m.group("split") != GOLD:
    mode = "zeroshot" if m.group("zeroshot") else "monolingual"
    return [PredictionFile(model, mode, m.group("split"), lang, False, path, **facts)]
  if m.group("part") != "test":
    return []
  # Gold predictions: the training split is that of the run's other test predictions (in this
  # directory, else anywhere in the run folder).
  names = [p.name for p in directory.glob("mcwq_*_test.txt")]
  splits = _test_splits(names)
  if not splits and run_dir(directory) != directory.absolute():
    names = [p.name for p in run_dir(directory).rglob("mcwq_*_test.txt")]
    splits = _test_splits(names)
  if len(splits) != 1:
    return []
  zeroshot = any(
      n in names
      for n in (f"mcwq_{splits[0]}_zeroshot_{lang}{p}_test.txt" for p in ("", "_prefixed")))
  return [
      PredictionFile(model, "zeroshot" if zeroshot else "monolingual", splits[0], lang, True, path,
                     **facts)
  ]


def _mixture_files(path: pathlib.Path, m: re.Match, model: str, record: Mapping[str, Any],
                   facts: dict[str, Any],
                   languages_of: Optional[Callable[[str], Sequence[str]]]) -> list[PredictionFile]:
  """One entry per language of a mixture's prediction file, `mixture` holding them in the file's
  order: that of the task names (`seqio.Mixture.tasks` sorts them), read from the metrics JSON's
  `<task>/<metric>` keys, else `languages_of(split)`."""
  split, suffix = m.group("split"), m.group("prefixed") or ""
  tasks = {k.split("/")[0] for k in record if isinstance(k, str) and "/" in k}
  if not tasks:
    languages = (languages_of or (lambda s: readers.discover().languages_of(s)))(split)
    tasks = {f"mcwq_{split}_{lang}{suffix}" for lang in languages}
  matches = [_TRAIN_RE.match(f"{t}_{m.group('part')}.txt") for t in sorted(tasks)]
  languages = tuple(x.group("lang") for x in matches if x and not x.group("zeroshot"))
  facts = dict(facts, train_languages=facts["train_languages"] or MULTILINGUAL)
  return [
      PredictionFile(model, "monolingual", split, lang, False, path, mixture=languages, **facts)
      for lang in languages
  ]


def _metrics_record(path: pathlib.Path) -> dict[str, Any]:
  """The `metrics/<task>_<split>.json` written with a prediction file, {} without one."""
  if path.parent.name != run_folder.PREDICTIONS:
    return {}
  try:
    record = json.loads(
        (path.parent.parent / run_folder.METRICS / (path.stem + ".json")).read_text("utf-8"))
  except (OSError, ValueError):
    return {}
  return record if isinstance(record, dict) else {}


def _eval_step(directory: pathlib.Path) -> Optional[int]:
  """The step of `eval_<step>/predictions/` (`mcwq_t5x.eval`'s default folder), else None."""
  d = directory.parent if directory.name == run_folder.PREDICTIONS else directory
  m = _EVAL_STEP_RE.match(d.name)
  return int(m.group("step")) if m else None


def _run_json_of(path: pathlib.Path, record: Mapping[str, Any]) -> Optional[pathlib.Path]:
  """The run.json of the run a train-layout prediction file belongs to: its run folder's, else
  that of the checkpoint its metrics JSON records (as written, or a sibling folder of that name)."""
  candidates = [run_dir(path.parent)]
  checkpoint = record.get("checkpoint")
  if isinstance(checkpoint, str) and checkpoint.strip():
    candidates.append(pathlib.Path(checkpoint))
    name = run_folder.run_name_of_checkpoint(checkpoint)
    if name:
      candidates.append(run_dir(path.parent).parent / name)
  for c in candidates:
    p = c.parent if checkpoint_paths.step_of(c.name) is not None else c
    if (p / run_folder.RUN_JSON).is_file():
      return p / run_folder.RUN_JSON
  return None


def _run_json_above(directory: pathlib.Path) -> Optional[pathlib.Path]:
  """The run.json in `directory` or its run folder (a training or a prompting run's)."""
  for d in (directory, run_dir(directory)):
    if (d / run_folder.RUN_JSON).is_file():
      return d / run_folder.RUN_JSON
  return None


def run_facts(run_json: Optional[pathlib.Path]) -> dict[str, Optional[str]]:
  """{"train_part", "size", "train_languages", "run_json"} that a run.json of `mcwq_t5x.train`
  records: the MCWQ part of its "split" ("validation" -> "dev"), the `network.CONFIGS` preset its
  "network" equals (`SIZE_TITLES`; else "d_model D, E+D layers"), "multilingual" for a mixture
  task, and the file; each None where it records none. A prompting run's (`mcwq_t5x.prompt`): the
  part its demonstrations come from, "<k>-shot prompt" and the model's name."""
  facts: dict[str, Optional[str]] = dict(
      train_part=None, size=None, train_languages=None, run_json=None)
  if run_json is None:
    return facts
  try:
    run = json.loads(run_json.read_text(encoding="utf-8"))
  except (OSError, UnicodeDecodeError, json.JSONDecodeError):
    return facts
  if not isinstance(run, dict):
    return facts
  facts["run_json"] = str(run_json)
  if run.get("kind") == "prompting":  # `mcwq_t5x.prompt`: demonstrations of a part, no training
    part = run.get("demonstration_part")
    facts["train_part"] = part if isinstance(part, str) else None
    facts["train_languages"] = f"{run.get('shots')}-shot prompt"
    facts["size"] = run.get("model") if isinstance(run.get("model"), str) else None
    return facts
  facts["train_part"] = readers.DATASET_SPLIT_TO_PART.get(run.get("split"))
  if isinstance(run.get("network"), dict):
    facts["size"] = model_size(run["network"])
  task = run.get("task")
  if isinstance(task, str) and _MIXTURE_RE.match(f"{task}_test.txt"):
    facts["train_languages"] = MULTILINGUAL
  return facts


#: The `T5Config` fields that make a model's size and shape (not its dtype, dropout or memory use).
_SHAPE_FIELDS = ("emb_dim", "num_heads", "num_encoder_layers", "num_decoder_layers", "head_dim",
                 "mlp_dim", "mlp_activations", "logits_via_embedding")


def model_size(fields: Mapping[str, Any]) -> str:
  """The size of a run.json's "network": the title of the preset it has the shape of, else
  "d_model D, E+D layers"."""
  from mcwq_t5x.engine import network  # pylint: disable=g-import-not-at-top  # flax: only if needed

  def shape(f):
    return tuple(
        list(v) if isinstance(v, (list, tuple)) else v for v in (f.get(k) for k in _SHAPE_FIELDS))

  for name, config in network.CONFIGS.items():
    if shape(fields) == shape(dataclasses.asdict(config)):
      return SIZE_TITLES.get(name, name)
  return (f"d_model {fields.get('emb_dim')}, {fields.get('num_encoder_layers')}+"
          f"{fields.get('num_decoder_layers')} layers")


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
  matches = [_TRAIN_RE.match(n) or _MIXTURE_RE.match(n) for n in names]
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
