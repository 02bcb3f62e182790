"""Scoring every prediction file of a results folder into a `Report` (`build`), with the
unseen-compound diagnosis (`compounds`) and the splits' DBCA divergences (`divergence`)."""
from __future__ import annotations

import dataclasses
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
from mcwq_t5x.evaluation.report.discovery import PredictionFile
from mcwq_t5x.evaluation.report.gold import GoldLoader
from mcwq_t5x.evaluation.report.gold import intersection_index


def build(results_dir: str | pathlib.Path | Sequence[str | pathlib.Path],
          targets_dir: str | pathlib.Path,
          data_dir: Optional[str | pathlib.Path] = None,
          eval_split: str = "test",
          progress: Progress = None) -> Report:
  """The `Report` of every prediction file under `results_dir` (one folder or several): scores,
  95% bootstrap intervals of every exact match, Table 6, error categories, complexity, unseen
  compounds, divergences.

  `targets_dir`: `translations/` ({split}/test.{lang}.sparql, gold/); `data_dir` (default its
  parent) for `readers` fallbacks, recursionDepth and training parts. `eval_split` "validation"
  scores against the `dev` part. `progress` gets a line before each slow step. Several files of one
  run and test set are all scored, named apart (`name_apart`, a warning each). The shape is
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
  files = name_apart(discover(results_dir, eval_split, loader.languages), warnings)
  lines_of: dict[pathlib.Path, list[str]] = {}
  for number, pf in enumerate(files, start=1):
    key = (pf.model, pf.mode, pf.split, pf.language, pf.gold)
    say(f"scoring {number}/{len(files)}: {pf.path}" + (f" ({pf.language})" if pf.mixture else ""))
    gold_set = loader.get(GOLD if pf.gold else pf.split, pf.language)
    if gold_set is None:
      loader.messages.append(f"skipped {pf.path}: no gold queries")
      continue
    if pf.path not in lines_of:
      lines_of[pf.path] = readers.read_lines(pf.path, strict=False)
    lines = None
    if pf.mixture:
      lines = _mixture_lines(pf, lines_of[pf.path], loader)
      if lines is None:
        continue
      preds = lines_of[pf.path][lines[0]:lines[1]]
    else:
      preds = lines_of[pf.path]
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
            lines=None if lines is None else [lines[0] + 1, lines[1]],
            step=pf.step,
            final=pf.final,
            train_part=pf.train_part,
            train_languages=pf.train_languages,
            size=pf.size,
            run_json=pf.run_json,
            run=pf.run or pf.model,
            n=result["n"],
            **scores_of(result),
            exact_match_ci=interval(correct),
            error_categories=result["error_categories"],
            by_complexity=by_complexity,
            by_unseen=None,
            unseen_part=None,
            costliest=None,
            alignment=checks["alignment"]))
    predictions_of[key] = preds

  intersection = _intersection(runs, predictions_of, loader)
  splits = sorted({r["split"] for r in runs})
  unseen_compounds(runs, examples, data_dir, loader.messages, say)
  if splits:
    say(f"divergences of {', '.join(splits)}")
  return {
      "runs": runs,
      "intersection": intersection,
      "divergences": split_divergences(splits, data_dir, loader.messages),
      "messages": loader.messages,
      "warnings": warnings,
      "eval_split": eval_split,
      "_examples": examples
  }


def _mixture_lines(pf: PredictionFile, lines: Sequence[str],
                   loader: GoldLoader) -> Optional[tuple[int, int]]:
  """[start, stop) of `pf.language`'s predictions in a mixture's file: its tasks' test sets one
  after another, in `pf.mixture`'s order; None (with a message) if a test set is missing.
  score.InputError if the file does not hold exactly their lines."""
  sizes = []
  for lang in pf.mixture:
    gold_set = loader.get(pf.split, lang)
    if gold_set is None:
      loader.messages.append(f"skipped {pf.path} ({pf.language}): no gold queries of {lang}, one "
                             "of its mixture's tasks")
      return None
    sizes.append(len(gold_set.targets))
  if sum(sizes) != len(lines):
    raise score_lib.InputError(
        f"{pf.path}: {len(lines)} predictions, but the mixture's {loader.part} sets hold "
        f"{sum(sizes)} examples ({', '.join(f'{l} {n}' for l, n in zip(pf.mixture, sizes))}, in "
        "that order): a mixture's file must hold every example of each of its tasks")
  start = sum(sizes[:pf.mixture.index(pf.language)])
  return start, start + sizes[pf.mixture.index(pf.language)]


def name_apart(files: Sequence[PredictionFile], warnings: list[str]) -> list[PredictionFile]:
  """`files` with several results of one run and test set named apart, a line in `warnings` for
  each (printed on stderr).

  Rule: the result of the run's final evaluation (`MODEL_DIR/predictions/`, written by
  `mcwq_t5x.train`), else of its latest checkpoint step, keeps the run's name; every other file
  of its folder (e.g. `eval_400/predictions/`) is named `<run> step <k>` (`<run> (<folder>)` when
  the step is unknown), `<run> (<file>)` if that is taken too. One file reached twice (a link, two
  RESULTS_DIRs holding it) is read once.
  """
  unique, first_of = [], {}
  for pf in files:
    real = (pf.path.resolve(), pf.language, pf.gold)
    if real in first_of:
      seen = ("found twice" if first_of[real] == pf.path else f"the file {first_of[real]}")
      warnings.append(f"{pf.path} is {seen} (through a link or two RESULTS_DIRs): read once")
      continue
    first_of[real] = pf.path
    unique.append(pf)
  groups: dict[tuple, list[PredictionFile]] = {}
  for pf in unique:
    groups.setdefault((pf.model, pf.mode, pf.split, pf.language, pf.gold), []).append(pf)
  order = {pf.path.parent: k for k, pf in reversed(list(enumerate(unique)))}

  def rank(pf):  # the kept one first
    return (not pf.final, -(pf.step if pf.step is not None else -1), order[pf.path.parent])

  renamed_folders = set()
  for group in groups.values():
    if len({pf.path for pf in group}) > 1:
      group.sort(key=rank)
      renamed_folders |= {pf.path.parent for pf in group[1:] if pf.path != group[0].path}
  label = {}
  for pf in unique:
    if pf.path.parent in renamed_folders:
      label[pf.path] = (f"{pf.model} step {pf.step}"
                        if pf.step is not None else f"{pf.model} ({pf.path.parent})")
  out, taken = [], set()
  for pf in sorted(unique, key=lambda pf: pf.path.parent not in renamed_folders):
    new = dataclasses.replace(pf, model=label.get(pf.path, pf.model))
    key = (new.model, new.mode, new.split, new.language, new.gold)
    if key in taken:
      new = dataclasses.replace(pf, model=f"{pf.model} ({pf.path})")
    if new.model != pf.model:
      new = dataclasses.replace(new, run=pf.model)
      key = (new.model, new.mode, new.split, new.language, new.gold)
    taken.add(key)
    out.append(new)
  renamed = {(pf.path, pf.language, pf.gold): pf.model for pf in out}
  for (model, mode, split, language, gold), group in groups.items():
    if len({pf.path for pf in group}) < 2:
      continue
    test_set = f"{split} {language}{' gold' if gold else ''}"
    parts = [
        f"{pf.path} ({_decoded(pf)}) as `{renamed[(pf.path, pf.language, pf.gold)]}`"
        for pf in group
    ]
    warnings.append(
        f"{len(group)} results of {model} ({mode}) on the {test_set} test set, all shown: " +
        "; ".join(parts) + " (the run's own name is its final evaluation, else its latest "
        "checkpoint)")
  return sorted(out, key=lambda f: (f.model, f.mode, f.split, f.language, f.gold, str(f.path)))


def _decoded(pf: PredictionFile) -> str:
  """"checkpoint 400, final evaluation": what a file decoded, as far as known."""
  parts = [f"checkpoint {pf.step}" if pf.step is not None else "step unknown"]
  if pf.final:
    parts.append("final evaluation")
  return ", ".join(parts)


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
  """Fills each non-gold run's "by_unseen" (with a 95% interval per bucket), "costliest" and
  "unseen_part" (the part its compounds were compared with: the run's "train_part", run.json's,
  else "train"), and each test set's "unseen" (against the first part used for it); a split
  without that part gets a line in `messages`."""
  wanted = sorted({(r["split"], r.get("train_part") or "train") for r in runs if not r["gold"]})
  missing, train_of = [], {}
  for split, part in wanted:
    say(f"unseen compounds: reading the training part of {split} ({part})")
    try:
      train_of[(split, part)] = compounds.training_compounds(split, data_dir, part=part)
    except (ValueError, OSError) as e:
      messages.append(f"unseen compounds of {split} ({part} part) skipped: {e}")
      continue
    if train_of[(split, part)] is None:
      missing.append(f"{split} ({part} part)" if part != "train" else split)
  if missing:
    messages.append(
        f"unseen compounds skipped for {', '.join(missing)}: {data_dir} holds no such part of it "
        "(the diagnosis compares each test query with the queries the model trained on: the "
        "train part of a full release or one written by preprocessing.make_splits, or the part "
        "a run's run.json records)")
  used: set[tuple[str, str]] = set()
  unseen_of: dict[tuple[str, str], list] = {}
  for run, data in zip(runs, examples["runs"]):
    part = run.get("train_part") or "train"
    train = train_of.get((run["split"], part))
    if run["gold"] or train is None:
      continue
    test_set = examples["sets"][data["set"]]
    if (data["set"], part) not in unseen_of:
      try:
        unseen_of[(data["set"], part)] = compounds.unseen_compounds(test_set["targets"], train,
                                                                    data["set"])
      except ValueError as e:
        messages.append(f"unseen compounds of {data['set']} skipped: {e}")
        continue
    unseen = unseen_of[(data["set"], part)]
    if test_set["unseen"] is None:  # the error browser's (one per test set)
      test_set["unseen"], test_set["unseen_part"] = unseen, part
    table = compounds.by_unseen(data["correct"], unseen)
    for bucket, row in table.items():
      members = np.array([compounds.bucket_name(len(u)) == bucket for u in unseen])
      row["ci"] = interval(data["correct"][members])
    run["by_unseen"] = table
    run["unseen_part"] = part
    run["costliest"] = compounds.costliest(data["correct"], unseen)
    if part != "train":
      used.add((run["split"], part))
  for split, part in sorted(used):
    messages.append(
        f"unseen compounds of {split}: compared with its {part} part, the part the runs' run.json "
        "records they trained on")


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
