"""Unseen compounds: which compounds of each test query never occur in the training part, and what
they cost in exact match.

An MCD split (Keysers et al., ICLR 2020) keeps train and test atoms alike and their compounds
apart. Compounds are `mcwq_t5x.data.divergence`'s (connected sub-graphs of one to three
triples/filters, placeholders and variables anonymised); a test example's unseen compounds are
those no training query contains. Exact match is grouped by their number (`BUCKETS`) and each
unseen compound ranked by the exact matches its examples lose (`costliest`). Needs the part the
model trained on: `train` (a full release, `make_splits` or `migrate`; the shared published copy
has none), or `dev` for a run that trained on it (run.json's "split": "validation").
"""
from __future__ import annotations

import collections
from typing import Any, Optional, Sequence

import numpy as np

from mcwq_t5x.data import divergence
from mcwq_t5x.data import readers
from mcwq_t5x.data import rir
from mcwq_t5x.data import writers

#: Lower edges of the buckets of the number of unseen compounds (the last one is open).
BUCKET_EDGES = (0, 1, 2, 3, 5, 10, 20, 40)
#: The least number of test examples an unseen compound must occur in to be ranked by `costliest`.
MIN_EXAMPLES = 5
#: Rows of the ranked table of the report.
TOP = 20


def bucket_name(k: int) -> str:
  """The bucket of `k` unseen compounds: "0", "1", "2", "3-4", "5-9", "10-19", "20-39", "40+"."""
  if k < 0:
    raise ValueError(f"a number of compounds cannot be negative, got {k}")
  i = int(np.searchsorted(BUCKET_EDGES, k, side="right")) - 1
  low = BUCKET_EDGES[i]
  if i + 1 == len(BUCKET_EDGES):
    return f"{low}+"
  high = BUCKET_EDGES[i + 1] - 1
  return str(low) if high == low else f"{low}-{high}"


#: The bucket names in order.
BUCKETS = tuple(bucket_name(k) for k in BUCKET_EDGES)


def training_compounds(split: str,
                       data_dir: Optional[readers.PathLike] = None,
                       language: Optional[str] = None,
                       part: str = "train") -> Optional[frozenset[str]]:
  """The `divergence.compounds` strings of every query of `split`'s training part (`part`: "train",
  or "dev" for a run trained on it); None if `data_dir` lacks that part.

  `language` default: "en" if present, else the split's first (the queries are the same). Raises
  ValueError: unknown split, malformed data (`readers.DataFormatError`, an unparseable query).
  """
  language = language or divergence.default_language(split, data_dir)
  # The shared copy of the published splits mirrors only dev and test.
  if part not in readers.available_parts(split, language, data_dir):
    return None
  queries = divergence.split_queries(split, part, data_dir, language)
  if not queries:
    return None
  return frozenset(divergence.distributions(queries).compounds)


def unseen_compounds(targets: Sequence[str],
                     train: frozenset[str],
                     source: str = "targets") -> list[tuple[str, ...]]:
  """Per RIR target (length N), the sorted tuple of its compounds not in `train`.

  ValueError names `source`:line for a target that is not RIR of a parseable query.
  """
  out = []
  for i, target in enumerate(targets, start=1):
    try:
      # Compounds are defined on the SPARQL query.
      query = rir.rir_to_sparql(target.strip())
      found = divergence.compounds(query)
    except ValueError as e:
      raise ValueError(f"{source}:{i}: cannot read the compounds of the gold query: {e}") from e
    out.append(tuple(sorted(c for c in found if c not in train)))
  return out


def _check(correct: Sequence[bool], unseen: Sequence[Sequence[str]]) -> np.ndarray:
  if len(correct) != len(unseen):
    raise ValueError(f"{len(correct)} outcomes but {len(unseen)} examples' unseen compounds")
  return np.asarray(correct, dtype=bool)


def by_unseen(correct: Sequence[bool],
              unseen: Sequence[Sequence[str]]) -> dict[str, dict[str, Any]]:
  """{bucket: {"n", "correct", "exact_match": percent}} per bucket of `BUCKETS` with examples.

  `correct` and `unseen` are per example, length N; ValueError if their lengths differ.
  """
  outcomes = _check(correct, unseen)
  n, right = collections.Counter(), collections.Counter()
  for ok, compounds in zip(outcomes, unseen):
    b = bucket_name(len(compounds))
    n[b] += 1
    right[b] += bool(ok)
  return {
      b: {
          "n": n[b],
          "correct": right[b],
          "exact_match": 100.0 * right[b] / n[b]
      } for b in BUCKETS if n[b]
  }


