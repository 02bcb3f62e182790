"""Evaluation metrics of the MCWQ paper (Cui et al., TACL 2022, §5-§6): Python, NumPy, sacrebleu.

seqio-style metric functions take line-parallel `(targets, predictions)` (str, or UTF-8 `bytes`)
and return `{name: float}`: exact match (§5.2), BLEU (Table 4), query equivalence, and the §6.2
error categories (Figures 5-6, defined in `ErrorAnalysis`); also accuracy by `recursionDepth`
(Figure 4) and the test-intersection matching (Table 6). No TensorFlow import (runs on the GPU
image). A malformed PREDICTION never raises (it is category "syntax_error"); a malformed TARGET
raises ValueError.
"""
from __future__ import annotations

import collections
import dataclasses
import difflib
import functools
import logging
from typing import Any, Mapping, Optional, Sequence, Union

import numpy as np
import sacrebleu

from mcwq_t5x.data import rir as rir_lib
from mcwq_t5x.data import sparql as sparql_lib

Text = Union[str, bytes]


def _to_str(value: Text) -> str:
  """`value` as `str` (`bytes` decoded as UTF-8, errors replaced); TypeError for anything else."""
  if isinstance(value, bytes):
    return value.decode("utf-8", errors="replace")
  if isinstance(value, str):
    return value
  raise TypeError(f"expected str or bytes, got {type(value).__name__}: {value!r}")


def _check_lengths(targets: Sequence[Text], predictions: Sequence[Text]) -> None:
  if len(targets) != len(predictions):
    raise ValueError(
        f"{len(predictions)} predictions but {len(targets)} targets: they must be line-parallel")


def _stripped_pairs(targets: Sequence[Text],
                    predictions: Sequence[Text]) -> tuple[list[str], list[str]]:
  """(targets, predictions) stripped; ValueError on unequal lengths, TypeError on non-text."""
  _check_lengths(targets, predictions)
  return [_to_str(t).strip() for t in targets], [_to_str(p).strip() for p in predictions]


def exact_matches(targets: Sequence[Text], predictions: Sequence[Text]) -> np.ndarray:
  """Per-example exact match (§5.2): bool [N], prediction == target after `str.strip()`.

  Raises ValueError (lengths differ) or TypeError (element not str/bytes).
  """
  refs, hyps = _stripped_pairs(targets, predictions)
  return np.array([r == h for r, h in zip(refs, hyps)], dtype=bool)


def exact_match_metric(targets: Sequence[Text], predictions: Sequence[Text]) -> dict[str, float]:
  """Exact-match accuracy (§5.2, Table 4): {"exact_match": percent in [0, 100]}, 0.0 when N == 0.

  Only surrounding whitespace is stripped, as in the paper's script. Raises as `exact_matches`.
  """
  correct = exact_matches(targets, predictions)
  return {"exact_match": 100.0 * int(correct.sum()) / len(correct) if len(correct) else 0.0}


def bleu_metric(targets: Sequence[Text], predictions: Sequence[Text]) -> dict[str, float]:
  """Corpus BLEU (Table 4): {"bleu": [0, 100]}, sacrebleu defaults (13a, exp smoothing).

  Lines are stripped first; 0.0 when N == 0. Raises as `exact_matches`.
  """
  refs, hyps = _stripped_pairs(targets, predictions)
  if not refs:
    return {"bleu": 0.0}
  # A report scores every model of a split against the same references.
  return {"bleu": float(_bleu_of_references(tuple(refs)).corpus_score(hyps, None).score)}


@functools.lru_cache(maxsize=2)
def _bleu_of_references(refs: tuple[str, ...]) -> sacrebleu.BLEU:
  """`sacrebleu.BLEU` holding one reference set's n-gram statistics (computed once)."""
  return sacrebleu.BLEU(references=[list(refs)])


# ----------------------------------------------------------------------------------------------
# Query equivalence and the error categories of §6.2.
# ----------------------------------------------------------------------------------------------

RIR = "rir"
SPARQL = "sparql"
FORMATS = (RIR, SPARQL)

CORRECT = "correct"
EQUIVALENT = "equivalent"
SYNTAX_ERROR = "syntax_error"
MISSING_PROPERTY = "missing_property"
EXTRA_PROPERTY = "extra_property"
WRONG_PROPERTY = "wrong_property"
MISSING_ENTITY = "missing_entity"
EXTRA_ENTITY = "extra_entity"
WRONG_ENTITY = "wrong_entity"
MULTIPLE_ERRORS = "multiple_errors"
WRONG_STRUCTURE = "wrong_structure"

