"""Names shared by the report's modules: splits, languages, modes, scores, row titles, the
interval columns and the cell-link filters of the error browser (`mcwq_t5x.evaluation.browser`)."""
from __future__ import annotations

import re
from typing import Any, Callable, Optional, Sequence, TypedDict

import numpy as np

from mcwq_t5x.data import readers
from mcwq_t5x.evaluation import published
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

#: The seqio splits a report scores, test first (their MCWQ parts: `readers.DATASET_SPLIT_TO_PART`).
EVAL_SPLITS = ("test", "validation")


def scores_of(result: dict[str, Any]) -> dict[str, float]:
  """The `SCORES` of a `metrics.score_predictions` result."""
  return {k: result[k] for k in SCORES}


def interval(*correct: np.ndarray) -> Optional[list[float]]:
  ci = uncertainty.exact_match_interval(correct)
  return list(ci) if ci is not None else None


def run_key(run: dict[str, Any]) -> tuple[str, str, str, str, bool]:
  """(model, mode, split, language, gold) of a run of `build`."""
  return (run["model"], run["mode"], run["split"], run["language"], run["gold"])


def set_key(split: str, part: str, language: str) -> str:
  return f"{split}/{part}/{language}"


Progress = Optional[Callable[[str], None]]


def title(split: str) -> str:
  """Row title of a split: the paper's for the published ones, the name for a release's own."""
  return SPLIT_TITLES.get(split, split)


#: Suffixes of the columns that hold a value's 95% bootstrap interval (`uncertainty`).
CI_LOW, CI_HIGH = "95% CI low", "95% CI high"
#: Model names of several runs of one configuration: `<configuration>_seed<k>` (also `-seed<k>`,
#: `_seed_<k>`); their runs are summarised in the seeds table (`uncertainty.runs_interval`).
SEED_RE = re.compile(r"^(?P<base>.+?)[_-]seed[_-]?(?P<seed>\d+)$")

#: Filters of the error browser (`browser`) behind a cell: field -> value or list of values.
Filters = dict[str, Any]
#: Per table: per row, {column name: filters} of the cells that link to their examples (the
#: registry's `Table` functions) or {column index: filters} (`tables.tables`).
Links = dict[str, list[dict[int, Filters]]]


def part_of(report: dict[str, Any]) -> str:
  """The MCWQ part ("test" or "dev") a report scored."""
  return readers.DATASET_SPLIT_TO_PART[report.get("eval_split", "test")]


def training_label(run: dict[str, Any]) -> Optional[str]:
  """The "training part" cell of a run: "train", "dev", "train (multilingual)"; None if unknown."""
  part = run.get("train_part")
  if part is None:
    return None
  return part + (f" ({run['train_languages']})" if run.get("train_languages") else "")


def run_filters(run: dict[str, Any], part: str, **more: Any) -> Filters:
  """The browser filters of a run's examples (`browser`), with `more` added."""
  filters = {
      "model": run["model"],
      "mode": run["mode"],
      "split": run["split"],
      "test": GOLD if run["gold"] else part,
      "language": run["language"]
  }
  filters.update(more)
  return filters


def ci_header(columns_with_ci: Sequence[str]) -> list[str]:
  """The `<column> 95% CI low/high` header cells of `columns_with_ci`."""
  return [f"{c} {bound}" for c in columns_with_ci for bound in (CI_LOW, CI_HIGH)]


class Run(TypedDict, total=False):
  """One scored prediction file (a dict: results.json and the browser read it); exact_match_ci is
  [low, high] percent, by_* and costliest None where unknown. `lines`: [first, last] (1-based) of a
  mixture file's part; `step`, `final`, `train_part`, `train_languages`, `size`: as
  `discovery.PredictionFile`; `run`: the run's name (`model` may name one of its results apart:
  "tiny step 400"); `unseen_part`: the part by_unseen compared with."""
  model: str
  mode: str
  split: str
  language: str
  gold: bool
  path: str
  lines: Optional[list[int]]
  step: Optional[int]
  final: bool
  train_part: Optional[str]
  train_languages: Optional[str]
  size: Optional[str]
  run_json: Optional[str]
  run: str
  n: int
  exact_match: float
  bleu: float
  equivalence: float
  exact_match_ci: Optional[list[float]]
  error_categories: dict[str, int]
  by_complexity: Optional[dict[int, dict[str, Any]]]
  by_unseen: Optional[dict[str, dict[str, Any]]]
  unseen_part: Optional[str]
  costliest: Optional[list[dict[str, Any]]]
  alignment: dict[str, Any]


class Report(TypedDict, total=False):
  """`build.build`'s output. `intersection`: per gold file {model, mode, split, language, matched,
  n_gold, mt, gold, gold_all}; `_examples` (the browser's, not in results.json): {"sets": {key:
  {split, part, language, targets, questions, depths, unseen}}, "runs": [{set, predictions,
  categories, correct}] parallel to `runs`}."""
  runs: list[Run]
  intersection: list[dict[str, Any]]
  divergences: list[dict[str, Any]]
  messages: list[str]
  warnings: list[str]
  eval_split: str
  _examples: dict[str, Any]
