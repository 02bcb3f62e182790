"""Scoring every prediction file of a results folder into a `Report` (`build`), with the
unseen-compound diagnosis (`compounds`) and the splits' DBCA divergences (`divergence`)."""
from __future__ import annotations

import pathlib
from typing import Any, Callable, Optional, Sequence

import numpy as np

from mcwq_t5x.data import divergence
from mcwq_t5x.data import readers
from mcwq_t5x.evaluation import compounds
from mcwq_t5x.evaluation import metrics
from mcwq_t5x.evaluation import prediction_checks
from mcwq_t5x.evaluation import score as score_lib
from mcwq_t5x.evaluation.report.common import EVAL_SPLITS
from mcwq_t5x.evaluation.report.common import GOLD
from mcwq_t5x.evaluation.report.common import interval
from mcwq_t5x.evaluation.report.common import Progress
from mcwq_t5x.evaluation.report.common import Report
from mcwq_t5x.evaluation.report.common import Run
from mcwq_t5x.evaluation.report.common import SCORES
from mcwq_t5x.evaluation.report.common import scores_of
from mcwq_t5x.evaluation.report.common import set_key
from mcwq_t5x.evaluation.report.discovery import discover
from mcwq_t5x.evaluation.report.gold import GoldLoader
from mcwq_t5x.evaluation.report.gold import intersection_index


def build(results_dir: str | pathlib.Path,
          targets_dir: str | pathlib.Path,
          data_dir: Optional[str | pathlib.Path] = None,
          eval_split: str = "test",
          progress: Progress = None) -> Report:
  """The `Report` of every prediction file under `results_dir`: scores, 95% bootstrap intervals of
  every exact match, Table 6, error categories, complexity, unseen compounds, divergences.

  `targets_dir`: `translations/` ({split}/test.{lang}.sparql, gold/); `data_dir` (default its
  parent) for `readers` fallbacks, recursionDepth and training parts. `eval_split` "validation"
  scores against the `dev` part. `progress` gets a line before each slow step. The shape is
  `common.Run` / `common.Report`. Raises FileNotFoundError (no `results_dir`), score.InputError (a
  length mismatch or malformed gold file), readers.DataFormatError (not UTF-8), ValueError.
  """
  if eval_split not in EVAL_SPLITS:
    raise ValueError(f"eval_split {eval_split!r}: expected one of {EVAL_SPLITS}")
  say = progress or (lambda _: None)
  targets_dir = pathlib.Path(targets_dir)
  data_dir = pathlib.Path(data_dir) if data_dir is not None else targets_dir.parent
  loader = GoldLoader(targets_dir, data_dir, readers.DATASET_SPLIT_TO_PART[eval_split])
  runs: list[Run] = []
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
    correct = metrics.exact_matches(gold_set.targets, preds)
    checks = prediction_checks.check_prediction_file(pf.path, preds, gold_set.source,
                                                     gold_set.targets, gold_set.questions_source,
                                                     gold_set.questions)
    warnings += checks["warnings"]
    by_complexity = None
    if gold_set.depths is not None:
      by_complexity = metrics.accuracy_by_complexity(gold_set.targets, preds, gold_set.depths)
    part = "test" if pf.gold else loader.part
    key_of_set = set_key(GOLD if pf.gold else pf.split, part, pf.language)
    examples["sets"].setdefault(
        key_of_set,
        dict(
            split=GOLD if pf.gold else pf.split,
            part=part,
            language=pf.language,
            targets=gold_set.targets,
            questions=gold_set.questions,
            depths=gold_set.depths,
            unseen=None))
    examples["runs"].append(
        dict(set=key_of_set, predictions=preds, categories=result["categories"], correct=correct))
    runs.append(
        dict(
            model=pf.model,
            mode=pf.mode,
            split=pf.split,
            language=pf.language,
            gold=pf.gold,
            path=str(pf.path),
            n=result["n"],
            **scores_of(result),
            exact_match_ci=interval(correct),
            error_categories=result["error_categories"],
            by_complexity=by_complexity,
            by_unseen=None,
            costliest=None,
            alignment=checks["alignment"]))
    predictions_of[key] = preds

  intersection = _intersection(runs, predictions_of, loader)
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


def _intersection(runs: Sequence[Run], predictions_of: dict[tuple, list[str]],
                  loader: GoldLoader) -> list[dict[str, Any]]:
  """Table 6 entries, one per gold prediction file: its scores on all gold examples and, on the
  gold examples matched in the split's test set (`intersection_index`), the MT and gold scores."""
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
      index = intersection_index(loader, run["split"], gold_set, mcd_set, index_cache)
      pairs = [(i, j) for i, j in enumerate(index) if j is not None]
      entry["matched"] = len(pairs)
      if pairs:  # like with like: both columns score the same matched examples
        gold_preds = predictions_of[key + (True,)]
        for name, targets, preds in (("mt", [mcd_set.targets[j] for _, j in pairs], [
            mt_preds[j] for _, j in pairs
        ]), ("gold", [gold_set.targets[i] for i, _ in pairs], [gold_preds[i] for i, _ in pairs])):
          entry[name] = dict(
              scores_of(metrics.score_predictions(targets, preds)),
              exact_match_ci=interval(metrics.exact_matches(targets, preds)))
    intersection.append(entry)
  return intersection


def unseen_compounds(runs: Sequence[dict[str, Any]], examples: dict[str, Any],
                     data_dir: pathlib.Path, messages: list[str], say: Callable[[str],
                                                                                None]) -> None:
  """Fills each non-gold run's "by_unseen" (with a 95% interval per bucket) and "costliest", and
  each test set's "unseen"; a split without a training part gets a line in `messages`."""
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
      row["ci"] = interval(data["correct"][members])
    run["by_unseen"] = table
    run["costliest"] = compounds.costliest(data["correct"], unseen)


def split_divergences(splits: Sequence[str], data_dir: pathlib.Path,
                      messages: list[str]) -> list[dict[str, Any]]:
  """[{"split", "parts": "dev/test", "sizes", "atom", "compound"}]: DBCA divergences (Keysers et al.
  2020 §2) between each two parts `data_dir` holds; a split without them gets a `messages` line."""
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
