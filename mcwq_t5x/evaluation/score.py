"""Scores a file of predictions against a file of gold queries (the library of `mcwq_t5x.score`).

Both files hold one query per line, line-parallel. Predictions are RIR; targets are RIR
(`translations/{split}/test.{lang}.sparql`), SPARQL or `official/` lines (converted with
`rir.sparql_to_rir`, so exact match compares RIR strings as the paper does, Cui et al., TACL
2022, §5.2), or come from a release (`dataset.json` + `splits/NAME.json`). Execution accuracy
(`execution`, not in the paper) runs where placeholders are bound. Bad input raises `InputError`
naming the file and line; malformed predictions and failed store requests for them are scored
as wrong, never an error.
"""
from __future__ import annotations

import json
import pathlib
from typing import Any, Optional, Sequence

from mcwq_t5x.data import readers
from mcwq_t5x.data import rir as rir_lib
from mcwq_t5x.data import sparql as sparql_lib
from mcwq_t5x.data import writers
from mcwq_t5x.evaluation import execution
from mcwq_t5x.evaluation import metrics
from mcwq_t5x.evaluation import prediction_checks
from mcwq_t5x.stores import cache as cache_lib
from mcwq_t5x.stores import endpoint as endpoint_lib

#: Exit status when `--execute` scored no example (execution accuracy undefined).
EXIT_UNDEFINED = 3


class InputError(ValueError):
  """Bad evaluation input; the message names the file (and line where there is one)."""


def _official_query(line: str) -> str:
  """The query part of an `official/` line `IN: question  OUT: query`, else the line itself."""
  sides = readers.split_official_line(line)
  return line if sides is None else sides[1]


def load_targets(path: str | pathlib.Path, target_format: str = metrics.RIR) -> list[str]:
  """Gold queries of `path` as RIR strings, one per line, each checked to parse.

  `target_format` "rir", or "sparql" (SPARQL or `official/` lines). Raises InputError
  (`FILE:LINE: problem`), DataNotFoundError or DataFormatError (missing or non-UTF-8 file).
  """
  if target_format not in metrics.FORMATS:
    raise InputError(f"unknown target format {target_format!r}; expected one of {metrics.FORMATS}")
  out = []
  for number, line in enumerate(readers.read_lines(path), start=1):
    if target_format == metrics.SPARQL:
      try:
        line = rir_lib.sparql_to_rir(_official_query(line).strip())
      except (sparql_lib.SparqlParseError, rir_lib.RIRError) as e:
        raise InputError(f"{path}:{number}: not a well-formed SPARQL query ({e})") from None
    elif metrics.parse_query(line, metrics.RIR) is None:
      try:
        rir_lib.rir_to_query(line)
        problem = "unparsable"
      except rir_lib.RIRError as e:
        problem = str(e)
      raise InputError(f"{path}:{number}: not a well-formed RIR query ({problem}); "
                       "use --target_format sparql for SPARQL targets")
    out.append(line)
  return out


def load_depths(path: str | pathlib.Path) -> list[Optional[int]]:
  """One recursionDepth per line (int, or None for an empty line).

  Raises InputError (`FILE:LINE`: not an integer), DataNotFoundError, DataFormatError.
  """
  out: list[Optional[int]] = []
  for number, line in enumerate(readers.read_lines(path), start=1):
    line = line.strip()
    if not line:
      out.append(None)
      continue
    try:
      out.append(int(line))
    except ValueError:
      raise InputError(
          f"{path}:{number}: expected an integer recursionDepth, got {line!r}") from None
  return out


def check_same_length(name_a: str, path_a: Any, lines_a: Sequence[Any], name_b: str, path_b: Any,
                      lines_b: Sequence[Any]) -> None:
  """InputError naming both counts and both files unless `lines_a` and `lines_b` are
  line-parallel."""
  if len(lines_a) != len(lines_b):
    raise InputError(f"length mismatch: {len(lines_a)} {name_a} in {path_a} but "
                     f"{len(lines_b)} {name_b} in {path_b}; the files must be line-parallel")


def load_release_targets(release: str | pathlib.Path, split: str,
                         part: str) -> list[execution.ReleaseQuery]:
  """The `ReleaseQuery`s of a release part; InputError (`FILE:LINE`) on missing files or bad
  records."""
  try:
    return execution.load_release_queries(release, split, part)
  except (OSError, ValueError) as e:
    raise InputError(str(e)) from None


