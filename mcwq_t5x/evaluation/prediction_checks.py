"""Checks that a prediction file is scored against the gold lines it belongs to, and reads as text.

Line i of a prediction file is scored against line i of a gold file: a reordered file, or one of
other questions, would still get a number, near zero. `check_alignment` measures how often the
predictions' placeholders (`M0`...`M9`, copied from the question long before the query is right)
agree with their own gold query and question, as Cohen's kappa against a random pairing of the
same lines. Misalignment, runaway lines and invalid UTF-8 are warnings (stderr, result JSON),
never errors: the scores are still computed.
"""
from __future__ import annotations

import collections
import dataclasses
import pathlib
import re
from typing import Any, Optional, Sequence

from mcwq_t5x.data import sparql as sparql_lib
from mcwq_t5x.evaluation import metrics

#: Kappa under which the predictions count as misaligned with their gold lines or questions.
# why 0.2: the paper's 10 published prediction files have kappa >= 0.79 (gold) and >= 0.75
# (questions), shuffled <= 0.01; a tiny model at 150 steps 0.69 and 0.90.
MIN_KAPPA = 0.2
#: Fewer lines than this are not checked (kappa is too noisy).
MIN_LINES = 20
#: The fraction of predictions that must be well-formed queries for the check to be made.
MIN_WELL_FORMED = 0.5
#: Chance agreement above which the placeholders cannot tell aligned from misaligned lines.
MAX_CHANCE = 0.8
#: Line numbers listed in a warning about invalid UTF-8 (the count is always given).
MAX_LINES_NAMED = 5
#: A prediction line longer than this many times the longest gold line is warned about. The
#: published predictions (../shared/mcwq/results) are at most 2.0 times their gold's longest line.
LONG_LINE_FACTOR = 10

# A placeholder in a question: M0..M9 between non-ASCII-word characters, so that "M0's" and the
# Chinese "M0的" count, "M0M1" or "HM0" do not.
_QUESTION_PLACEHOLDER_RE = re.compile(r"(?<![A-Za-z0-9_])M[0-9]+(?![A-Za-z0-9_])")


def query_placeholders(query: str) -> frozenset[str]:
  """The placeholders (`M0`...) of a RIR or SPARQL query, any text: its whitespace-separated
  tokens that are placeholders (`sparql.is_placeholder`)."""
  return frozenset(t for t in query.split() if sparql_lib.is_placeholder(t))


def question_placeholders(question: str) -> frozenset[str]:
  """The placeholders (`M0`...) a question names, in any script."""
  return frozenset(_QUESTION_PLACEHOLDER_RE.findall(question))


@dataclasses.dataclass(frozen=True)
class Agreement:
  """Placeholder agreement with the own lines: `observed` and `chance` fractions (chance exact from
  the two columns' frequencies) and `kappa` = (observed - chance) / (1 - chance), None when
  `chance` exceeds `MAX_CHANCE`."""
  observed: float
  chance: float
  kappa: Optional[float]

  def to_json(self) -> dict[str, Any]:
    return {
        "observed": round(self.observed, 4),
        "chance": round(self.chance, 4),
        "kappa": None if self.kappa is None else round(self.kappa, 4)
    }


def _agreement(preds: Sequence[frozenset[str]], others: Sequence[frozenset[str]],
               agree: Any) -> Agreement:
  """`Agreement` of `agree(pred, other)` over the line pairs, chance from the columns' counts."""
  n = len(preds)
  observed = sum(bool(agree(p, o)) for p, o in zip(preds, others)) / n
  pred_counts, other_counts = collections.Counter(preds), collections.Counter(others)
  chance = sum(
      cp * co for p, cp in pred_counts.items() for o, co in other_counts.items() if agree(p, o)) / (
          n * n)
  kappa = None if chance > MAX_CHANCE else (observed - chance) / (1.0 - chance)
  return Agreement(observed, chance, kappa)


