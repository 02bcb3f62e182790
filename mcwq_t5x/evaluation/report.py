"""Reproduction report: the MCWQ paper's result tables and analysis figures from predictions
(the command line is `python -m mcwq_t5x.report`).

Reads every prediction file under RESULTS_DIR, scores it against the gold queries
(`mcwq_t5x.evaluation.metrics`), checks that it belongs to them and reads as UTF-8
(`mcwq_t5x.evaluation.prediction_checks`: a warning on stderr, in report.md and results.json
otherwise) and writes, under --out (default `./mcwq_report`):

  * `report.md`: all tables in Markdown, plus warnings, the list of files read and skipped
    analyses;
  * `table4_monolingual_{exact_match,bleu,equivalence}.csv` (paper Table 4: per split x
    language, with "MCD mean" = mean over the MCD splits present when there are two or more),
    and the published reference rows (`mcwq_t5x.evaluation.published`, marked "published:";
    `--no_published` leaves them out);
  * `table5_zeroshot_{exact_match,bleu,equivalence}.csv` (Table 5: English-trained models on
    he/kn/zh; the "en" column is the same model's monolingual English result);
  * `table6_gold_test.csv` (Table 6: test-intersection-MT vs test-intersection-gold);
  * every exact match with its 95% bootstrap confidence interval (`mcwq_t5x.evaluation.
    uncertainty`: percentile method, 10,000 resamples of the test examples, fixed seed 0): in
    the CSV files the columns `<column> 95% CI low` and `<column> 95% CI high` after the values,
    in report.md "77.6 (76.5–78.7)";
  * `unseen_compounds_exact_match.csv` and `unseen_compounds_costliest.csv`, and the figure
    `unseen_{mode}_{split}.png`: exact match by number of unseen compounds and the unseen
    compounds that cost most (`mcwq_t5x.evaluation.compounds`), for the splits whose training
    part `--data_dir` holds (a full release, a `preprocessing.make_splits` release; the shared
    copy of the published splits has none, and a note says so);
  * `seeds_exact_match.csv`: runs of one configuration with different seeds (model names
    `<configuration>_seed<k>`), mean ± 95% Student-t interval (`uncertainty.runs_interval`);
  * `error_categories.csv` (§6.2 counts per model/mode/split/language);
  * `split_divergences.csv`: DBCA atom and compound divergence (`mcwq_t5x.data.divergence`; Keysers et
    al. 2020) between the parts of every split reported on, for the parts `--data_dir` holds
    (dev/test in the shared copy; train/dev, train/test, dev/test in a full release);
  * `results.json` (every score; `--compare A B` adds the paired comparison of two prediction
    files, `compare`);
  * with `--html DIR`, the error browser `DIR/index.html` (`mcwq_t5x.evaluation.browser`), which
    each table cell of report.md links to;
  * figures (PNG, matplotlib Agg): `errors_{model}_{mode}_{split}.png` (error categories per
    language, Figures 5-6) and, when recursionDepth is known, `complexity_{model}_{mode}_{split}.png`
    (accuracy by complexity per language, Figure 4).

Splits and languages: the published ones (columns en, he, kn, zh; rows MCD1-3, MCD mean, Random)
and any other a prediction file names (`mcwq_t5x.train` output of a release's tasks, e.g.
`mcwq_cfq_sample_zeroshot_fr_test.txt`): other languages are further columns (sorted), other splits
further rows. `--split validation` scores the predictions on the validation (`dev`) part instead
of the test part (for a release without a test part, such as the migrated CFQ sample); the gold
test set and Table 6 are test-only.

Prediction layouts (one predicted RIR query per line, line-parallel with the gold file):

  1. upstream `mcwq/results/`: `{model}/{monolingual,zeroshot}/{split}/generated_predictions_{lang}.txt`
     and `..._{lang}-gold.txt` (predictions on the human-translated gold test set); split, mode
     and model are read from the file's full path, so RESULTS_DIR may be any directory above
     the files (a missing mode directory means "monolingual").
  2. simple: `predictions_{split}_{lang}.txt` and `predictions_{split}_{lang}-gold.txt`
     anywhere under RESULTS_DIR (split one of mcd1, mcd2, mcd3, random_split; `-gold` = the gold
     test set, scored by the model trained on that split). The model is the first directory
     below RESULTS_DIR (RESULTS_DIR's own name if the file lies directly in it); the mode is
     "zeroshot" if a directory on the way is named `zeroshot`, else "monolingual".
  3. `mcwq_t5x.train` output: `MODEL_DIR/predictions/{task}_test.txt` with the task names of
     `tasks/mcwq.py`: `mcwq_{split}_{lang}` (monolingual), `mcwq_{split}_zeroshot_{lang}`
     (zero-shot) and `mcwq_gold_{lang}` (gold test set; its split is that of the other test
     predictions in the directory, skipped if that is not unique), each also as `…_prefixed`.
     `mcwq_t5x.eval` writes the same files to `MODEL_DIR/eval_<step>/predictions/` (its default
     EVAL_OUTPUT_DIR; the generated eval files use `MODEL_DIR/{test,zeroshot,gold}_<lang>`).
     The model is the run's name: MODEL_DIR (the folder CHECKPOINT_PATH names), never
     `eval_<step>`; predictions written outside any MODEL_DIR (EVAL_OUTPUT_DIR=runs/zs_he) take
     the name of the run whose checkpoint their metrics JSON records (`checkpoint_run_name`). A
     second file of the same run and test set is skipped. Validation (`_validation.txt`)
     predictions are read only with `--split validation` (and then the test ones are not).

Gold queries: `{targets_dir}/{split}/test.{lang}.sparql` (RIR) and `{targets_dir}/gold/test.{lang}.sparql`;
when a split has no such file, `readers.read_split(split, "test", lang, data_dir)` (official
SPARQL converted to RIR, or the full release). recursionDepth (for Figure 4) comes from the
full release (`dataset.json` + `splits/` in --data_dir, default the parent of --targets_dir),
used only if its test queries equal the gold file's line by line; otherwise the figure is
skipped with a message.

Test-intersection (Table 6): the gold set's examples are found in the split's test set with
`metrics.match_test_intersection` (same RIR target, then the most similar question of the same
language); the MT and gold columns score the split's predictions and the gold-set predictions on
those matched examples only (like with like), the `(all n)` columns every gold example.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os
import pathlib
import re
import sys
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from mcwq_t5x.data import divergence
from mcwq_t5x.data import readers
from mcwq_t5x.data import writers
from mcwq_t5x.evaluation import compounds
from mcwq_t5x.evaluation import metrics
from mcwq_t5x.evaluation import prediction_checks
from mcwq_t5x.evaluation import published
from mcwq_t5x.evaluation import score as score_lib
from mcwq_t5x.evaluation import uncertainty

SPLITS = readers.SPLITS
MCD_SPLITS = tuple(s for s in SPLITS if s.startswith("mcd"))
LANGUAGES = readers.LANGUAGES
GOLD_LANGUAGES = readers.GOLD_LANGUAGES
MODES = ("monolingual", "zeroshot")
GOLD = readers.GOLD_SPLIT
MCD_MEAN = published.MCD_MEAN
SPLIT_TITLES = {
    "mcd1": "MCD1",
    "mcd2": "MCD2",
    "mcd3": "MCD3",
    MCD_MEAN: "MCD mean",
    "random_split": "Random"
}
SCORES = ("exact_match", "bleu", "equivalence")
SCORE_TITLES = {
    "exact_match": "exact match (%)",
    "bleu": "BLEU",
    "equivalence": "query equivalence (%)"
}

#: A language code in a file name (`readers.LANGUAGE_CODE_RE`) and a split name.
_LANG = r"(?P<lang>[a-z]{2,3})"
_SPLIT = r"(?P<split>[A-Za-z0-9][A-Za-z0-9_]*?)"
_UPSTREAM_RE = re.compile(r"^generated_predictions_%s(?P<gold>-gold)?\.txt$" % _LANG)
_TRAIN_RE = re.compile(
    r"^mcwq_%s(?P<zeroshot>_zeroshot)?_%s(?P<prefixed>_prefixed)?_(?P<part>test|validation)\.txt$" %
    (_SPLIT, _LANG))
#: Folders that `mcwq_t5x.eval` (EVAL_OUTPUT_DIR default `MODEL_DIR/eval_<step>`) and the
#: generated eval files (`MODEL_DIR/{test,zeroshot,gold}_<lang>`) put inside a run:
#: the model is named after the run folder above them.
_EVAL_SUBDIR_RE = re.compile(r"^(eval(_\d+)?|(test|zeroshot|gold)_[a-z]{2,3})$")
_OWN_RE = re.compile(r"^predictions_%s_%s(?P<gold>-gold)?\.txt$" % (_SPLIT, _LANG))
#: seqio split -> MCWQ part of the gold queries.
EVAL_SPLITS = {"test": "test", "validation": "dev"}


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
    found.append(PredictionFile(model, mode, split, m.group("lang"), bool(m.group("gold")), path))
  return sorted(found, key=lambda f: (f.model, f.mode, f.split, f.language, f.gold))


def _train_layout_file(path: pathlib.Path, m: re.Match) -> Optional[PredictionFile]:
  """A `MODEL_DIR/predictions/{task}_test.txt` file of `mcwq_t5x.train` (layout 3)."""
  directory = path.parent
  model = run_name(directory)
  if not _is_model_dir(run_dir(directory)):
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


_CHECKPOINT_STEP_RE = re.compile(r"^checkpoint_\d+$")


def _is_model_dir(directory: pathlib.Path) -> bool:
  """Whether `directory` is a training run's MODEL_DIR (run.json, config.gin or checkpoints)."""
  return ((directory / "run.json").is_file() or (directory / "config.gin").is_file() or
          any(directory.glob("checkpoint_*")))


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
  if directory.name != "predictions":
    return None
  record_path = directory.parent / "metrics" / (path.stem + ".json")
  try:
    record = json.loads(record_path.read_text(encoding="utf-8"))
  except (OSError, ValueError):
    return None
  checkpoint = record.get("checkpoint") if isinstance(record, dict) else None
  if not isinstance(checkpoint, str) or not checkpoint.strip():
    return None
  parts = [p for p in re.split(r"[/\\]+", checkpoint.strip()) if p]
  while parts and _CHECKPOINT_STEP_RE.match(parts[-1]):
    parts.pop()
  return parts[-1] if parts else None