def costliest(correct: Sequence[bool],
              unseen: Sequence[Sequence[str]],
              min_examples: int = MIN_EXAMPLES,
              top: Optional[int] = TOP) -> list[dict[str, Any]]:
  """Unseen compounds in >= `min_examples` examples, ranked by exact matches lost (the first `top`).

  Rows {"compound", "n_with", "correct_with", "exact_match_with", "n_without",
  "exact_match_without" (None if every example has it), "cost" (points), "lost"}, by "lost", then
  "n_with" descending, then compound. ValueError if the lengths differ.
  """
  outcomes = _check(correct, unseen)
  total, total_right = len(outcomes), int(outcomes.sum())
  n, right = collections.Counter(), collections.Counter()
  for ok, compounds in zip(outcomes, unseen):
    for c in compounds:
      n[c] += 1
      right[c] += bool(ok)
  rows = []
  for c, n_with in n.items():
    if n_with < min_examples:
      continue
    with_ = 100.0 * right[c] / n_with
    n_without = total - n_with
    without = 100.0 * (total_right - right[c]) / n_without if n_without else None
    cost = (without - with_) if without is not None else None
    rows.append({
        "compound": c,
        "n_with": n_with,
        "correct_with": right[c],
        "exact_match_with": with_,
        "n_without": n_without,
        "exact_match_without": without,
        "cost": cost,
        # The exact matches the set would gain were the examples with c as often right as the
        # others; compounds come in groups, so this is the cost of the examples containing c, not of
        # c alone.
        "lost": n_with * cost / 100.0 if cost is not None else None
    })
  # Rounded: equal losses computed in a different order compare equal (then more examples first).
  rows.sort(key=lambda r: (-round(r["lost"], 9)
                           if r["lost"] is not None else np.inf, -r["n_with"], r["compound"]))
  return rows[:top] if top is not None else rows


def plot_by_unseen(runs: Sequence[dict[str, Any]], title: str, path: Any) -> None:
  """Writes a PNG (`path`, matplotlib Agg; whole or not at all, else `writers.ResultWriteError`) of
  exact match per bucket, one line per run, with the 95% bootstrap interval as error bars where
  each bucket has "ci"."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(8, 4.5))
  x_of = {b: i for i, b in enumerate(BUCKETS)}
  width = 0.8 / max(len(runs), 1)
  for k, run in enumerate(runs):
    buckets = [b for b in BUCKETS if b in run["by_unseen"]]
    xs = np.array([x_of[b] for b in buckets]) + (k - (len(runs) - 1) / 2) * width
    ys = np.array([run["by_unseen"][b]["exact_match"] for b in buckets])
    cis = [run["by_unseen"][b].get("ci") for b in buckets]
    if all(ci is not None for ci in cis):
      err = np.array([[y - ci[0] for y, ci in zip(ys, cis)], [ci[1] - y for y, ci in zip(ys, cis)]])
      ax.errorbar(xs, ys, yerr=np.maximum(err, 0), marker="o", capsize=3, label=run["label"])
    else:
      ax.plot(xs, ys, marker="o", label=run["label"])
    for x, y, b in zip(xs, ys, buckets):
      ax.annotate(
          f"n={run['by_unseen'][b]['n']}", (x, y),
          textcoords="offset points",
          xytext=(0, 6),
          ha="center",
          fontsize=7)
  ax.set_xticks(range(len(BUCKETS)))
  ax.set_xticklabels(BUCKETS)
  ax.set_xlabel("unseen compounds in the test query (compounds of no training query)")
  ax.set_ylabel("exact match (%)")
  ax.set_ylim(0, 105)
  ax.set_title(title, fontsize=10)
  ax.legend()
  fig.tight_layout()
  try:
    with writers.open_atomic(path, binary=True) as f:  # whole or not at all
      fig.savefig(f, format="png", dpi=100)
  finally:
    plt.close(fig)