# Every category `classify_error` can return, in the order tables and figures show them.
ERROR_CATEGORIES = (CORRECT, EQUIVALENT, SYNTAX_ERROR, MISSING_PROPERTY, EXTRA_PROPERTY,
                    WRONG_PROPERTY, MISSING_ENTITY, EXTRA_ENTITY, WRONG_ENTITY, MULTIPLE_ERRORS,
                    WRONG_STRUCTURE)
# The categories that are errors under exact match (everything but CORRECT).
ERROR_ONLY_CATEGORIES = ERROR_CATEGORIES[1:]

_logger = logging.getLogger(__name__)


def _check_format(fmt: str) -> None:
  if fmt not in FORMATS:
    raise ValueError(f"unknown query format {fmt!r}; expected one of {FORMATS}")


def parse_query(text: Text, fmt: str = RIR) -> Optional[sparql_lib.Query]:
  """The `sparql.Query` of one RIR or SPARQL string (`fmt` "rir" | "sparql"), None when malformed.

  Raises ValueError only for an unknown `fmt`, never for bad text.
  """
  _check_format(fmt)
  try:
    text = _to_str(text)
  except TypeError:
    return None
  return _parse_cached(text, fmt)


@functools.lru_cache(maxsize=1 << 16)
# Cached: gold queries repeat a lot and `Query` is immutable.
def _parse_cached(text: str, fmt: str) -> Optional[sparql_lib.Query]:
  """`parse_query` on a str, cached."""
  try:
    if fmt == RIR:
      return rir_lib.rir_to_query(text)
    return sparql_lib.parse_sparql(text)
  except ValueError:  # RIRError, SparqlParseError, UnicodeError.
    return None
  except (TypeError, RecursionError, IndexError, KeyError) as e:  # A parser bug: still "malformed".
    _logger.warning("unexpected %s while parsing %r: %s", type(e).__name__, text, e)
    return None


def _parse_gold(text: Text, fmt: str, index: Optional[int] = None) -> sparql_lib.Query:
  query = parse_query(text, fmt)
  if query is None:
    which = "target" if index is None else f"target #{index + 1}"
    raise ValueError(f"{which} is not a well-formed {fmt} query: {_to_str(text)!r}")
  return query


def equivalence_metric(targets: Sequence[Text],
                       predictions: Sequence[Text],
                       fmt: str = RIR) -> dict[str, float]:
  """Query-equivalence accuracy (not in the paper): {"equivalence": percent}, 0.0 when N == 0.

  Equal `sparql.Query.canonical()` forms: equal up to order and duplication of triples and
  filters; malformed predictions are wrong. Raises ValueError (lengths, `fmt`, malformed target).
  """
  _check_lengths(targets, predictions)
  _check_format(fmt)
  if not targets:
    return {"equivalence": 0.0}
  correct = 0
  for i, (t, p) in enumerate(zip(targets, predictions)):
    gold = _parse_gold(t, fmt, i)
    pred = parse_query(p, fmt)
    correct += gold.equivalent(pred)
  return {"equivalence": 100.0 * correct / len(targets)}


def _set_error_kinds(gold: set[str], pred: set[str], missing: str, extra: str,
                     wrong: str) -> list[str]:
  """Kinds of difference between two sets (see `ErrorAnalysis`)."""
  n_missing, n_extra = len(gold - pred), len(pred - gold)
  n_wrong = min(n_missing, n_extra)
  kinds = []
  if n_missing > n_wrong:
    kinds.append(missing)
  if n_extra > n_wrong:
    kinds.append(extra)
  if n_wrong:
    kinds.append(wrong)
  return kinds


@dataclasses.dataclass(frozen=True)
class ErrorAnalysis:
  """The error category of one prediction (MCWQ paper §6.2, Figures 5-6), with its evidence.

  Properties are triple predicates (`wdt:P57`; a path `wdt:P1|wdt:P2` is one); entities are
  `M0`..`M9` and constants (`wd:Q30`) as subject, object or in a filter, not variables; both are
  compared as SETS. With G gold and P predicted: wrong = min(|G\\P|, |P\\G|), missing = |G\\P| -
  wrong, extra = |P\\G| - wrong. `category`, by precedence: "correct" (exact match),
  "syntax_error" (does not parse), "equivalent" (same canonical query), one of
  missing/extra/wrong _property/_entity when exactly one kind occurs, "multiple_errors", else
  "wrong_structure" (same sets; other triples, filters, variables or query form).
  """
  category: str
  kinds: tuple[str, ...] = ()
  missing_properties: tuple[str, ...] = ()
  extra_properties: tuple[str, ...] = ()
  missing_entities: tuple[str, ...] = ()
  extra_entities: tuple[str, ...] = ()