def run_dir(directory: pathlib.Path) -> pathlib.Path:
  """The run folder of predictions in `directory` (MODEL_DIR, or the folder CHECKPOINT_PATH
  names): not `predictions/` nor the `eval_<step>/` (`{test,zeroshot,gold}_<lang>/`) folder that
  `mcwq_t5x.eval` writes into it."""
  d = directory.absolute()
  if d.name == "predictions":
    d = d.parent
  while _EVAL_SUBDIR_RE.match(d.name) and d.parent != d:
    d = d.parent
  return d


def run_name(directory: pathlib.Path) -> str:
  """The model name of predictions in `directory`: the name of `run_dir(directory)`."""
  return run_dir(directory).name or "model"


def _test_splits(names: Sequence[str]) -> list[str]:
  """The training splits named by test prediction files (gold ones aside)."""
  matches = [_TRAIN_RE.match(n) for n in names]
  return sorted({m.group("split") for m in matches if m and m.group("split") != GOLD})


@dataclasses.dataclass
class GoldSet:
  """Gold queries of one test set: RIR targets, questions and depths (None when unknown), the
  file of the targets and that of the questions (None: the targets' file, or no questions)."""
  targets: list[str]
  questions: Optional[list[str]]
  depths: Optional[list[Optional[int]]]
  source: str
  questions_source: Optional[str] = None


class _GoldLoader:
  """Loads and caches gold sets; records why depths are unavailable."""

  def __init__(self, targets_dir: pathlib.Path, data_dir: pathlib.Path, part: str = "test"):
    self.targets_dir = targets_dir
    self.data_dir = data_dir
    self.part = part  # of every split but the gold set (test only)
    self._cache: dict[tuple[str, str], Optional[GoldSet]] = {}
    self.messages: list[str] = []

  def get(self, split: str, language: str) -> Optional[GoldSet]:
    key = (split, language)
    if key not in self._cache:
      self._cache[key] = self._load(split, language)
    return self._cache[key]

  def _load(self, split: str, language: str) -> Optional[GoldSet]:
    part = "test" if split == GOLD else self.part
    rir_file = self.targets_dir / split / f"{part}.{language}.sparql"
    question_file = rir_file.with_suffix(".txt")
    if rir_file.is_file():
      targets = score_lib.load_targets(rir_file)
      questions = (readers.read_lines(question_file) if question_file.is_file() else None)
      if questions is not None and len(questions) != len(targets):
        questions = None
      source = str(rir_file)
      questions_source = None if questions is None else str(question_file)
    elif split == GOLD:
      self.messages.append(f"no gold targets {rir_file}")
      return None
    else:
      try:
        examples = readers.read_split(split, part, language, self.data_dir)
      except (FileNotFoundError, ValueError) as e:
        self.messages.append(f"no targets for {split}/{part}/{language}: {e}")
        return None
      targets = [e.rir for e in examples]
      questions = [e.question for e in examples]
      source = examples[0].source if examples else str(self.data_dir)
      questions_source = None
    return GoldSet(targets, questions, self._depths(split, language, targets), source,
                   questions_source)

  def _depths(self, split: str, language: str, targets: list[str]) -> Optional[list]:
    if split == GOLD:
      return None
    dataset = self.data_dir / "dataset.json"
    if not (dataset.is_file() and (self.data_dir / "splits" / f"{split}.json").is_file()):
      self.messages.append(
          f"accuracy by complexity skipped for {split}/{language}: no recursionDepth "
          f"(needs the full release's {dataset} and splits/{split}.json)")
      return None
    try:
      examples = readers.read_release(self.data_dir, split, self.part, language)
    except (FileNotFoundError, ValueError) as e:
      self.messages.append(f"accuracy by complexity skipped for {split}/{language}: {e}")
      return None
    if [(e.rir or "").strip() for e in examples] != [t.strip() for t in targets]:
      self.messages.append(
          f"accuracy by complexity skipped for {split}/{language}: the {self.part} queries of "
          f"{dataset} are not line-parallel with the gold file")
      return None
    return [e.recursionDepth for e in examples]


def _intersection_index(loader: _GoldLoader, split: str, gold_set: GoldSet, mcd_set: GoldSet,
                        cache: dict[str, list[Optional[int]]]) -> list[Optional[int]]:
  """Gold-set line -> line of `split`'s test set (`metrics.match_test_intersection`), using the
  questions of every gold language that both sides have (one mapping for all languages, since
  the gold files of all languages are line-parallel)."""
  if split in cache and len(cache[split]) == len(gold_set.targets):
    return cache[split]
  gold_questions, mcd_questions = {}, {}
  for lang in GOLD_LANGUAGES:
    g, m = loader.get(GOLD, lang), loader.get(split, lang)
    if (g is not None and m is not None and g.questions is not None and m.questions is not None and
        g.targets == gold_set.targets and m.targets == mcd_set.targets):
      gold_questions[lang], mcd_questions[lang] = g.questions, m.questions
  index = metrics.match_test_intersection(gold_set.targets, mcd_set.targets, gold_questions or None,
                                          mcd_questions or None)
  found = sum(j is not None for j in index)
  loader.messages.append(
      f"test-intersection: {found} of {len(index)} gold examples found in the {split} test set "
      f"(matched on the target query and the {'/'.join(gold_questions) or 'no'} questions)")
  cache[split] = index
  return index