def check_targets_match_release(targets: str | pathlib.Path, gold: Sequence[str],
                                examples: Sequence[execution.ReleaseQuery]) -> None:
  """InputError (`FILE:LINE`, naming the record) unless each target is the release's query, up to
  clause order."""
  for number, (target, example) in enumerate(zip(gold, examples), start=1):
    parsed = metrics.parse_query(target, metrics.RIR)
    if not sparql_lib.parse_sparql(example.pattern).equivalent(parsed):
      raise InputError(f"{targets}:{number}: target is not the query of {example.source} record "
                       f"{example.index} (line {example.line}): {example.pattern!r}; are the "
                       "--split/--part right?")


def targets_as_examples(gold: Sequence[str], source: str) -> list[execution.ReleaseQuery]:
  """Gold RIR queries without a release as execution examples
  (`official/{split}/{part}.{lang}.txt`).

  A query with placeholders `M0`... is not executable (only a release binds them) and leaves the
  denominator; one without runs as it is.
  """
  out = []
  for i, g in enumerate(gold):
    pattern = rir_lib.rir_to_sparql(g)
    has_placeholder = any(execution._PLACEHOLDER_RE.fullmatch(t) for t in pattern.split())  # pylint: disable=protected-access
    out.append(execution.ReleaseQuery(pattern, None if has_placeholder else {}, source, i, i + 1))
  return out


def execution_line(result: dict[str, Any]) -> str:
  """Execution accuracy as "x of n executable (n of N)": the correct predictions among the n
  examples that could be executed, and those n among all N lines."""
  ex = result["execution"]
  total = sum(ex["outcomes"].values())
  accuracy = result["execution_accuracy"]  # None: undefined (no example could be scored)
  head = "undefined" if accuracy is None else f"{accuracy:.1f}%"
  return (f"execution accuracy {head}: {ex['correct']} of {ex['n']} "
          f"executable ({ex['n']} of {total})")


def answer_records(examples: Sequence[execution.ReleaseQuery], preds: Sequence[str],
                   outcomes: Sequence[str], endpoint: Any,
                   max_answers: int) -> list[dict[str, Any]]:
  """Per line: the outcome and the gold and predicted answers (a bool or sorted list; None if not
  run).

  The queries are run again (a `CachedEndpoint` answers from its cache); a store failure then
  leaves the answers None, recorded under "error".
  """
  records = []
  for i, (example, pred, outcome) in enumerate(zip(examples, preds, outcomes), start=1):
    record: dict[str, Any] = {"line": i, "outcome": outcome, "gold": None, "predicted": None}
    try:
      _add_answers(record, example, pred, outcome, endpoint, max_answers)
    except endpoint_lib.EndpointError as e:
      record.update(gold=None, predicted=None, error=str(e))
    records.append(record)
  return records


def _add_answers(record: dict[str, Any], example: execution.ReleaseQuery, pred: str, outcome: str,
                 endpoint: Any, max_answers: int) -> None:
  """Fills `record`'s gold and predicted answers of an executed line; EndpointError if the store
  fails."""
  if outcome not in (execution.CORRECT, execution.WRONG_ANSWER):
    return
  gold = sparql_lib.parse_sparql(example.pattern)
  record["gold_query"] = example.pattern
  record["gold"] = execution.execute(gold, example.entities, endpoint, max_answers).to_json()
  parsed = metrics.parse_query(pred, metrics.RIR)
  if gold.equivalent(parsed):
    record["predicted"] = record["gold"]
  else:
    record["predicted"] = execution.execute(parsed, example.entities, endpoint,
                                            max_answers).to_json()


