"""The rows of the report's tables: Tables 4 and 5 per split and language with the MCD mean
(`split_rows`), the published reference rows and the seed groups; cell links keyed by column name."""
from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

import numpy as np

from mcwq_t5x.evaluation import published
from mcwq_t5x.evaluation import uncertainty
from mcwq_t5x.evaluation.report.common import Filters
from mcwq_t5x.evaluation.report.common import GOLD
from mcwq_t5x.evaluation.report.common import interval
from mcwq_t5x.evaluation.report.common import LANGUAGES
from mcwq_t5x.evaluation.report.common import MCD_MEAN
from mcwq_t5x.evaluation.report.common import MCD_SPLITS
from mcwq_t5x.evaluation.report.common import run_filters
from mcwq_t5x.evaluation.report.common import run_key
from mcwq_t5x.evaluation.report.common import SEED_RE
from mcwq_t5x.evaluation.report.common import SPLITS
from mcwq_t5x.evaluation.report.common import title
from mcwq_t5x.evaluation.report.common import training_label


def columns(runs: Sequence[dict]) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(languages, splits) of the tables: the published ones, then the others the runs have, sorted."""
  languages = LANGUAGES + tuple(sorted({r["language"] for r in runs} - set(LANGUAGES)))
  splits = SPLITS + tuple(sorted({r["split"] for r in runs} - set(SPLITS) - {GOLD}))
  return languages, splits


def correct_of_runs(report: dict[str, Any]) -> dict[tuple, np.ndarray]:
  """run_key -> per-example exact match, when the report holds its examples (`build`)."""
  data = report.get("_examples")
  if not data:
    return {}
  return {run_key(r): d["correct"] for r, d in zip(report["runs"], data["runs"])}


def split_rows(runs: Sequence[dict],
               model: str,
               mode: str,
               score: str,
               languages: Sequence[str],
               fallback_en: Optional[Sequence[dict]] = None,
               splits: Sequence[str] = SPLITS,
               correct_of: Optional[dict[tuple, np.ndarray]] = None,
               part: str = "test") -> tuple[list[list[Any]], list[dict[str, Filters]]]:
  """Rows [model, split, value per language] (for exact match also each language's 95% CI low
  and high, after the values), then the training part and model size of the row's runs (`about`),
  with "MCD mean" (the mean over the MCD splits present, when there are two or more; its interval
  resamples each split's test set), and each row's cell links."""

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
    row = [model, title(split)
          ] + [table[split][l][score] if table[split][l] else None for l in languages]
    links = {l: run_filters(table[split][l], part) for l in languages if table[split][l]}
    if with_ci:
      for l in languages:
        r = table[split][l]
        row += list(r["exact_match_ci"]) if r and r.get("exact_match_ci") else [None, None]
    return row + list(about(table[split].values())), links

  def mean_row():
    row = [model, MCD_MEAN]
    links = {}
    intervals = []
    for lang in languages:
      members = [table[s][lang] for s in mcd_present]
      if all(r is not None for r in members):
        row.append(float(np.mean([r[score] for r in members])))
        links[lang] = dict(run_filters(members[0], part), split=list(mcd_present))
        vectors = [(correct_of or {}).get(run_key(r)) for r in members]
        intervals.append(
            interval(*vectors) if with_ci and all(v is not None for v in vectors) else None)
      else:
        row.append(None)
        intervals.append(None)
    if with_ci:
      for ci in intervals:
        row += ci if ci else [None, None]
    row += list(about(table[s][l] for s in mcd_present for l in languages))
    assert len(row) == 4 + n * (3 if with_ci else 1)
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


def about(runs: Iterable[Optional[dict]]) -> tuple[Optional[str], Optional[str]]:
  """(training part, model size) cells of a row of `runs` (None: no run): each the one value of
  its runs, their distinct values joined by " / " ("?" for a run that records none), None if no
  run records one."""
  present = [r for r in runs if r is not None]

  def cell(values):
    distinct = sorted(set(values), key=lambda v: (v is None, v or ""))
    if all(v is None for v in distinct):
      return None
    return " / ".join("?" if v is None else v for v in distinct)

  return cell(training_label(r) for r in present), cell(r.get("size") for r in present)


def published_rows(mode: str, languages: Sequence[str], splits: set[str]) -> list[list[Any]]:
  """The published reference rows (`published`) of Table 4 or 5 for the published splits the
  report has in that mode (none for a release with only its own splits)."""
  if not splits & set(SPLITS):
    return []
  rows = []
  for p in published.rows_for(mode):
    rows.append([p.label, title(p.split)] + [p.exact_match.get(l) for l in languages] +
                [None, None] * len(languages) + [p.train_part, p.size])
  return rows


def seed_groups(runs: Sequence[dict]) -> list[dict[str, Any]]:
  """Seed groups (model names `SEED_RE`, two or more runs per configuration, mode, split, language
  and test set): [{"model", "mode", "split", "language", "gold", "models", "runs", "mean",
  "half_width" (95% Student-t), "min", "max"}], sorted."""
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