def _scores(result: dict[str, Any]) -> dict[str, float]:
  return {k: result[k] for k in SCORES}


def _correct(targets: Sequence[str], predictions: Sequence[str]) -> np.ndarray:
  """Per-example exact match (whitespace-stripped strings equal), as `metrics.exact_match_metric`."""
  return np.array([t.strip() == p.strip() for t, p in zip(targets, predictions)], dtype=bool)


def _interval(*correct: np.ndarray) -> Optional[list[float]]:
  ci = uncertainty.exact_match_interval(correct)
  return list(ci) if ci is not None else None


def run_key(run: dict[str, Any]) -> tuple[str, str, str, str, bool]:
  """(model, mode, split, language, gold) of a run of `build`."""
  return (run["model"], run["mode"], run["split"], run["language"], run["gold"])


def _set_key(split: str, part: str, language: str) -> str:
  return f"{split}/{part}/{language}"


Progress = Optional[Callable[[str], None]]


def build(results_dir: str | pathlib.Path,
          targets_dir: str | pathlib.Path,
          data_dir: Optional[str | pathlib.Path] = None,
          eval_split: str = "test",
          progress: Progress = None) -> dict[str, Any]:
  """Scores every prediction file under `results_dir` and assembles the paper's analyses, the
  95% bootstrap intervals of every exact match (`uncertainty`) and the unseen-compound diagnosis
  (`compounds`).

  Args:
    results_dir: predictions (layouts in the module docstring).
    targets_dir: the `translations/` directory with `{split}/test.{lang}.sparql` and `gold/`.
    data_dir: MCWQ directory for `readers` fallbacks, recursionDepth and the training parts of
      the unseen-compound diagnosis; default `targets_dir`'s parent.
    eval_split: "test", or "validation" (`mcwq_t5x.train`/`eval` predictions of the validation
      split, scored against the `dev` part).
    progress: called with a line of text before each step that may take seconds (files scored,
      training parts read, divergences); None: silent.

  Returns:
    {"runs": [one dict per prediction file: model, mode, split, language, gold, path, n, scores,
      exact_match_ci ([low, high], percent), error_categories, by_complexity (or None),
      by_unseen and costliest (or None: `compounds.by_unseen`, `compounds.costliest`, with
      "ci" per bucket), alignment (`prediction_checks.check_alignment`)],
     "intersection": [one dict per gold prediction file: model, mode, split, language,
      matched, n_gold, mt and gold: scores and exact_match_ci on the matched examples (None if
      none), gold_all: scores and exact_match_ci on all n_gold],
     "divergences": [`split_divergences`],
     "messages": [skipped analyses and files, with reasons], "warnings": [prediction files that
      do not seem to belong to their gold lines, or have lines that are not valid UTF-8: each
      names the files (`prediction_checks.check_prediction_file`); they are scored all the same],
     "eval_split": eval_split,
     "_examples": the per-example data of the error browser (not written to results.json):
      {"sets": {key: {"split", "part", "language", "targets", "questions", "depths", "unseen"}},
       "runs": [{"set": key, "predictions", "categories", "correct"} parallel to "runs"]}}

  Raises:
    FileNotFoundError: `results_dir` does not exist.
    score.InputError: a prediction file's length differs from its gold file, or a gold file
      is malformed.
    readers.DataFormatError: a gold or question file is not UTF-8.
    ValueError: an unknown `eval_split`.
  """
  if eval_split not in EVAL_SPLITS:
    raise ValueError(f"eval_split {eval_split!r}: expected one of {tuple(EVAL_SPLITS)}")
  say = progress or (lambda _: None)
  targets_dir = pathlib.Path(targets_dir)
  data_dir = pathlib.Path(data_dir) if data_dir is not None else targets_dir.parent
  loader = _GoldLoader(targets_dir, data_dir, EVAL_SPLITS[eval_split])
  runs: list[dict[str, Any]] = []
  examples: dict[str, Any] = {"sets": {}, "runs": []}
  warnings: list[str] = []
  predictions_of: dict[tuple, list[str]] = {}
  first_path: dict[tuple, pathlib.Path] = {}
  files = discover(results_dir, eval_split)
  for number, pf in enumerate(files, start=1):
    key = (pf.model, pf.mode, pf.split, pf.language, pf.gold)
    if key in first_path:  # e.g. MODEL_DIR/predictions and MODEL_DIR/eval_<step>/predictions
      loader.messages.append(f"skipped {pf.path}: the same run and test set as {first_path[key]}")
      continue
    first_path[key] = pf.path
    say(f"scoring {number}/{len(files)}: {pf.path}")
    gold_set = loader.get(GOLD if pf.gold else pf.split, pf.language)
    if gold_set is None:
      loader.messages.append(f"skipped {pf.path}: no gold queries")
      continue
    preds = readers.read_lines(pf.path, strict=False)
    score_lib.check_same_length("predictions", pf.path, preds, "targets", gold_set.source,
                                gold_set.targets)
    result = metrics.score_predictions(gold_set.targets, preds, per_example=True)
    correct = np.array([c == metrics.CORRECT for c in result["categories"]], dtype=bool)
    checks = prediction_checks.check_prediction_file(pf.path, preds, gold_set.source,
                                                     gold_set.targets, gold_set.questions_source,
                                                     gold_set.questions)
    warnings += checks["warnings"]
    by_complexity = None
    if gold_set.depths is not None:
      by_complexity = metrics.accuracy_by_complexity(gold_set.targets, preds, gold_set.depths)
    part = "test" if pf.gold else loader.part
    set_key = _set_key(GOLD if pf.gold else pf.split, part, pf.language)
    examples["sets"].setdefault(
        set_key,
        dict(
            split=GOLD if pf.gold else pf.split,
            part=part,
            language=pf.language,
            targets=gold_set.targets,
            questions=gold_set.questions,
            depths=gold_set.depths,
            unseen=None))
    examples["runs"].append(
        dict(set=set_key, predictions=preds, categories=result["categories"], correct=correct))
    runs.append(
        dict(
            model=pf.model,
            mode=pf.mode,
            split=pf.split,
            language=pf.language,
            gold=pf.gold,
            path=str(pf.path),
            n=result["n"],
            **_scores(result),
            exact_match_ci=_interval(correct),
            error_categories=result["error_categories"],
            by_complexity=by_complexity,
            by_unseen=None,
            costliest=None,
            alignment=checks["alignment"]))
    predictions_of[key] = preds

  intersection = []
  index_cache: dict[str, list[Optional[int]]] = {}
  for run in runs:
    if not run["gold"]:
      continue
    key = (run["model"], run["mode"], run["split"], run["language"])
    mt_preds = predictions_of.get(key + (False,))
    gold_set = loader.get(GOLD, run["language"])
    mcd_set = loader.get(run["split"], run["language"])
    entry = dict(
        model=run["model"],
        mode=run["mode"],
        split=run["split"],
        language=run["language"],
        n_gold=run["n"],
        gold_all=dict({k: run[k] for k in SCORES}, exact_match_ci=run["exact_match_ci"]),
        gold=None,
        matched=0,
        mt=None)
    if mt_preds is None or mcd_set is None:
      loader.messages.append(
          f"test-intersection-MT for {'/'.join(key)}: no predictions on the {run['split']} "
          "test set")
    else:
      index = _intersection_index(loader, run["split"], gold_set, mcd_set, index_cache)
      pairs = [(i, j) for i, j in enumerate(index) if j is not None]
      entry["matched"] = len(pairs)
      if pairs:  # like with like: both columns score the same matched examples
        gold_preds = predictions_of[key + (True,)]
        for name, targets, preds in (("mt", [mcd_set.targets[j] for _, j in pairs], [
            mt_preds[j] for _, j in pairs
        ]), ("gold", [gold_set.targets[i] for i, _ in pairs], [gold_preds[i] for i, _ in pairs])):
          entry[name] = dict(
              _scores(metrics.score_predictions(targets, preds)),
              exact_match_ci=_interval(_correct(targets, preds)))
    intersection.append(entry)
  splits = sorted({r["split"] for r in runs})
  unseen_compounds(runs, examples, data_dir, loader.messages, say)
  say(f"divergences of {', '.join(splits) or 'no split'}")
  return {
      "runs": runs,
      "intersection": intersection,
      "divergences": split_divergences(splits, data_dir, loader.messages),
      "messages": loader.messages,
      "warnings": warnings,
      "eval_split": eval_split,
      "_examples": examples
  }