def evaluate_files(predictions: str | pathlib.Path,
                   targets: Optional[str | pathlib.Path] = None,
                   target_format: str = metrics.RIR,
                   questions: Optional[str | pathlib.Path] = None,
                   depths: Optional[str | pathlib.Path] = None,
                   errors_out: Optional[str | pathlib.Path] = None,
                   release: Optional[str | pathlib.Path] = None,
                   split: Optional[str] = None,
                   part: Optional[str] = None,
                   endpoint: Optional[Any] = None,
                   max_answers: int = execution.DEFAULT_MAX_ANSWERS,
                   answers_out: Optional[str | pathlib.Path] = None) -> dict[str, Any]:
  """Scores a prediction file against gold queries: the command line's result dict.

  `metrics.score_predictions`'s dict plus "alignment", "warnings", "by_complexity" (with `depths`),
  "execution_accuracy" and "execution" (with `endpoint`: an Endpoint, or a function making one
  once the inputs are checked) and the file names. `release`, `split`, `part`: all or none.
  `errors_out` / `answers_out`: JSON-lines per example. Raises InputError (a bad file, length,
  target, depth, release or store, naming the file), readers.DataFormatError (not UTF-8),
  ValueError (no targets and no release, or some of release/split/part),
  stores.transport.RetryAfterTooLong, writers.ResultWriteError (the output is left as it was).
  """
  if (release is None) != (split is None) or (release is None) != (part is None):
    raise ValueError("give --release, --split and --part together")
  if targets is None and release is None:
    raise ValueError("give --targets, or --release with --split and --part")
  for path in (predictions, targets, questions, depths):
    if path is not None and not pathlib.Path(path).is_file():
      raise InputError(f"{path}: no such file")
  examples = None
  if release is not None:
    examples = load_release_targets(release, split, part)
  if targets is not None:
    gold = load_targets(targets, target_format)
  else:
    targets = pathlib.Path(release) / "splits" / f"{split}.json"
    targets = f"{targets}:{part}Idxs"
    gold = [rir_lib.sparql_to_rir(e.pattern) for e in examples]
  preds = readers.read_lines(predictions, strict=False)
  check_same_length("predictions", predictions, preds, "targets", targets, gold)
  if examples is not None:
    check_same_length("release queries", f"{release} ({split}/{part})", examples, "targets",
                      targets, gold)
    check_targets_match_release(targets, gold, examples)
  result = metrics.score_predictions(gold, preds, metrics.RIR)
  if depths is not None:
    depth_list = load_depths(depths)
    check_same_length("depths", depths, depth_list, "targets", targets, gold)
    result["by_complexity"] = {
        str(d): v for d, v in metrics.accuracy_by_complexity(gold, preds, depth_list).items()
    }
  question_list = None
  if questions is not None:
    question_list = readers.read_lines(questions, strict=False)
    check_same_length("questions", questions, question_list, "targets", targets, gold)
  outcomes = None
  if endpoint is not None:
    if examples is None:
      examples = targets_as_examples(gold, str(targets))
    if not isinstance(endpoint, endpoint_lib.Endpoint):
      try:
        # Made only once the other inputs are read and checked.
        endpoint = endpoint()
      except (OSError, ValueError) as e:
        raise InputError(str(e)) from None
    try:
      scores = execution.score_execution(examples, preds, endpoint, metrics.RIR, max_answers)
    except ValueError as e:  # A gold query that cannot be sent (names dataset.json and line).
      raise InputError(str(e)) from None
    outcomes = scores.outcomes
    result.update(scores.summary())
    reason = scores.undefined_reason()
    if reason is not None:
      result["execution"]["undefined"] = f"execution accuracy is undefined: {reason}"
    result["execution"]["executable_of"] = execution_line(result)
    if answers_out is not None:
      writers.write_atomic(
          answers_out,
          (json.dumps(record, ensure_ascii=False) + "\n"
           for record in answer_records(examples, preds, outcomes, endpoint, max_answers)))
    if isinstance(endpoint, cache_lib.CachedEndpoint):
      result["execution"]["store_requests"] = endpoint.misses
  if errors_out is not None:
    with writers.open_atomic(errors_out) as f:
      for i, (t, p) in enumerate(zip(gold, preds)):
        analysis = metrics.analyze_error(t, p)
        record: dict[str, Any] = {"line": i + 1, "category": analysis.category}
        if question_list is not None:
          record["question"] = question_list[i]
        record.update(
            target=t,
            prediction=p,
            missing_properties=list(analysis.missing_properties),
            extra_properties=list(analysis.extra_properties),
            missing_entities=list(analysis.missing_entities),
            extra_entities=list(analysis.extra_entities))
        if outcomes is not None:
          record["execution"] = outcomes[i]
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
  result.update(
      prediction_checks.check_prediction_file(predictions, preds, targets, gold, questions,
                                              question_list))
  result["predictions"] = str(predictions)
  result["targets"] = str(targets)
  return result
