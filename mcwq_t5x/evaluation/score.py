"""Scores a file of predictions against a file of gold queries (`python -m mcwq_t5x.score`).

Both files hold one query per line and are line-parallel; a final line may lack its newline.
Predictions are RIR strings (what the models of the MCWQ paper output, e.g.
`results/mt5_small/monolingual/mcd1/generated_predictions_en.txt`). Targets are RIR as well
(`translations/{split}/test.{lang}.sparql`), or SPARQL with `--target_format sparql`: one query
a line, or the `official/` lines `IN: question  OUT: query`; SPARQL targets are converted with
`rir.sparql_to_rir` before scoring, so exact match compares RIR strings as the paper does.

With `--release DIR --split NAME --part PART` the gold queries come from a release folder
(`dataset.json` + `splits/NAME.json`, as `preprocessing.migrate` writes it): the predictions are
line-parallel with the part's index list, i.e. with `official/NAME/PART.*.txt`. `--targets` may
then be left out; when given, each target must be the release's query of that line (the check
names the file and line). `--execute` adds execution accuracy (`mcwq_t5x.evaluation.execution`; not a
metric of the paper): each prediction gets the example's entities substituted for its
placeholders and is run next to the gold query on a SPARQL store. It runs where the store covers
the query: the placeholders must be bound, which a release does (its `entities`, or the published
release's `sparql` field); without `--release` (e.g. MCWQ's `official/` files, where every query
has placeholders) only targets without placeholders run. The result says "x of n executable (n of
N)" (`execution.executable_of`); `--answers FILE` writes each line's gold and predicted answers.
The store is by default the embedded pyoxigraph store loaded from `--codex`
(`../shared/wikidata/codex-m`), or `--endpoint remote` (`--url`, default the Wikidata Query
Service, one request per `--rate` seconds, retries); `--cache FILE` keeps the answers across runs.

The result is printed as JSON (and written to `--json OUT`):
  {"n": N, "exact_match": percent, "bleu": corpus BLEU, "equivalence": percent,
   "error_categories": {category: count}, ["by_complexity": {depth: {...}}],
   ["execution_accuracy": percent, "execution": {"n", "correct", "outcomes", "executable_of",
    ...}],
   "alignment": {...}, "warnings": [...], "predictions": P, "targets": T}
See `mcwq_t5x.evaluation.metrics` and `mcwq_t5x.evaluation.execution` for the definitions (paper: Cui et al., TACL
2022, §5.2 and §6.2; execution accuracy is not in the paper).
"alignment" and "warnings" are `prediction_checks.check_prediction_file`'s: predictions that do not
seem to belong to their gold lines (reordered, another split's: their placeholders agree with
their own lines no better than with random ones) and prediction lines that are not valid UTF-8
are scored all the same, with a warning naming the files (and lines); the command line prints
the warnings on stderr.

Exit status: 0 on success, 2 on bad input (missing file, files of different lengths, a malformed
target or release record: the message names the file and line), 3 when `--execute` could score no
example (execution accuracy undefined: every gold query failed on the store, e.g. an endpoint that
answers errors, or no line has entities; the JSON is still printed, with `"execution_accuracy":
null` and the reason in `execution.undefined`), 1 when the remote endpoint asks to wait longer
than the client accepts (`Retry-After`). Malformed predictions and failed store requests for
predictions are scored as wrong, never an error; examples whose gold query fails are left out
(`gold_error`, with a warning).
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
  """Reads gold queries and returns them as RIR strings, checking that each one parses.

  Args:
    path: one query per line: RIR (`target_format="rir"`), or SPARQL / `official/` lines
      (`target_format="sparql"`, converted with `rir.sparql_to_rir`).
    target_format: "rir" or "sparql".

  Returns:
    RIR strings, one per line of the file.

  Raises:
    InputError: a line that is not a well-formed query of that format (message
      `FILE:LINE: problem`).
    DataNotFoundError, DataFormatError: a missing or non-UTF-8 file (`readers.read_lines`).
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
  """Reads one recursionDepth per line (an integer, or an empty line for unknown).

  Raises:
    InputError: a line that is not an integer (message `FILE:LINE: ...`).
    DataNotFoundError, DataFormatError: a missing or non-UTF-8 file (`readers.read_lines`).
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
  """Checks that two line lists read from files are line-parallel.

  Args:
    name_a, name_b: what the lines are ("predictions", "targets", ...), for the message.
    path_a, path_b: the files they were read from.
    lines_a, lines_b: the lines.

  Raises:
    InputError: the lengths differ (the message names both counts and both files).
  """
  if len(lines_a) != len(lines_b):
    raise InputError(f"length mismatch: {len(lines_a)} {name_a} in {path_a} but "
                     f"{len(lines_b)} {name_b} in {path_b}; the files must be line-parallel")


def load_release_targets(release: str | pathlib.Path, split: str,
                         part: str) -> list[execution.ReleaseQuery]:
  """Reads the gold queries (with entities) of a release part (`execution.load_release_queries`).

  Raises:
    InputError: missing files, bad JSON, bad indices or records (message `FILE:LINE: ...`).
  """
  try:
    return execution.load_release_queries(release, split, part)
  except (OSError, ValueError) as e:
    raise InputError(str(e)) from None


def check_targets_match_release(targets: str | pathlib.Path, gold: Sequence[str],
                                examples: Sequence[execution.ReleaseQuery]) -> None:
  """Checks that each target line is the release's query of that line (up to clause order).

  Raises:
    InputError: a different query (`FILE:LINE: ...`, naming the release record).
  """
  for number, (target, example) in enumerate(zip(gold, examples), start=1):
    parsed = metrics.parse_query(target, metrics.RIR)
    if not sparql_lib.parse_sparql(example.pattern).equivalent(parsed):
      raise InputError(f"{targets}:{number}: target is not the query of {example.source} record "
                       f"{example.index} (line {example.line}): {example.pattern!r}; are the "
                       "--split/--part right?")


def targets_as_examples(gold: Sequence[str], source: str) -> list[execution.ReleaseQuery]:
  """Gold RIR queries without a release (e.g. MCWQ's `official/{split}/{part}.{lang}.txt`) as
  execution examples: a query without placeholders runs as it is (no entities needed); one with
  placeholders `M0`... is not executable (nothing binds them: only a release's `entities`, or its
  `sparql` field, does), and is left out of execution accuracy's denominator."""
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
  """Per line: outcome and the gold and predicted answers (JSON: a bool or a sorted list; None
  when not executed). Re-runs the queries (a `CachedEndpoint` answers from its cache); a store
  failure on a re-run leaves the answers None and is recorded under "error" (never an answer)."""
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
  """Fills `record`'s gold and predicted answers of an executed line (see `answer_records`).

  Raises:
    mcwq_t5x.stores.endpoint.EndpointError: the store failed.
  """
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
  """Scores a prediction file against a target file (what the command line does).

  Args:
    predictions: RIR predictions, one per line (any bytes; junk is scored as wrong).
    targets: gold queries, one per line (see `load_targets`); may be None when `release` is given.
    target_format: "rir" or "sparql".
    questions: optional question file, line-parallel; only used in `errors_out`.
    depths: optional recursionDepth file (see `load_depths`) for accuracy by complexity.
    errors_out: optional path of a JSON-lines file with one record per example:
      {"line", "category", "target", "prediction", ["question"], plus the set differences,
      ["execution": outcome]}.
    release, split, part: a release folder and one of its split parts; the gold queries and
      entities of the lines (`execution.load_release_queries`). All three or none.
    endpoint: a `mcwq_t5x.stores.endpoint.Endpoint`, or a function without arguments returning
      one (called once the other inputs are read and checked; see `_make_endpoint`): adds
      execution accuracy (`execution.score_execution`); without a release only the targets
      without placeholders are executable (`targets_as_examples`).
    max_answers: SELECT answers with more values count as truncated (never equal).
    answers_out: with `endpoint`, a JSON-lines file with each line's outcome and its gold and
      predicted answers (`answer_records`).

  Returns:
    `metrics.score_predictions`'s dict, plus "alignment" and "warnings"
    (`prediction_checks.check_prediction_file`), "by_complexity" when depths are given,
    "execution_accuracy" and "execution" when executed, and the file names. When no example
    could be scored on the store, "execution_accuracy" is None and "execution" has "undefined",
    the reason (`execution.ExecutionScores.undefined_reason`).

  Raises:
    InputError: missing files, length mismatch (names both counts and both files), malformed
      target, bad depth, a bad release, a target that is not the release's query, a store that
      cannot be loaded.
    readers.DataFormatError: a target, depth or question file that is not UTF-8 (`FILE:LINE`).
    ValueError: no targets and no release, or only some of release/split/part.
    mcwq_t5x.stores.transport.RetryAfterTooLong: the remote endpoint asks to wait longer than it
      is configured to.
    writers.ResultWriteError: `errors_out` or `answers_out` cannot be written (left as it was).
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