def unseen_compounds(runs: Sequence[dict[str, Any]], examples: dict[str, Any],
                     data_dir: pathlib.Path, messages: list[str], say: Callable[[str],
                                                                                None]) -> None:
  """The unseen-compound diagnosis (`mcwq_t5x.evaluation.compounds`) of every run that is not on
  the gold test set: fills each run's "by_unseen" (with a 95% bootstrap interval per bucket) and
  "costliest", and each test set's "unseen" in `examples`. Splits without a training part under
  `data_dir` get one line in `messages`."""
  splits = sorted({r["split"] for r in runs if not r["gold"]})
  without_train, train_of = [], {}
  for split in splits:
    say(f"unseen compounds: reading the training part of {split}")
    try:
      train_of[split] = compounds.training_compounds(split, data_dir)
    except (ValueError, OSError) as e:
      messages.append(f"unseen compounds of {split} skipped: {e}")
      continue
    if train_of[split] is None:
      without_train.append(split)
  if without_train:
    messages.append(
        f"unseen compounds skipped for {', '.join(without_train)}: {data_dir} holds no training "
        "part of it (the diagnosis compares each test query with the training queries; it needs "
        "a full release or one written by preprocessing.make_splits)")
  for run, data in zip(runs, examples["runs"]):
    train = train_of.get(run["split"])
    if run["gold"] or train is None:
      continue
    test_set = examples["sets"][data["set"]]
    if test_set["unseen"] is None:
      try:
        test_set["unseen"] = compounds.unseen_compounds(test_set["targets"], train, data["set"])
      except ValueError as e:
        messages.append(f"unseen compounds of {data['set']} skipped: {e}")
        continue
    unseen = test_set["unseen"]
    table = compounds.by_unseen(data["correct"], unseen)
    for bucket, row in table.items():
      members = np.array([compounds.bucket_name(len(u)) == bucket for u in unseen])
      row["ci"] = _interval(data["correct"][members])
    run["by_unseen"] = table
    run["costliest"] = compounds.costliest(data["correct"], unseen)


def split_divergences(splits: Sequence[str], data_dir: pathlib.Path,
                      messages: list[str]) -> list[dict[str, Any]]:
  """DBCA atom and compound divergences between the parts of each split (`mcwq_t5x.data.divergence`;
  Keysers et al. 2020 §2) that `data_dir` holds at least two parts of.

  Returns:
    [{"split", "parts": "dev/test", "sizes": [n_a, n_b], "atom", "compound"}]; a split without
    two parts, or whose data cannot be read, gets a line in `messages` instead.
  """
  out = []
  for split in splits:
    try:
      figures = divergence.split_figures(split, data_dir)
    except (ValueError, OSError) as e:
      messages.append(f"divergences of {split} skipped: {e}")
      continue
    if not figures:
      messages.append(f"divergences of {split} skipped: {data_dir} holds fewer than two of its "
                      "parts (train, dev, test)")
    for a, b, n_a, n_b, d in figures:
      out.append({
          "split": split,
          "parts": f"{a}/{b}",
          "sizes": [n_a, n_b],
          "atom": d.atom,
          "compound": d.compound
      })
  return out


# ----------------------------------------------------------------------------------------------
# Tables.


def _title(split: str) -> str:
  """Row title of a split: the paper's for the published ones, the name for a release's own."""
  return SPLIT_TITLES.get(split, split)


