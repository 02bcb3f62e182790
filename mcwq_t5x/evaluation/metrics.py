"""Evaluation metrics of the MCWQ paper (Cui et al., TACL 2022, §5-§6).

Pure Python/NumPy plus sacrebleu: no TensorFlow or seqio import, so the module runs on
the GPU image and inside seqio evaluation alike.

The seqio-style metric functions take `(targets, predictions)` (two equally long
sequences of strings, or of UTF-8 `bytes` as seqio may hand over un-postprocessed
features) and return a dict `{name: float}`:

  * `exact_match_metric` -> {"exact_match": percent}: whitespace-stripped string
    equality, as the paper's evaluation script (§5.2).
  * `bleu_metric` -> {"bleu": score in [0, 100]}: sacrebleu corpus BLEU with default
    settings (13a tokenisation, exponential smoothing), one reference per example.
  * `equivalence_metric` -> {"equivalence": percent}: query equivalence up to triple order and
    duplicates (RIR -> `sparql.Query.canonical`); malformed predictions count as wrong.
  * `error_category_metric` -> {"errors/<category>": percent}: the §6.2 error categories.

Further analyses: `analyze_error` / `classify_error` / `error_category_counts` (§6.2, Figures
5-6; definitions in `ErrorAnalysis`), `accuracy_by_complexity` (Figure 4),
`match_test_intersection` (test-intersection-gold vs -MT, Table 6) and `score_predictions` (every
score the `mcwq_t5x.score` command line prints but execution accuracy, which needs a SPARQL
store: `mcwq_t5x.evaluation.execution`).

No metric ever raises on a malformed PREDICTION (empty line, truncated query, unbalanced
parentheses, binary junk): it is simply wrong (category "syntax_error"). Malformed TARGETS are
data errors and raise ValueError.
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
  """Returns `value` as `str`; `bytes` are decoded as UTF-8 (undecodable bytes replaced)."""
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
  """(targets, predictions) decoded to str and whitespace-stripped, after the length check.

  Raises:
    ValueError: the sequences differ in length.  TypeError: an element is not str/bytes.
  """
  _check_lengths(targets, predictions)
  return [_to_str(t).strip() for t in targets], [_to_str(p).strip() for p in predictions]


def exact_matches(targets: Sequence[Text], predictions: Sequence[Text]) -> np.ndarray:
  """Per-example exact match (§5.2): bool array [N], True where the prediction equals the target
  after `str.strip()`; the one definition the metric, the report and its intervals use.

  Raises:
    ValueError: the sequences differ in length.  TypeError: an element is not str/bytes.
  """
  refs, hyps = _stripped_pairs(targets, predictions)
  return np.array([r == h for r, h in zip(refs, hyps)], dtype=bool)


def exact_match_metric(targets: Sequence[Text], predictions: Sequence[Text]) -> dict[str, float]:
  """Exact-match accuracy of the MCWQ paper (§5.2, Table 4).

  An example counts as correct when the prediction equals the target after stripping
  leading and trailing whitespace (`str.strip()`); nothing else is normalised, so token
  order and spacing inside the query matter, as in the paper's evaluation script.

  Args:
    targets: gold strings (RIR or SPARQL), length N; `bytes` are decoded as UTF-8.
    predictions: predicted strings, length N, line-parallel with `targets`.

  Returns:
    {"exact_match": float}: percentage of exact matches in [0, 100]; 0.0 when N == 0.

  Raises:
    ValueError: if the two sequences differ in length.
    TypeError: if an element is neither str nor bytes.
  """
  correct = exact_matches(targets, predictions)
  return {"exact_match": 100.0 * int(correct.sum()) / len(correct) if len(correct) else 0.0}


def bleu_metric(targets: Sequence[Text], predictions: Sequence[Text]) -> dict[str, float]:
  """Corpus BLEU of predicted vs gold query lines (MCWQ paper Table 4, "BLEU").

  The score of `sacrebleu.corpus_bleu(predictions, [targets])`, sacrebleu's default
  settings (13a tokenisation, exponential smoothing, case-sensitive), one reference
  per example; the references' statistics are kept for the next call with the same
  references (`_bleu_of_references`). Lines are whitespace-stripped first (as for exact
  match). Any string, including empty or junk predictions, is accepted.

  Args:
    targets: gold strings, length N.
    predictions: predicted strings, length N.

  Returns:
    {"bleu": float}: corpus BLEU in [0, 100]; 0.0 when N == 0.

  Raises:
    ValueError: if the two sequences differ in length.
    TypeError: if an element is neither str nor bytes.
  """
  refs, hyps = _stripped_pairs(targets, predictions)
  if not refs:
    return {"bleu": 0.0}
  return {"bleu": float(_bleu_of_references(tuple(refs)).corpus_score(hyps, None).score)}


@functools.lru_cache(maxsize=2)
def _bleu_of_references(refs: tuple[str, ...]) -> sacrebleu.BLEU:
  """`sacrebleu.BLEU()` (the settings of `sacrebleu.corpus_bleu`) holding the n-gram statistics of
  one reference set: a report scores every language and model of a split against the same
  queries, so the references' statistics are computed once."""
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
  """Parses a query string, returning None when it is malformed.

  Args:
    text: one query (RIR as in `translations/*/*.sparql`, or SPARQL as in `official/`), str or
      UTF-8 bytes; surrounding whitespace is ignored.
    fmt: "rir" (parsed with `rir.rir_to_query`) or "sparql" (parsed with `sparql.parse_sparql`).

  Returns:
    The parsed `sparql.Query`, or None if `text` is not a well-formed query of that format
    (empty line, truncated query, unbalanced parentheses, binary junk, ...). Never raises for bad
    text.

  Raises:
    ValueError: unknown `fmt`.
  """
  _check_format(fmt)
  try:
    text = _to_str(text)
  except TypeError:
    return None
  return _parse_cached(text, fmt)