def check_alignment(predictions: Sequence[str],
                    targets: Sequence[str],
                    questions: Optional[Sequence[str]] = None) -> dict[str, Any]:
  """{"checked", "misaligned", "reason", "well_formed", "targets", ["questions"]} for line-parallel
  predictions, RIR targets and optional questions.

  "reason" says why not checked or why misaligned; "targets"/"questions" are `Agreement.to_json()`.
  ValueError if the lengths differ.
  """
  n = len(predictions)
  if len(targets) != n or (questions is not None and len(questions) != n):
    raise ValueError(f"{n} predictions, {len(targets)} targets"
                     f"{'' if questions is None else f', {len(questions)} questions'}: "
                     "the lines must be parallel")
  result: dict[str, Any] = {"checked": False, "misaligned": False}
  if n < MIN_LINES:
    result["reason"] = f"too few lines to tell ({n} < {MIN_LINES})"
    return result
  well_formed = sum(metrics.parse_query(p) is not None for p in predictions) / n
  result["well_formed"] = round(well_formed, 4)
  # An untrained model's junk agrees with nothing, aligned or not.
  if well_formed < MIN_WELL_FORMED:
    result["reason"] = (f"{100 * well_formed:.1f}% of the predictions are well-formed queries "
                        f"(fewer than {100 * MIN_WELL_FORMED:.0f}%): their placeholders tell "
                        "nothing")
    return result
  pred_sets = [query_placeholders(p) for p in predictions]
  measures = {
      "targets":
          _agreement(pred_sets, [query_placeholders(t) for t in targets], lambda p, g: p == g)
  }
  if questions is not None:
    measures["questions"] = _agreement(pred_sets, [question_placeholders(q) for q in questions],
                                       lambda p, q: p <= q)
  result.update({name: a.to_json() for name, a in measures.items()})
  kappas = {name: a.kappa for name, a in measures.items() if a.kappa is not None}
  # Queries that nearly all have the same placeholders tell nothing by them.
  if not kappas:
    result["reason"] = (f"the placeholders agree by chance on more than {100 * MAX_CHANCE:.0f}% "
                        "of random line pairs: they tell nothing")
    return result
  result["checked"] = True
  low = {name: k for name, k in kappas.items() if k < MIN_KAPPA}
  if low:
    result["misaligned"] = True
    what = {
        "targets": "the placeholders of a prediction and of its gold query agree",
        "questions": "a prediction names only placeholders its question names"
    }
    result["reason"] = "; ".join(
        f"{what[name]} on {100 * measures[name].observed:.1f}% of the lines, "
        f"{100 * measures[name].chance:.1f}% by chance (kappa {k:.2f} < {MIN_KAPPA})"
        for name, k in low.items())
  return result


def misalignment_warning(alignment: dict[str, Any],
                         predictions: Any,
                         targets: Any,
                         questions: Any = None) -> Optional[str]:
  """The warning for a `check_alignment` result that found the files misaligned, naming the
  files; None when it did not."""
  if not alignment.get("misaligned"):
    return None
  against = f"{targets}" + ("" if questions is None else f" and {questions}")
  return (f"the predictions in {predictions} do not seem to belong to the lines of {against}: "
          f"{alignment['reason']}. Are the files line-parallel (the same split and part, in the "
          "same order)? Its scores compare each prediction with another question's query")


def invalid_utf8_lines(path: str | pathlib.Path) -> list[int]:
  """The 1-based numbers of the lines of `path` (split at b"\\n") that are not valid UTF-8;
  OSError."""
  data = pathlib.Path(path).read_bytes()
  try:
    data.decode("utf-8")
    return []
  except UnicodeDecodeError:
    pass
  bad = []
  for number, line in enumerate(data.split(b"\n"), start=1):
    try:
      line.decode("utf-8")
    except UnicodeDecodeError:
      bad.append(number)
  return bad


def invalid_utf8_warning(path: str | pathlib.Path) -> Optional[str]:
  """A warning naming `path` and its lines that are not UTF-8 (read as U+FFFD), or None; OSError."""
  bad = invalid_utf8_lines(path)
  if not bad:
    return None
  named = ", ".join(str(b) for b in bad[:MAX_LINES_NAMED])
  more = f" and {len(bad) - MAX_LINES_NAMED} more" if len(bad) > MAX_LINES_NAMED else ""
  return (f"{path}: {len(bad)} line(s) are not valid UTF-8 (line {named}{more}); their "
          "undecodable bytes are read as U+FFFD and scored as such")


def long_lines_warning(predictions_path: Any, predictions: Sequence[str], targets_path: Any,
                       targets: Sequence[str]) -> Optional[str]:
  """A warning naming the prediction lines over `LONG_LINE_FACTOR` times the longest gold line
  (characters), or None."""
  # why: one 560,000-character line takes the published English BLEU from 97.4 to 54.4.
  limit = LONG_LINE_FACTOR * max((len(t) for t in targets), default=0)
  long = [i for i, p in enumerate(predictions, start=1) if len(p) > limit]
  if not long or not targets:
    return None
  named = ", ".join(str(i) for i in long[:MAX_LINES_NAMED])
  more = f" and {len(long) - MAX_LINES_NAMED} more" if len(long) > MAX_LINES_NAMED else ""
  longest = max(len(predictions[i - 1]) for i in long)
  return (f"{predictions_path}: {len(long)} prediction line(s) are more than {LONG_LINE_FACTOR} "
          f"times as long as the longest gold line of {targets_path} ({limit // LONG_LINE_FACTOR} "
          f"characters): line {named}{more} (the longest {longest} characters); they are scored, "
          "but they dominate corpus BLEU")


def check_prediction_file(predictions_path: Any,
                          predictions: Sequence[str],
                          targets_path: Any,
                          targets: Sequence[str],
                          questions_path: Any = None,
                          questions: Optional[Sequence[str]] = None) -> dict[str, Any]:
  """{"alignment": `check_alignment`'s result, "warnings": [...]} for one prediction file.

  The warnings name the files (invalid UTF-8, long lines, misalignment). OSError if the prediction
  file cannot be read again for its bytes.
  """
  alignment = check_alignment(predictions, targets, questions)
  warnings = [
      w for w in (invalid_utf8_warning(predictions_path),
                  long_lines_warning(predictions_path, predictions, targets_path, targets),
                  misalignment_warning(alignment, predictions_path, targets_path,
                                       questions_path if questions is not None else None))
      if w is not None
  ]
  return {"alignment": alignment, "warnings": warnings}
