"""Reproduction report: the MCWQ paper's result tables and analysis figures from predictions
(the command line is `python -m mcwq_t5x.report`).

Reads every prediction file under RESULTS_DIR, scores it against the gold queries
(`mcwq_t5x.evaluation.metrics`), checks that it belongs to them and reads as UTF-8
(`mcwq_t5x.evaluation.prediction_checks`: a warning on stderr, in report.md and results.json
otherwise) and writes, under --out (default `./mcwq_report`):

  * `report.md`: all tables in Markdown, plus warnings, the list of files read and skipped
    analyses;
  * `table4_monolingual_{exact_match,bleu,equivalence}.csv` (paper Table 4: per split x
    language, with "MCD mean" = mean over the MCD splits present);
  * `table5_zeroshot_{exact_match,bleu,equivalence}.csv` (Table 5: English-trained models on
    he/kn/zh; the "en" column is the same model's monolingual English result);
  * `table6_gold_test.csv` (Table 6: test-intersection-MT vs test-intersection-gold);
  * `error_categories.csv` (§6.2 counts per model/mode/split/language);
  * `split_divergences.csv`: DBCA atom and compound divergence (`mcwq_t5x.data.divergence`; Keysers et
    al. 2020) between the parts of every split reported on, for the parts `--data_dir` holds
    (dev/test in the shared copy; train/dev, train/test, dev/test in a full release);
  * `results.json` (every score);
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
     EVAL_OUTPUT_DIR; the generated eval files use `MODEL_DIR/{test,zeroshot,gold}_<lang>`). The model is the run's name: MODEL_DIR (the folder CHECKPOINT_PATH
     names), never `eval_<step>`; a second file of the same run and test set is skipped. Validation (`_validation.txt`) predictions are read only with `--split validation`
     (and then the test ones are not).

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
import pathlib
import re
from typing import Any, Optional, Sequence

import numpy as np

from mcwq_t5x.data import divergence
from mcwq_t5x.data import readers
from mcwq_t5x.evaluation import metrics
from mcwq_t5x.evaluation import prediction_checks
from mcwq_t5x.evaluation import score as score_lib

SPLITS = readers.SPLITS
MCD_SPLITS = tuple(s for s in SPLITS if s.startswith("mcd"))
LANGUAGES = readers.LANGUAGES
GOLD_LANGUAGES = readers.GOLD_LANGUAGES
MODES = ("monolingual", "zeroshot")
GOLD = readers.GOLD_SPLIT
MCD_MEAN = "MCD mean"
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
      questions = (score_lib.read_lines(question_file) if question_file.is_file() else None)
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


def build(results_dir: str | pathlib.Path,
          targets_dir: str | pathlib.Path,
          data_dir: Optional[str | pathlib.Path] = None,
          eval_split: str = "test") -> dict[str, Any]:
  """Scores every prediction file under `results_dir` and assembles the paper's analyses.

  Args:
    results_dir: predictions (layouts in the module docstring).
    targets_dir: the `translations/` directory with `{split}/test.{lang}.sparql` and `gold/`.
    data_dir: MCWQ directory for `readers` fallbacks and recursionDepth; default
      `targets_dir`'s parent.
    eval_split: "test", or "validation" (`mcwq_t5x.train`/`eval` predictions of the validation
      split, scored against the `dev` part).

  Returns:
    {"runs": [one dict per prediction file: model, mode, split, language, gold, path, n, scores,
      error_categories, by_complexity (or None), alignment (`prediction_checks.check_alignment`)],
     "intersection": [one dict per gold prediction file: model, mode, split, language,
      matched, n_gold, mt and gold: scores on the matched examples (None if none), gold_all:
      scores on all n_gold],
     "messages": [skipped analyses and files, with reasons], "warnings": [prediction files that
      do not seem to belong to their gold lines, or have lines that are not valid UTF-8: each
      names the files (`prediction_checks.check_prediction_file`); they are scored all the same],
     "eval_split": eval_split}

  Raises:
    FileNotFoundError: `results_dir` does not exist.
    score.InputError: a prediction file's length differs from its gold file, or a gold file
      is malformed.
    ValueError: an unknown `eval_split`.
  """
  if eval_split not in EVAL_SPLITS:
    raise ValueError(f"eval_split {eval_split!r}: expected one of {tuple(EVAL_SPLITS)}")
  targets_dir = pathlib.Path(targets_dir)
  data_dir = pathlib.Path(data_dir) if data_dir is not None else targets_dir.parent
  loader = _GoldLoader(targets_dir, data_dir, EVAL_SPLITS[eval_split])
  runs: list[dict[str, Any]] = []
  warnings: list[str] = []
  predictions_of: dict[tuple, list[str]] = {}
  first_path: dict[tuple, pathlib.Path] = {}
  for pf in discover(results_dir, eval_split):
    key = (pf.model, pf.mode, pf.split, pf.language, pf.gold)
    if key in first_path:  # e.g. MODEL_DIR/predictions and MODEL_DIR/eval_<step>/predictions
      loader.messages.append(f"skipped {pf.path}: the same run and test set as {first_path[key]}")
      continue
    first_path[key] = pf.path
    gold_set = loader.get(GOLD if pf.gold else pf.split, pf.language)
    if gold_set is None:
      loader.messages.append(f"skipped {pf.path}: no gold queries")
      continue
    preds = score_lib.read_lines(pf.path, strict=False)
    score_lib.check_same_length("predictions", pf.path, preds, "targets", gold_set.source,
                                gold_set.targets)
    result = metrics.score_predictions(gold_set.targets, preds)
    checks = prediction_checks.check_prediction_file(pf.path, preds, gold_set.source,
                                                     gold_set.targets, gold_set.questions_source,
                                                     gold_set.questions)
    warnings += checks["warnings"]
    by_complexity = None
    if gold_set.depths is not None:
      by_complexity = metrics.accuracy_by_complexity(gold_set.targets, preds, gold_set.depths)
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
            error_categories=result["error_categories"],
            by_complexity=by_complexity,
            alignment=checks["alignment"]))
    predictions_of[(pf.model, pf.mode, pf.split, pf.language, pf.gold)] = preds

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
        gold_all={k: run[k] for k in SCORES},
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
        entry["mt"] = _scores(
            metrics.score_predictions([mcd_set.targets[j] for _, j in pairs],
                                      [mt_preds[j] for _, j in pairs]))
        entry["gold"] = _scores(
            metrics.score_predictions([gold_set.targets[i] for i, _ in pairs],
                                      [gold_preds[i] for i, _ in pairs]))
    intersection.append(entry)
  return {
      "runs":
          runs,
      "intersection":
          intersection,
      "divergences":
          split_divergences(sorted({r["split"] for r in runs}), data_dir, loader.messages),
      "messages":
          loader.messages,
      "warnings":
          warnings,
      "eval_split":
          eval_split
  }


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


def _split_rows(runs: Sequence[dict],
                model: str,
                mode: str,
                score: str,
                languages: Sequence[str],
                fallback_en: Optional[Sequence[dict]] = None,
                splits: Sequence[str] = SPLITS) -> list[list[Any]]:
  """Rows [model, split, value per language] incl. "MCD mean" (mean over MCD splits present)."""

  def value(split, lang, pool):
    for r in pool:
      if (r["model"], r["split"], r["language"], r["gold"]) == (model, split, lang, False):
        return r[score]
    return None

  pool = [r for r in runs if r["mode"] == mode]
  rows = []
  table: dict[str, dict[str, Optional[float]]] = {}
  for split in splits:
    vals = {}
    for lang in languages:
      v = value(split, lang, pool)
      if v is None and lang == "en" and fallback_en is not None:
        v = value(split, lang, fallback_en)
      vals[lang] = v
    table[split] = vals
  present = [s for s in splits if any(v is not None for v in table[s].values())]
  mcd_present = [s for s in MCD_SPLITS if s in present]
  for split in present:
    if split == "random_split" and mcd_present:
      rows.append(_mean_row(model, table, mcd_present, languages))
    rows.append([model, _title(split)] + [table[split][l] for l in languages])
  if mcd_present and "random_split" not in present:
    at = max(present.index(s) for s in mcd_present) + 1  # after the MCD rows
    rows.insert(at, _mean_row(model, table, mcd_present, languages))
  return rows


def _mean_row(model, table, splits, languages):
  row = [model, f"{MCD_MEAN} ({len(splits)} split{'s' if len(splits) > 1 else ''})"]
  for lang in languages:
    vals = [table[s][lang] for s in splits]
    row.append(float(np.mean(vals)) if all(v is not None for v in vals) else None)
  return row


def tables(report: dict[str, Any]) -> dict[str, tuple[list[str], list[list[Any]]]]:
  """The paper's tables as {name: (header, rows)}; values are floats or None (missing)."""
  runs = report["runs"]
  out: dict[str, tuple[list[str], list[list[Any]]]] = {}
  models = sorted({r["model"] for r in runs})
  languages, splits = columns(runs)
  for score in SCORES:
    rows = []
    for model in models:
      rows += _split_rows(runs, model, "monolingual", score, languages, splits=splits)
    if rows:
      out[f"table4_monolingual_{score}"] = (["model", "split"] + list(languages), rows)
  for score in SCORES:
    rows = []
    for model in models:
      if any(r["model"] == model and r["mode"] == "zeroshot" for r in runs):
        mono = [r for r in runs if r["mode"] == "monolingual"]
        rows += _split_rows(
            runs, model, "zeroshot", score, languages, fallback_en=mono, splits=splits)
    if rows:
      out[f"table5_zeroshot_{score}"] = (["model", "split"] + list(languages), rows)
  rows = []
  for e in report["intersection"]:
    mt, gold = e["mt"] or {}, e["gold"] or {}
    rows.append([
        e["model"], e["mode"],
        _title(e["split"]), e["language"], e["n_gold"], e["matched"],
        mt.get("exact_match"),
        gold.get("exact_match"),
        mt.get("bleu"),
        gold.get("bleu"), e["gold_all"]["exact_match"], e["gold_all"]["bleu"]
    ])
  if rows:
    out["table6_gold_test"] = ([
        "model", "mode", "trained on", "language", "n gold", "matched in test", "EM MT (matched)",
        "EM gold (matched)", "BLEU MT (matched)", "BLEU gold (matched)", "EM gold (all n)",
        "BLEU gold (all n)"
    ], rows)
  rows = []
  for r in runs:
    rows.append([
        r["model"], r["mode"],
        _title(r["split"]) + (" gold" if r["gold"] else ""), r["language"], r["n"]
    ] + [r["error_categories"][c] for c in metrics.ERROR_CATEGORIES])
  if rows:
    out["error_categories"] = (["model", "mode", "test set", "language", "n"] +
                               list(metrics.ERROR_CATEGORIES), rows)
  rows = [[_title(d["split"]), d["parts"], d["sizes"][0], d["sizes"][1], d["atom"], d["compound"]]
          for d in report.get("divergences", ())]
  if rows:
    out["split_divergences"] = ([
        "split", "parts (P/Q)", "n P", "n Q", "atom divergence", "compound divergence"
    ], rows)
  return out