@functools.lru_cache(maxsize=1 << 16)
def _parse_cached(text: str, fmt: str) -> Optional[sparql_lib.Query]:
  """`parse_query` on a str, cached (gold queries repeat a lot; `Query` is immutable)."""
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
  """Query-equivalence accuracy: a more lenient measure than exact match (not in the paper).

  A prediction is correct when it parses and its canonical form (`sparql.Query.canonical`: the
  query form and the SETS of triples and of filters, after expanding RIR groups into triples)
  equals the target's, i.e. the two queries are equal up to the order and duplication of triples
  and filters. Malformed predictions count as wrong. Exact matches are always equivalent.

  Args:
    targets: gold queries, length N, in format `fmt`.
    predictions: predicted queries, length N, in format `fmt`.
    fmt: "rir" or "sparql".

  Returns:
    {"equivalence": float}: percentage in [0, 100]; 0.0 when N == 0.

  Raises:
    ValueError: lengths differ, unknown `fmt`, or a TARGET is malformed (the message gives its
      1-based position).
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

  Properties are the predicates of the triples (`wdt:P57`; an alternative path `wdt:P1|wdt:P2` is
  one property). Entities are the placeholders `M0`..`M9` and the constants (`wd:Q30`) in subject
  or object position of a triple or in a filter; variables (`?x0`) are not entities. Properties
  and entities are compared as SETS (not multisets): how often a property is used is a matter of
  query structure, and RIR groups already merge repeated subjects and predicates.

  With G the gold set and P the predicted set (of properties, likewise of entities):
    * missing  = |G \\ P| - min(|G \\ P|, |P \\ G|)  (gold items left out),
    * extra    = |P \\ G| - min(|G \\ P|, |P \\ G|)  (items added),
    * wrong    = min(|G \\ P|, |P \\ G|)           (items substituted by others).
  So "wrong property" with nothing else means: same number of properties, different sets; a
  prediction that both substitutes and leaves out properties has two kinds.

  `category` is then, in this order of precedence:
    * "correct": exact match (whitespace-stripped strings equal);
    * "syntax_error": the prediction does not parse (empty, truncated, unbalanced parentheses,
      junk) -- the paper's malformed predictions;
    * "equivalent": not an exact match, but the same query up to the order and duplication of
      triples/filters (`sparql.Query.canonical`);
    * one of "missing_property", "extra_property", "wrong_property", "missing_entity",
      "extra_entity", "wrong_entity" when exactly one kind of difference occurs;
    * "multiple_errors": more than one of those six kinds occurs;
    * "wrong_structure": same property set and same entity set, but different triples, filters,
      variables or query form (e.g. ASK instead of SELECT, swapped subject and object).

  Attributes:
    category: one of `ERROR_CATEGORIES`.
    kinds: the property/entity difference kinds found (empty unless the prediction parses).
    missing_properties, extra_properties, missing_entities, extra_entities: sorted tuples of the
      set differences gold minus prediction and prediction minus gold.
  """
  category: str
  kinds: tuple[str, ...] = ()
  missing_properties: tuple[str, ...] = ()
  extra_properties: tuple[str, ...] = ()
  missing_entities: tuple[str, ...] = ()
  extra_entities: tuple[str, ...] = ()


def analyze_error(target: Text, prediction: Text, fmt: str = RIR) -> ErrorAnalysis:
  """Classifies one prediction against its gold query (definitions in `ErrorAnalysis`).

  Args:
    target: the gold query (format `fmt`).
    prediction: the predicted query (format `fmt`); may be anything, including junk.
    fmt: "rir" or "sparql".

  Returns:
    An `ErrorAnalysis`.

  Raises:
    ValueError: the TARGET is malformed, or unknown `fmt`. A malformed prediction never raises.
  """
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
  """Per-example error categories (`classify_error`) of line-parallel targets and predictions.

  Raises:
    ValueError: lengths differ, unknown `fmt`, or a target is malformed (message gives its
      1-based position).
  """
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
  """How many predictions fall into each category of `ERROR_CATEGORIES` (zeros included).

  The counts sum to N; "correct" equals the number of exact matches. See `ErrorAnalysis` for the
  definitions. Raises as `error_categories`.
  """
  counts = collections.Counter(error_categories(targets, predictions, fmt))
  return {c: int(counts.get(c, 0)) for c in ERROR_CATEGORIES}