def analyze_error(target: Text, prediction: Text, fmt: str = RIR) -> ErrorAnalysis:
  """The `ErrorAnalysis` of one prediction; ValueError for a malformed target or unknown `fmt`."""
  _check_format(fmt)
  target_s, prediction_s = _to_str(target).strip(), _to_str(prediction).strip()
  if target_s == prediction_s:
    # Still insist that the gold query is well formed.
    _parse_gold(target_s, fmt)
    return ErrorAnalysis(CORRECT)
  gold = _parse_gold(target_s, fmt)
  pred = parse_query(prediction_s, fmt)
  if pred is None:
    return ErrorAnalysis(SYNTAX_ERROR)
  if gold.equivalent(pred):
    return ErrorAnalysis(EQUIVALENT)
  # Sets, not multisets: repetition is structure, and RIR groups merge repeats.
  gold_props, pred_props = set(gold.properties()), set(pred.properties())
  gold_ents = set(gold.entities(include_filters=True))
  pred_ents = set(pred.entities(include_filters=True))
  kinds = (
      _set_error_kinds(gold_props, pred_props, MISSING_PROPERTY, EXTRA_PROPERTY, WRONG_PROPERTY) +
      _set_error_kinds(gold_ents, pred_ents, MISSING_ENTITY, EXTRA_ENTITY, WRONG_ENTITY))
  if not kinds:
    category = WRONG_STRUCTURE
  elif len(kinds) == 1:
    category = kinds[0]
  else:
    category = MULTIPLE_ERRORS
  return ErrorAnalysis(
      category,
      tuple(kinds),
      missing_properties=tuple(sorted(gold_props - pred_props)),
      extra_properties=tuple(sorted(pred_props - gold_props)),
      missing_entities=tuple(sorted(gold_ents - pred_ents)),
      extra_entities=tuple(sorted(pred_ents - gold_ents)))


def classify_error(target: Text, prediction: Text, fmt: str = RIR) -> str:
  """The error category (one of `ERROR_CATEGORIES`) of one prediction; see `ErrorAnalysis`."""
  return analyze_error(target, prediction, fmt).category


def error_categories(targets: Sequence[Text],
                     predictions: Sequence[Text],
                     fmt: str = RIR) -> list[str]:
  """Per-example `classify_error` categories; ValueError names the 1-based example on bad input."""
  _check_lengths(targets, predictions)
  out = []
  for i, (t, p) in enumerate(zip(targets, predictions)):
    try:
      out.append(classify_error(t, p, fmt))
    except ValueError as e:
      raise ValueError(f"example #{i + 1}: {e}") from None
  return out


def error_category_counts(targets: Sequence[Text],
                          predictions: Sequence[Text],
                          fmt: str = RIR) -> dict[str, int]:
  """Count per category of `ERROR_CATEGORIES` (zeros too; sum N); raises as `error_categories`."""
  counts = collections.Counter(error_categories(targets, predictions, fmt))
  return {c: int(counts.get(c, 0)) for c in ERROR_CATEGORIES}


def error_category_metric(targets: Sequence[Text], predictions: Sequence[Text]) -> dict[str, float]:
  """seqio metric_fn: the percentage of each error category (keys "errors/<category>")."""
  counts = error_category_counts(targets, predictions)
  n = max(len(targets), 1)
  return {f"errors/{c}": 100.0 * k / n for c, k in counts.items()}


def accuracy_by_complexity(targets: Sequence[Text], predictions: Sequence[Text],
                           depths: Sequence[Optional[int]]) -> dict[int, dict[str, float]]:
  """Exact match per `recursionDepth` (Figure 4): {depth: {"n", "correct", "exact_match": %}}.

  `depths`: length N, int or None (skipped). ValueError: unequal lengths, non-int depth.
  """
  _check_lengths(targets, predictions)
  if len(depths) != len(targets):
    raise ValueError(f"{len(depths)} depths but {len(targets)} targets")
  n: dict[int, int] = collections.Counter()
  correct: dict[int, int] = collections.Counter()
  matches = exact_matches(targets, predictions)
  for i, (hit, d) in enumerate(zip(matches, depths)):
    if d is None:
      continue
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
      raise ValueError(f"depth #{i + 1} is {d!r}, expected an integer or None")
    d = int(d)
    n[d] += 1
    correct[d] += bool(hit)
  return {
      d: {
          "n": n[d],
          "correct": correct[d],
          "exact_match": 100.0 * correct[d] / n[d]
      } for d in sorted(n)
  }