def columns(runs: Sequence[dict]) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(languages, splits) of the tables: the published ones, then the others the runs have, sorted."""
  languages = LANGUAGES + tuple(sorted({r["language"] for r in runs} - set(LANGUAGES)))
  splits = SPLITS + tuple(sorted({r["split"] for r in runs} - set(SPLITS) - {GOLD}))
  return languages, splits


#: Suffixes of the columns that hold a value's 95% bootstrap interval (`uncertainty`).
CI_LOW, CI_HIGH = "95% CI low", "95% CI high"
#: Model names of several runs of one configuration: `<configuration>_seed<k>` (also `-seed<k>`,
#: `_seed_<k>`); their runs are summarised in the seeds table (`uncertainty.runs_interval`).
SEED_RE = re.compile(r"^(?P<base>.+?)[_-]seed[_-]?(?P<seed>\d+)$")

#: Filters of the error browser (`browser`) behind a cell: field -> value or list of values.
Filters = dict[str, Any]
#: Per table: per row, {column index: filters} of the cells that link to their examples.
Links = dict[str, list[dict[int, Filters]]]


def _part(report: dict[str, Any]) -> str:
  return EVAL_SPLITS[report.get("eval_split", "test")]


def _run_filters(run: dict[str, Any], part: str, **more: Any) -> Filters:
  filters = {
      "model": run["model"],
      "mode": run["mode"],
      "split": run["split"],
      "test": GOLD if run["gold"] else part,
      "language": run["language"]
  }
  filters.update(more)
  return filters


def _correct_of(report: dict[str, Any]) -> dict[tuple, np.ndarray]:
  """run_key -> per-example exact match, when the report holds its examples (`build`)."""
  data = report.get("_examples")
  if not data:
    return {}
  return {run_key(r): d["correct"] for r, d in zip(report["runs"], data["runs"])}


def _split_rows(runs: Sequence[dict],
                model: str,
                mode: str,
                score: str,
                languages: Sequence[str],
                fallback_en: Optional[Sequence[dict]] = None,
                splits: Sequence[str] = SPLITS,
                correct_of: Optional[dict[tuple, np.ndarray]] = None,
                part: str = "test") -> tuple[list[list[Any]], list[dict[int, Filters]]]:
  """Rows [model, split, value per language] (for exact match also each language's 95% CI low
  and high, after the values), with "MCD mean" (the mean over the MCD splits present, when there
  are two or more; its interval resamples each split's test set), and each row's cell links."""

  def find(split, lang, pool):
    for r in pool:
      if (r["model"], r["split"], r["language"], r["gold"]) == (model, split, lang, False):
        return r
    return None

  with_ci = score == "exact_match"
  pool = [r for r in runs if r["mode"] == mode]
  table: dict[str, dict[str, Optional[dict]]] = {}
  for split in splits:
    found = {}
    for lang in languages:
      r = find(split, lang, pool)
      if r is None and lang == "en" and fallback_en is not None:
        r = find(split, lang, fallback_en)
      found[lang] = r
    table[split] = found
  present = [s for s in splits if any(r is not None for r in table[s].values())]
  mcd_present = [s for s in MCD_SPLITS if s in present]
  n = len(languages)

  def split_row(split):
    row = [model, _title(split)
          ] + [table[split][l][score] if table[split][l] else None for l in languages]
    links = {
        2 + i: _run_filters(table[split][l], part)
        for i, l in enumerate(languages)
        if table[split][l]
    }
    if with_ci:
      for l in languages:
        r = table[split][l]
        row += list(r["exact_match_ci"]) if r and r.get("exact_match_ci") else [None, None]
    return row, links

  def mean_row():
    row = [model, MCD_MEAN]
    links = {}
    intervals = []
    for i, lang in enumerate(languages):
      members = [table[s][lang] for s in mcd_present]
      if all(r is not None for r in members):
        row.append(float(np.mean([r[score] for r in members])))
        links[2 + i] = dict(_run_filters(members[0], part), split=list(mcd_present))
        vectors = [(correct_of or {}).get(run_key(r)) for r in members]
        intervals.append(
            _interval(*vectors) if with_ci and all(v is not None for v in vectors) else None)
      else:
        row.append(None)
        intervals.append(None)
    if with_ci:
      for ci in intervals:
        row += ci if ci else [None, None]
    assert len(row) == 2 + n * (3 if with_ci else 1)
    return row, links

  rows, links = [], []
  for split in present:
    if split == "random_split" and len(mcd_present) > 1:
      r, l = mean_row()
      rows.append(r)
      links.append(l)
    r, l = split_row(split)
    rows.append(r)
    links.append(l)
  if len(mcd_present) > 1 and "random_split" not in present:
    at = max(present.index(s) for s in mcd_present) + 1  # after the MCD rows
    r, l = mean_row()
    rows.insert(at, r)
    links.insert(at, l)
  return rows, links


def _published_rows(mode: str, languages: Sequence[str], splits: set[str]) -> list[list[Any]]:
  """The published reference rows (`published`) of Table 4 or 5 for the published splits the
  report has in that mode (none for a release with only its own splits)."""
  if not splits & set(SPLITS):
    return []
  rows = []
  for p in published.rows_for(mode):
    rows.append([p.label, _title(p.split)] + [p.exact_match.get(l) for l in languages] +
                [None, None] * len(languages))
  return rows


def _ci_header(columns_with_ci: Sequence[str]) -> list[str]:
  return [f"{c} {bound}" for c in columns_with_ci for bound in (CI_LOW, CI_HIGH)]


def seed_groups(runs: Sequence[dict]) -> list[dict[str, Any]]:
  """Runs of one configuration with different seeds (model names `SEED_RE`), two or more per
  (configuration, mode, split, language, test set): mean exact match ± the 95% Student-t
  half-width (`uncertainty.runs_interval`), min and max.

  Returns:
    [{"model": configuration, "mode", "split", "language", "gold", "models": [names],
      "runs": r, "mean", "half_width", "min", "max"}], sorted.
  """
  groups: dict[tuple, list[dict]] = {}
  for r in runs:
    m = SEED_RE.match(r["model"])
    if m:
      groups.setdefault((m.group("base"), r["mode"], r["split"], r["language"], r["gold"]),
                        []).append(r)
  out = []
  for (base, mode, split, language, gold), members in sorted(groups.items()):
    if len(members) < 2:
      continue
    values = [r["exact_match"] for r in members]
    mean, half = uncertainty.runs_interval(values)
    out.append(
        dict(
            model=base,
            mode=mode,
            split=split,
            language=language,
            gold=gold,
            models=sorted(r["model"] for r in members),
            runs=len(members),
            mean=mean,
            half_width=half,
            min=min(values),
            max=max(values)))
  return out


def tables(report: dict[str, Any],
           links: Optional[Links] = None,
           with_published: bool = True) -> dict[str, tuple[list[str], list[list[Any]]]]:
  """The report's tables as {name: (header, rows)}; values are floats or None (missing).

  Exact-match columns are followed (at the end of the row) by their 95% bootstrap interval,
  columns `<column> 95% CI low` and `<column> 95% CI high` (`uncertainty.exact_match_interval`;
  empty for published rows and when the examples are not at hand).

  Args:
    report: `build`'s output.
    links: if given, filled with each table's cell links to the error browser's filters.
    with_published: add the published reference rows (`published`) to Tables 4 and 5.
  """
  runs = report["runs"]
  part = _part(report)
  correct_of = _correct_of(report)
  out: dict[str, tuple[list[str], list[list[Any]]]] = {}
  all_links: Links = {}
  models = sorted({r["model"] for r in runs})
  languages, splits = columns(runs)
  for mode, prefix in (("monolingual", "table4_monolingual"), ("zeroshot", "table5_zeroshot")):
    mono = [r for r in runs if r["mode"] == "monolingual"]
    for score in SCORES:
      rows, row_links = [], []
      for model in models:
        if mode == "zeroshot" and not any(r["model"] == model and r["mode"] == mode for r in runs):
          continue
        r, l = _split_rows(
            runs,
            model,
            mode,
            score,
            languages,
            fallback_en=mono if mode == "zeroshot" else None,
            splits=splits,
            correct_of=correct_of,
            part=part)
        rows += r
        row_links += l
      if not rows:
        continue
      header = ["model", "split"] + list(languages)
      if score == "exact_match":
        header += _ci_header(languages)
        if with_published:
          extra = _published_rows(mode, languages, {r["split"] for r in runs if r["mode"] == mode})
          rows += extra
          row_links += [{} for _ in extra]
      out[f"{prefix}_{score}"] = (header, rows)
      all_links[f"{prefix}_{score}"] = row_links
  rows, row_links = [], []
  for e in report["intersection"]:
    mt, gold, gold_all = e["mt"] or {}, e["gold"] or {}, e["gold_all"]
    rows.append([
        e["model"], e["mode"],
        _title(e["split"]), e["language"], e["n_gold"], e["matched"],
        mt.get("exact_match"),
        gold.get("exact_match"),
        mt.get("bleu"),
        gold.get("bleu"), gold_all["exact_match"], gold_all["bleu"]
    ] + [(d.get("exact_match_ci") or [None, None])[k]
         for d in (mt, gold, gold_all)
         for k in (0, 1)])
    gold_filters = dict(
        model=e["model"], mode=e["mode"], split=e["split"], test=GOLD, language=e["language"])
    row_links.append({4: gold_filters, 10: gold_filters})
  if rows:
    em = ["EM MT (matched)", "EM gold (matched)", "EM gold (all n)"]
    out["table6_gold_test"] = ([
        "model", "mode", "trained on", "language", "n gold", "matched in test", em[0], em[1],
        "BLEU MT (matched)", "BLEU gold (matched)", em[2], "BLEU gold (all n)"
    ] + _ci_header(em), rows)
    all_links["table6_gold_test"] = row_links
  rows, row_links = [], []
  for r in runs:
    rows.append([
        r["model"], r["mode"],
        _title(r["split"]) + (" gold" if r["gold"] else ""), r["language"], r["n"]
    ] + [r["error_categories"][c] for c in metrics.ERROR_CATEGORIES])
    row_links.append({4: _run_filters(r, part)})
    row_links[-1].update({
        5 + i: _run_filters(r, part, category=c) for i, c in enumerate(metrics.ERROR_CATEGORIES)
    })
  if rows:
    out["error_categories"] = (["model", "mode", "test set", "language", "n"] +
                               list(metrics.ERROR_CATEGORIES), rows)
    all_links["error_categories"] = row_links
  rows, row_links = [], []
  for r in runs:
    for bucket, b in (r.get("by_unseen") or {}).items():
      ci = b.get("ci") or [None, None]
      rows.append([
          r["model"], r["mode"],
          _title(r["split"]), r["language"], bucket, b["n"], b["correct"], b["exact_match"]
      ] + list(ci))
      row_links.append({5: _run_filters(r, part, unseen=bucket)})
  if rows:
    out["unseen_compounds_exact_match"] = ([
        "model", "mode", "split", "language", "unseen compounds", "n", "exact matches",
        "exact match"
    ] + _ci_header(["exact match"]), rows)
    all_links["unseen_compounds_exact_match"] = row_links
  rows, row_links = [], []
  for r in runs:
    for rank, c in enumerate(r.get("costliest") or (), start=1):
      rows.append([
          r["model"], r["mode"],
          _title(r["split"]), r["language"], rank, c["compound"], c["n_with"],
          c["exact_match_with"], c["exact_match_without"], c["cost"], c["lost"]
      ])
      row_links.append({6: _run_filters(r, part, compound=c["compound"])})
  if rows:
    out["unseen_compounds_costliest"] = ([
        "model", "mode", "split", "language", "rank", "unseen compound", "examples with it",
        "exact match with it", "exact match without it", "cost (points)", "exact matches lost"
    ], rows)
    all_links["unseen_compounds_costliest"] = row_links
  rows, row_links = [], []
  for g in seed_groups(runs):
    rows.append([
        g["model"], g["mode"],
        _title(g["split"]) + (" gold" if g["gold"] else ""), g["language"], g["runs"], g["mean"],
        g["half_width"], g["min"], g["max"], ", ".join(g["models"])
    ])
    row_links.append({
        5:
            dict(
                model=g["models"],
                mode=g["mode"],
                split=g["split"],
                test=GOLD if g["gold"] else part,
                language=g["language"])
    })
  if rows:
    out["seeds_exact_match"] = ([
        "model", "mode", "test set", "language", "runs", "mean exact match", "± (95%, Student t)",
        "min", "max", "runs (models)"
    ], rows)
    all_links["seeds_exact_match"] = row_links
  rows = [[_title(d["split"]), d["parts"], d["sizes"][0], d["sizes"][1], d["atom"], d["compound"]]
          for d in report.get("divergences", ())]
  if rows:
    out["split_divergences"] = ([
        "split", "parts (P/Q)", "n P", "n Q", "atom divergence", "compound divergence"
    ], rows)
    all_links["split_divergences"] = [{} for _ in rows]
  if links is not None:
    links.update(all_links)
  return out


def _fmt(value: Any, digits: int) -> str:
  if value is None:
    return "-"
  if isinstance(value, float):
    return f"{value:.{digits}f}"
  return str(value)


def merge_intervals(header: Sequence[str],
                    rows: Sequence[Sequence[Any]],
                    digits: int = 1) -> tuple[list[str], list[list[Any]], list[int]]:
  """A table for reading: each column with `<column> 95% CI low/high` columns becomes one text
  column "77.6 (76.5–78.7)"; the interval columns go.

  Returns:
    (header, rows, kept): `kept[j]` is the original index of the new column j.
  """
  index = {name: i for i, name in enumerate(header)}
  dropped = {index[f"{c} {b}"] for c in header for b in (CI_LOW, CI_HIGH) if f"{c} {b}" in index}
  kept = [i for i in range(len(header)) if i not in dropped]
  new_rows = []
  for row in rows:
    new = []
    for i in kept:
      value = row[i]
      low_i, high_i = index.get(f"{header[i]} {CI_LOW}"), index.get(f"{header[i]} {CI_HIGH}")
      if (low_i is not None and high_i is not None and value is not None and
          row[low_i] is not None and row[high_i] is not None):
        value = (f"{_fmt(value, digits)} ({_fmt(row[low_i], digits)}–"
                 f"{_fmt(row[high_i], digits)})")
      new.append(value)
    new_rows.append(new)
  return [header[i] for i in kept], new_rows, kept


def to_markdown(header: Sequence[str],
                rows: Sequence[Sequence[Any]],
                digits: int = 1,
                links: Optional[Sequence[dict[int, str]]] = None) -> str:
  """A Markdown table; floats with `digits` decimals, None as "-"; a cell with an entry in
  `links` (per row: {column: URL}) becomes a link."""
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
  for k, row in enumerate(rows):
    row_links = links[k] if links is not None and k < len(links) else {}
    cells = []
    for j, v in enumerate(row):
      text = _fmt(v, digits).replace("|", "\\|")
      cells.append(f"[{text}]({row_links[j]})" if j in row_links and v is not None else text)
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def write_csv(path: pathlib.Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
  """Writes a CSV table; floats with 4 decimals, None as an empty cell."""
  with writers.open_atomic(path, newline="") as f:  # whole or not at all
    writer = csv.writer(f)
    writer.writerow(header)
    for row in rows:
      writer.writerow(
          ["" if v is None else (f"{v:.4f}" if isinstance(v, float) else v) for v in row])


# ----------------------------------------------------------------------------------------------
# Figures.


def _pyplot():
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def plot_error_categories(runs: Sequence[dict], title: str, path: pathlib.Path) -> None:
  """Grouped bar chart: number of wrong predictions per error category, one bar per language
  (the paper's Figures 5-6). Exact matches ("correct") are left out."""
  plt = _pyplot()
  categories = metrics.ERROR_ONLY_CATEGORIES
  x = np.arange(len(categories))
  width = 0.8 / max(len(runs), 1)
  fig, ax = plt.subplots(figsize=(11, 4.5))
  for k, r in enumerate(runs):
    counts = [r["error_categories"][c] for c in categories]
    ax.bar(x + (k - (len(runs) - 1) / 2) * width, counts, width, label=r["language"])
  ax.set_xticks(x)
  ax.set_xticklabels([c.replace("_", " ") for c in categories], rotation=30, ha="right")
  ax.set_ylabel("predictions")
  ax.set_title(title)
  ax.legend(title="language")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_complexity(runs: Sequence[dict], title: str, path: pathlib.Path) -> None:
  """Exact-match accuracy by recursionDepth, one line per language (the paper's Figure 4)."""
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for r in runs:
    depths = sorted(r["by_complexity"])
    ax.plot(
        depths, [r["by_complexity"][d]["exact_match"] for d in depths],
        marker="o",
        label=r["language"])
  ax.set_xlabel("complexity (recursionDepth)")
  ax.set_ylabel("exact match (%)")
  ax.set_ylim(0, 100)
  ax.set_title(title)
  ax.legend(title="language")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def figures(report: dict[str, Any], out_dir: pathlib.Path) -> list[pathlib.Path]:
  """Writes the error-category and complexity figures; returns the PNG paths written.

  Complexity figures are skipped (with a message added to `report["messages"]`) for groups
  without recursionDepth.
  """
  written = []
  groups: dict[tuple, list[dict]] = {}
  for r in report["runs"]:
    groups.setdefault((r["model"], r["mode"], r["split"], r["gold"]), []).append(r)
  for (model, mode, split, gold), runs in sorted(groups.items()):
    name = f"{model}_{mode}_{split}" + ("-gold" if gold else "")
    part = "test" if report.get("eval_split", "test") == "test" else "validation"
    test_set = "gold test" if gold else f"{_title(split)} {part}"
    path = out_dir / f"errors_{name}.png"
    trained = ("English-trained, zero-shot" if mode == "zeroshot" else "monolingual")
    plot_error_categories(
        runs, f"Error categories: {model} ({trained}), trained on {_title(split)}, "
        f"{test_set}", path)
    written.append(path)
    with_depth = [r for r in runs if r["by_complexity"]]
    if with_depth:
      path = out_dir / f"complexity_{name}.png"
      plot_complexity(with_depth, f"Accuracy by complexity: {model} ({mode}), {test_set}", path)
      written.append(path)
    elif not gold:
      report["messages"].append(f"figure complexity_{name}.png skipped: recursionDepth unknown")
  # Exact match by unseen compounds: one figure per mode and split, a line per model and language.
  by_split: dict[tuple, list[dict]] = {}
  for r in report["runs"]:
    if r.get("by_unseen"):
      by_split.setdefault((r["mode"], r["split"]), []).append(r)
  for (mode, split), runs in sorted(by_split.items()):
    models = {r["model"] for r in runs}
    path = out_dir / f"unseen_{mode}_{split}.png"
    part = "test" if report.get("eval_split", "test") == "test" else "validation"
    compounds.plot_by_unseen(
        [
            dict(
                label=r["language"] if len(models) == 1 else f"{r['model']} ({r['language']})",
                by_unseen=r["by_unseen"]) for r in runs
        ], f"Exact match by unseen compounds ({mode}), {_title(split)} {part}"
        f"{' (' + next(iter(models)) + ')' if len(models) == 1 else ''}; 95% bootstrap intervals",
        path)
    written.append(path)
  return written


# ----------------------------------------------------------------------------------------------
# Command line.

TITLES = {
    "table4_monolingual":
        "Table 4: monolingual results",
    "table5_zeroshot":
        "Table 5: zero-shot cross-lingual results (trained on English; "
        "the en column is the English model's own test result)",
    "table6_gold_test":
        "Table 6: test-intersection-MT vs test-intersection-gold (exact match %, BLEU; the MT and "
        "gold columns score the same `matched in test` examples, the `all n` columns every gold "
        "example. The gold set was drawn from the MCD splits' test sets, so a model of another "
        "split matches only some of it)",
    "split_divergences":
        "Split divergences (DBCA, Keysers et al. 2020: atoms alpha 0.5, compounds "
        "alpha 0.1; mcwq_t5x.data.divergence)",
    "error_categories":
        "Error categories (§6.2; definitions in mcwq_t5x.evaluation.metrics.ErrorAnalysis)",
    "unseen_compounds_exact_match":
        "Exact match by number of unseen compounds (compounds of the test query that no "
        "training query contains; mcwq_t5x.evaluation.compounds)",
    "unseen_compounds_costliest":
        f"The costliest unseen compounds (found in at least {compounds.MIN_EXAMPLES} test "
        "examples; exact matches lost = examples with it x (exact match without it - with it) / "
        f"100; the top {compounds.TOP} per run; examples with one unseen compound usually have "
        "related ones too, so the cost is that of the examples, not of the compound alone)",
    "seeds_exact_match":
        "Several runs of one configuration (models named `<configuration>_seed<k>`): "
        "mean exact match ± the 95% Student-t interval over the runs "
        "(mcwq_t5x.evaluation.uncertainty.runs_interval)",
}

INTERVAL_NOTE = (
    f"Exact match in parentheses: its 95% bootstrap confidence interval (percentile method, "
    f"{uncertainty.N_RESAMPLES:,} resamples of the test examples, fixed seed {uncertainty.SEED}; "
    "an MCD mean resamples each split's test set; mcwq_t5x.evaluation.uncertainty).")


def heading(name: str) -> str:
  """The Markdown heading of table `name` of `tables`."""
  if name.startswith("table4") or name.startswith("table5"):
    score = next(s for s in SCORES if name.endswith(s))
    return f"{TITLES[name[:-len(score) - 1]]}, {SCORE_TITLES[score]}"
  return TITLES[name]


def published_note() -> str:
  """The sources of the published rows of Tables 4 and 5."""
  sources = dict.fromkeys(f"{p.citation}, \"{p.title}\"" for p in published.ROWS)
  return ("Rows `published: …` are exact match as printed in the papers (not recomputed; "
          "mcwq_t5x.evaluation.published): " + "; ".join(sources) + ".")


def comparison_markdown(c: dict[str, Any]) -> str:
  """One paragraph on a paired comparison (`compare`)."""
  return (f"A = `{c['a']}`, B = `{c['b']}` ({c['n']} examples of `{c['gold']}`): exact match "
          f"A {c['exact_match_a']:.1f}, B {c['exact_match_b']:.1f}, difference A - B "
          f"{c['difference']:+.1f} points, 95% paired bootstrap interval "
          f"[{c['interval'][0]:+.1f}, {c['interval'][1]:+.1f}] ({c['n_resamples']:,} resamples, "
          f"seed {c['seed']}); only A right on {c['only_a']}, only B on {c['only_b']}, both on "
          f"{c['both']}, neither on {c['neither']}; paired permutation test (exact, two-sided) "
          f"{format_p_value(c['p_value'])}.")


def format_p_value(p: float) -> str:
  """"p = 0.0415"; a p-value below the smallest normal float64 (the exact test's tail underflows
  to 0.0, e.g. 3,054 discordant pairs against 2) as "p < 1e-300", never "p = 0"."""
  return "p < 1e-300" if p < 1e-300 else f"p = {p:.3g}"


#: The list of the files a report wrote in its folder (only those are ever replaced).
MANIFEST = ".mcwq_report_files.json"
_FIGURE_PREFIXES = ("errors_", "complexity_", "unseen_")


class ForeignFileError(FileExistsError):
  """The report's folder holds files of its names that no report wrote (a user's report.md)."""


def check_own_files(folder: pathlib.Path, names: Sequence[str]) -> None:
  """Raises ForeignFileError naming the files of `names` in `folder` that `folder/MANIFEST` does
  not list (files this command did not write), so that they are never overwritten."""
  foreign = sorted(n for n in set(names) - _listed(folder) if (folder / n).exists())
  if foreign:
    raise ForeignFileError(
        f"{folder} holds {', '.join(foreign)}, which no report wrote ({MANIFEST} does not list "
        "them): move them away or give another --out/--html; nothing was written")


def record_own_files(folder: pathlib.Path, names: Sequence[str]) -> None:
  """Adds `names` to `folder/MANIFEST` (the files `check_own_files` lets a report replace)."""
  writers.write_atomic(folder / MANIFEST, json.dumps(sorted(_listed(folder) | set(names))) + "\n")


def _listed(folder: pathlib.Path) -> set[str]:
  try:
    return set(json.loads((folder / MANIFEST).read_text(encoding="utf-8")))
  except (OSError, ValueError, TypeError):  # no manifest (a new folder), or an unreadable one
    return set()


def write_report(report: dict[str, Any],
                 out_dir: str | pathlib.Path,
                 html_dir: Optional[str | pathlib.Path] = None,
                 with_published: bool = True,
                 comparisons: Sequence[dict[str, Any]] = (),
                 progress: Progress = None) -> dict[str, Any]:
  """Writes tables (Markdown + CSV), figures (PNG) and results.json under `out_dir`, and with
  `html_dir` the error browser (`browser.write_page`), whose examples each cell of report.md
  links to.

  Args:
    report: `build`'s output.
    out_dir: the report's folder.
    html_dir: the error browser's folder (None: no browser).
    with_published: add the published reference rows to Tables 4 and 5.
    comparisons: paired comparisons (`compare`) to add.
    progress: as `build`'s.

  Returns:
    {"tables": {name: (header, rows)}, "figures": [paths], "markdown": path of report.md,
     "html": path of the browser's page or None}.
  """
  from mcwq_t5x.evaluation import browser  # pylint: disable=g-import-not-at-top
  say = progress or (lambda _: None)
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  links: Links = {}
  all_tables = tables(report, links, with_published)
  own = ["report.md", "results.json"] + [f"{name}.csv" for name in all_tables]
  own += [p.name for p in out_dir.glob("*.png") if p.name.startswith(_FIGURE_PREFIXES)]
  check_own_files(out_dir, own)  # before anything is written
  if html_dir is not None:
    check_own_files(pathlib.Path(html_dir), [browser.PAGE])
  say("figures")
  pngs = figures(report, out_dir)
  page_url = None
  if html_dir is not None:
    page_url = pathlib.Path(
        os.path.relpath(pathlib.Path(html_dir).absolute() / browser.PAGE,
                        out_dir.absolute())).as_posix()
  md = ["# MCWQ reproduction report", ""]
  if report.get("warnings"):
    md += ["## Warnings", ""] + [f"- {w}" for w in report["warnings"]] + [""]
  if report.get("eval_split", "test") != "test":
    md += [
        f"Scores of the `{report['eval_split']}` predictions (the `dev` part), not the test "
        "part.", ""
    ]
  md += [INTERVAL_NOTE, ""]
  if page_url:
    md += [
        f"Each linked cell opens its examples in the error browser ([{page_url}]({page_url})).", ""
    ]
  sections = []
  for name, (header, rows) in all_tables.items():
    write_csv(out_dir / f"{name}.csv", header, rows)
    digits = 4 if name == "split_divergences" else 1
    shown_header, shown_rows, kept = merge_intervals(header, rows, digits)
    cell_links = [{
        j: browser.fragment(row_links[i]) for j, i in enumerate(kept) if i in row_links
    } for row_links in links.get(name, [{} for _ in rows])]
    md_links = [{
        j: f"{page_url}{f}" for j, f in row.items()
    } for row in cell_links] if page_url else None
    md += [f"## {heading(name)}", "", to_markdown(shown_header, shown_rows, digits, md_links), ""]
    if with_published and name in ("table4_monolingual_exact_match", "table5_zeroshot_exact_match"):
      if any(str(r[0]).startswith("published:") for r in rows):
        md += [published_note(), ""]
    sections.append(
        dict(
            name=name,
            heading=heading(name),
            header=shown_header,
            rows=[[_fmt(v, digits) for v in row] for row in shown_rows],
            links=cell_links))
  if comparisons:
    md += ["## Paired comparisons", ""] + [f"- {comparison_markdown(c)}" for c in comparisons
                                          ] + [""]
  md += ["## Figures", ""] + [f"![{p.stem}]({p.name})" for p in pngs] + [""]
  md += ["## Files read", ""] + [
      f"- `{r['path']}`: {r['model']} {r['mode']} {r['split']} {r['language']}"
      f"{' gold' if r['gold'] else ''}, n={r['n']}" for r in report["runs"]
  ] + [""]
  if report["messages"]:
    md += ["## Notes", ""] + [f"- {m}" for m in report["messages"]] + [""]
  md_path = out_dir / "report.md"
  writers.write_atomic(md_path, "\n".join(md))
  public = {k: v for k, v in report.items() if not k.startswith("_")}
  if comparisons:
    public["comparisons"] = list(comparisons)
  writers.write_atomic(out_dir / "results.json",
                       json.dumps(public, indent=2, ensure_ascii=False, default=str) + "\n")
  record_own_files(out_dir, own + [p.name for p in pngs])
  html_path = None
  if html_dir is not None:
    say(f"error browser: {pathlib.Path(html_dir) / browser.PAGE}")
    html_path = browser.write_page(report, html_dir, sections)
    record_own_files(pathlib.Path(html_dir), [browser.PAGE])
  return {"tables": all_tables, "figures": pngs, "markdown": md_path, "html": html_path}


# ----------------------------------------------------------------------------------------------
# Paired comparison of two prediction files.


def compare(file_a: str | pathlib.Path,
            file_b: str | pathlib.Path,
            targets_dir: str | pathlib.Path,
            data_dir: Optional[str | pathlib.Path] = None,
            gold_file: Optional[str | pathlib.Path] = None) -> dict[str, Any]:
  """Paired comparison of two systems' predictions on the same examples
  (`uncertainty.paired_comparison`: paired bootstrap interval of the difference in exact match and
  the paired permutation test).

  Args:
    file_a, file_b: prediction files (one RIR query per line); each is placed by its name and
      folders as `discover` places it (layouts in the module docstring), unless `gold_file` is
      given.
    targets_dir, data_dir: as `build`'s.
    gold_file: the gold queries (RIR, one per line) both files are scored against; default: the
      test set each file's layout names, which must be the same for both.

  Returns:
    {"a", "b", "gold" (paths), "n", "exact_match_a", "exact_match_b", "difference", "interval",
     "only_a", "only_b", "both", "neither", "p_value", "n_resamples", "seed", "confidence"}.

  Raises:
    score.InputError: a file is missing, the two (or a file and the gold queries) differ in
      length, or they belong to different test sets (split, language, gold set).
  """
  paths = [pathlib.Path(file_a), pathlib.Path(file_b)]
  for p in paths:
    if not p.is_file():
      raise score_lib.InputError(f"{p}: no such prediction file")
  if gold_file is not None:
    gold_path = pathlib.Path(gold_file)
    targets = score_lib.load_targets(gold_path)
    source = str(gold_path)
  else:
    targets_dir = pathlib.Path(targets_dir)
    loader = _GoldLoader(targets_dir,
                         pathlib.Path(data_dir) if data_dir is not None else targets_dir.parent)
    placed = [_place(p) for p in paths]
    sets = [(GOLD if f.gold else f.split, f.language) for f in placed]
    if sets[0] != sets[1]:
      raise score_lib.InputError(
          f"{paths[0]} is a prediction file of {'/'.join(sets[0])} and {paths[1]} of "
          f"{'/'.join(sets[1])}: a paired comparison needs the same examples (name the gold "
          "file with --compare_gold if both are of one test set)")
    gold_set = loader.get(*sets[0])
    if gold_set is None:
      raise score_lib.InputError(f"no gold queries for {'/'.join(sets[0])}: "
                                 f"{'; '.join(loader.messages)}")
    targets, source = gold_set.targets, gold_set.source
  preds = [readers.read_lines(p, strict=False) for p in paths]
  for p, lines in zip(paths, preds):
    score_lib.check_same_length("predictions", p, lines, "targets", source, targets)
  c = uncertainty.paired_comparison(_correct(targets, preds[0]), _correct(targets, preds[1]))
  result = dataclasses.asdict(c)
  result["interval"] = list(c.interval)
  return dict(a=str(paths[0]), b=str(paths[1]), gold=source, **result)


def _place(path: pathlib.Path) -> PredictionFile:
  """The `discover` entry of one prediction file (its layout read from its name and folders)."""
  for root in (path.parent, path.parent.parent):
    for f in discover(root):
      if f.path.resolve() == path.resolve():
        return f
  raise score_lib.InputError(
      f"{path}: not a prediction file of a known layout (generated_predictions_<lang>.txt in "
      "<split>/, predictions_<split>_<lang>.txt, or mcwq_<task>_test.txt of mcwq_t5x.train): "
      "name the gold file with --compare_gold")


class ProgressLines:
  """Progress lines on stderr with the seconds since the start: `ProgressLines()(text)`."""

  def __init__(self, stream: Any = None):
    self.start = time.monotonic()
    self.stream = stream

  def __call__(self, text: str) -> None:
    print(
        f"report [{time.monotonic() - self.start:5.1f} s] {text}",
        file=self.stream or sys.stderr,
        flush=True)