def error_category_metric(targets: Sequence[Text], predictions: Sequence[Text]) -> dict[str, float]:
  """seqio metric_fn: the percentage of each error category (keys "errors/<category>")."""
  counts = error_category_counts(targets, predictions)
  n = max(len(targets), 1)
  return {f"errors/{c}": 100.0 * k / n for c, k in counts.items()}


def accuracy_by_complexity(targets: Sequence[Text], predictions: Sequence[Text],
                           depths: Sequence[Optional[int]]) -> dict[int, dict[str, float]]:
  """Exact-match accuracy per query complexity (MCWQ paper Figure 4).

  Complexity is CFQ/MCWQ's `recursionDepth` (an integer, about 9-50 in MCWQ), given per example
  (e.g. from `readers.Example.recursionDepth` of the full release's dataset.json). Examples with
  depth None are skipped.

  Args:
    targets, predictions: line-parallel strings, length N.
    depths: length N, int or None.

  Returns:
    {depth: {"n": count, "correct": exact matches, "exact_match": percent}}, sorted by depth.

  Raises:
    ValueError: the three sequences differ in length, or a depth is not an integer.
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
  """Scores one prediction set with every string-level metric, as the evaluation CLI prints them.

  Exact match and BLEU (MCWQ paper §5.2, Table 4), query equivalence, and the error categories of
  §6.2 (Figures 5-6). Execution accuracy needs a SPARQL store and is `mcwq_t5x.evaluation.execution`'s.

  Args:
    targets: gold queries, length N, in format `fmt`.
    predictions: predicted queries, length N (anything; malformed ones are scored as wrong).
    fmt: "rir" or "sparql".
    per_example: also return each prediction's category (key "categories").

  Returns:
    {"n": N, "exact_match": percent, "bleu": BLEU, "equivalence": percent,
     "error_categories": {category: count}} (see the individual functions), and with
    `per_example` "categories": N categories of `ERROR_CATEGORIES` in input order ("correct" =
    exact match).

  Raises:
    ValueError: lengths differ, unknown `fmt`, or a malformed target.
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
  return {"": questions}


def match_test_intersection(gold_targets: Sequence[str],
                            mcd_targets: Sequence[str],
                            gold_questions: Optional[QuestionColumns] = None,
                            mcd_questions: Optional[QuestionColumns] = None) -> list[Optional[int]]:
  """Finds the examples of the gold test set (test-intersection-gold) in an MCD test set.

  The gold set holds 155 test questions common to the MCD test sets, translated by humans; the
  same examples in the MCD test set (with machine-translated questions) form
  test-intersection-MT (MCWQ paper §4.3, Table 6). The published files carry no example ids, so
  examples are matched:

    1. Candidates: MCD test lines whose target equals the gold target (whitespace-stripped). The
       target is the same query, so this is necessary; it is not sufficient, since different
       questions share a query.
    2. Each gold example takes, among its still unused candidates, the one whose questions are
       most similar to the gold questions: the mean, over the languages given on both sides, of
       `difflib.SequenceMatcher` ratios (an identical question scores 1); ties go to the lowest
       line. Give English questions on both sides when the gold set has them (an identical
       English question then pins the example); otherwise the gold human translations and the
       MCD machine translations of the same languages (both are often identical: translators
       kept a good machine translation). Without questions, the first unused candidate is taken.
    3. Candidates are used at most once (one-to-one); gold examples with no unused candidate map
       to None.

  On the shared data (translations/gold/test.{he,kn,zh} vs translations/mcd1/test.*), all 155
  gold targets occur in the MCD1 test set, 89 of them exactly once.

  Args:
    gold_targets: gold-set targets, length G.
    mcd_targets: MCD test targets, length M.
    gold_questions, mcd_questions: optional questions (both or neither): a list (one language),
      or a mapping {language: list} (several languages; only languages on both sides count).
      Gold lists have length G, MCD lists length M.

  Returns:
    Length-G list of 0-based MCD line indices (or None when not found).

  Raises:
    ValueError: questions given for one side only, with no common language, or with the wrong
      length.
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
  lines_of: dict[str, list[int]] = collections.defaultdict(list)
  for j, t in enumerate(mcd_targets):
    lines_of[t.strip()].append(j)
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

      best = max(candidates, key=lambda j: (score(j), -j))
    else:
      best = candidates[0]
    used.add(best)
    matches.append(best)
  return matches