def score_predictions(targets: Sequence[Text],
                      predictions: Sequence[Text],
                      fmt: str = RIR,
                      per_example: bool = False) -> dict[str, Any]:
  """Every string-level score (§5.2, Table 4; §6.2): {"n", "exact_match", "bleu", "equivalence",
  "error_categories": {category: count}}, plus "categories" [N] with `per_example`.

  Raises ValueError (lengths, `fmt`, malformed target).
  """
  result: dict[str, Any] = {"n": len(targets)}
  result.update(exact_match_metric(targets, predictions))
  result.update(bleu_metric(targets, predictions))
  # error_categories first: its ValueError on a malformed target names the example.
  categories = error_categories(targets, predictions, fmt)
  result.update(equivalence_metric(targets, predictions, fmt))
  found = collections.Counter(categories)
  result["error_categories"] = {c: int(found.get(c, 0)) for c in ERROR_CATEGORIES}
  if per_example:
    result["categories"] = categories
  return result


# ----------------------------------------------------------------------------------------------
# Test-intersection: the gold test set and its machine-translated counterpart (§4.3, Table 6).
# ----------------------------------------------------------------------------------------------

QuestionColumns = Union[Sequence[str], Mapping[str, Sequence[str]]]


def _as_columns(questions: Optional[QuestionColumns]) -> Optional[dict[str, Sequence[str]]]:
  if questions is None:
    return None
  if isinstance(questions, Mapping):
    return dict(questions)
  # One language given as a bare list.
  return {"": questions}


def match_test_intersection(gold_targets: Sequence[str],
                            mcd_targets: Sequence[str],
                            gold_questions: Optional[QuestionColumns] = None,
                            mcd_questions: Optional[QuestionColumns] = None) -> list[Optional[int]]:
  """Indices (0-based, or None) of the test-intersection-gold examples in an MCD test set (§4.3,
  Table 6), length G.

  The files carry no ids: a gold example takes, among the unused MCD lines with its target, the
  one whose questions are most similar (mean `difflib` ratio over the shared languages; ties to the
  lowest line). `*_questions`: a list, or {language: list}, both sides or neither. On the shared
  data all 155 gold targets occur in mcd1/test, 89 once. Raises ValueError on one-sided questions,
  no common language, or wrong lengths.
  """
  gold_cols, mcd_cols = _as_columns(gold_questions), _as_columns(mcd_questions)
  if (gold_cols is None) != (mcd_cols is None):
    raise ValueError("give questions for both the gold and the MCD set, or for neither")
  languages: list[str] = []
  if gold_cols is not None:
    languages = [l for l in gold_cols if l in mcd_cols]
    if not languages:
      raise ValueError(f"no common question language: gold has {sorted(gold_cols)}, "
                       f"MCD has {sorted(mcd_cols)}")
    for l in languages:
      if len(gold_cols[l]) != len(gold_targets):
        raise ValueError(f"{len(gold_cols[l])} gold questions ({l or 'one language'}) but "
                         f"{len(gold_targets)} gold targets")
      if len(mcd_cols[l]) != len(mcd_targets):
        raise ValueError(f"{len(mcd_cols[l])} MCD questions ({l or 'one language'}) but "
                         f"{len(mcd_targets)} MCD targets")
  # A shared target is necessary, not sufficient: questions share queries.
  lines_of: dict[str, list[int]] = collections.defaultdict(list)
  for j, t in enumerate(mcd_targets):
    lines_of[t.strip()].append(j)
  # One-to-one: each MCD line is taken at most once.
  used: set[int] = set()
  matches: list[Optional[int]] = []
  for i, t in enumerate(gold_targets):
    candidates = [j for j in lines_of.get(t.strip(), ()) if j not in used]
    if not candidates:
      matches.append(None)
      continue
    if languages:

      def score(j: int, i: int = i) -> float:
        total = 0.0
        for l in languages:
          a, b = gold_cols[l][i].strip(), mcd_cols[l][j].strip()
          total += 1.0 if a == b else difflib.SequenceMatcher(None, a, b).ratio()
        return total / len(languages)

      # An identical English question pins it; translators often kept the MT.
      best = max(candidates, key=lambda j: (score(j), -j))
    else:
      # No questions: the first unused candidate.
      best = candidates[0]
    used.add(best)
    matches.append(best)
  return matches