def _fmt(value: Any, digits: int) -> str:
  if value is None:
    return "-"
  if isinstance(value, float):
    return f"{value:.{digits}f}"
  return str(value)


def to_markdown(header: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 1) -> str:
  """A Markdown table; floats with `digits` decimals, None as "-"."""
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
  for row in rows:
    lines.append("| " + " | ".join(_fmt(v, digits) for v in row) + " |")
  return "\n".join(lines)


def write_csv(path: pathlib.Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
  """Writes a CSV table; floats with 4 decimals, None as an empty cell."""
  with open(path, "w", newline="", encoding="utf-8") as f:
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
  return written


# ----------------------------------------------------------------------------------------------
# Command line.


def write_report(report: dict[str, Any], out_dir: str | pathlib.Path) -> dict[str, Any]:
  """Writes tables (Markdown + CSV), figures (PNG) and results.json under `out_dir`.

  Returns:
    {"tables": {name: (header, rows)}, "figures": [paths], "markdown": path of report.md}.
  """
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  all_tables = tables(report)
  pngs = figures(report, out_dir)
  titles = {
      "table4_monolingual": "Table 4: monolingual results",
      "table5_zeroshot": "Table 5: zero-shot cross-lingual results (trained on English; "
                         "the en column is the English model's own test result)",
  }
  md = ["# MCWQ reproduction report", ""]
  if report.get("warnings"):
    md += ["## Warnings", ""] + [f"- {w}" for w in report["warnings"]] + [""]
  if report.get("eval_split", "test") != "test":
    md += [
        f"Scores of the `{report['eval_split']}` predictions (the `dev` part), not the test "
        "part.", ""
    ]
  for name, (header, rows) in all_tables.items():
    write_csv(out_dir / f"{name}.csv", header, rows)
    if name.startswith("table4") or name.startswith("table5"):
      score = next(s for s in SCORES if name.endswith(s))
      heading = f"{titles[name[:-len(score) - 1]]}, {SCORE_TITLES[score]}"
    elif name == "table6_gold_test":
      heading = ("Table 6: test-intersection-MT vs test-intersection-gold (exact match %, "
                 "BLEU; the MT and gold columns score the same `matched in test` examples, the "
                 "`all n` columns every gold example. The gold set was drawn from the MCD splits' "
                 "test sets, so a model of another split matches only some of it)")
    elif name == "split_divergences":
      heading = ("Split divergences (DBCA, Keysers et al. 2020: atoms alpha 0.5, compounds "
                 "alpha 0.1; mcwq_t5x.data.divergence)")
    else:
      heading = "Error categories (§6.2; definitions in mcwq_t5x.evaluation.metrics.ErrorAnalysis)"
    digits = 4 if name == "split_divergences" else 1
    md += [f"## {heading}", "", to_markdown(header, rows, digits), ""]
  md += ["## Figures", ""] + [f"![{p.stem}]({p.name})" for p in pngs] + [""]
  md += ["## Files read", ""] + [
      f"- `{r['path']}`: {r['model']} {r['mode']} {r['split']} {r['language']}"
      f"{' gold' if r['gold'] else ''}, n={r['n']}" for r in report["runs"]
  ] + [""]
  if report["messages"]:
    md += ["## Notes", ""] + [f"- {m}" for m in report["messages"]] + [""]
  md_path = out_dir / "report.md"
  md_path.write_text("\n".join(md), encoding="utf-8")
  (out_dir / "results.json").write_text(
      json.dumps(report, indent=2, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
  return {"tables": all_tables, "figures": pngs, "markdown": md_path}
