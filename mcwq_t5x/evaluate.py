"""Evaluation command line: scores a file of predictions against a file of gold queries.

  python -m mcwq_t5x.evaluate --predictions P --targets T [--target_format {rir,sparql}]
      [--questions Q] [--depths D] [--json OUT] [--errors_out OUT.jsonl]

Both files hold one query per line and are line-parallel; a final line may lack its newline.
Predictions are RIR strings (what the models of the MCWQ paper output, e.g.
`results/mt5_small/monolingual/mcd1/generated_predictions_en.txt`). Targets are RIR as well
(`translations/{split}/test.{lang}.sparql`), or SPARQL with `--target_format sparql`: one query
a line, or the `official/` lines `IN: question  OUT: query`; SPARQL targets are converted with
`rir.sparql_to_rir` before scoring, so exact match compares RIR strings as the paper does.

The result is printed as JSON (and written to `--json OUT`):
  {"n": N, "exact_match": percent, "bleu": corpus BLEU, "equivalence": percent,
   "error_categories": {category: count}, ["by_complexity": {depth: {...}}], "predictions": P,
   "targets": T}
See `mcwq_t5x.metrics` for the definitions (paper: Cui et al., TACL 2022, §5.2 and §6.2).

Exit status: 0 on success, 2 on bad input (missing file, files of different lengths, a malformed
target: the message names the file and line).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any, Optional, Sequence

from mcwq_t5x import metrics
from mcwq_t5x import readers
from mcwq_t5x import rir as rir_lib
from mcwq_t5x import sparql as sparql_lib


class InputError(ValueError):
  """Bad evaluation input; the message names the file (and line where there is one)."""


def read_lines(path: str | pathlib.Path, strict: bool = True) -> list[str]:
  """Reads a text file as a list of lines without terminators (`readers.read_lines`).

  Lines are split at "\\n" only (not at other Unicode line breaks, which junk predictions may
  contain); a trailing "\\r" is dropped; a final line without newline counts, a trailing newline
  does not start an extra empty line; an empty file has no lines.

  Args:
    path: the file.
    strict: if True, the file must be UTF-8; if False (predictions), undecodable bytes become
      U+FFFD so that binary junk is scored as a wrong prediction instead of failing.

  Returns:
    The lines.

  Raises:
    InputError: missing file, or (strict) invalid UTF-8 (message `FILE:LINE: ...`).
  """
  path = pathlib.Path(path)
  if not path.is_file():  # Not paths.DataNotFoundError: its fetch hint is wrong for predictions.
    raise InputError(f"{path}: no such file")
  try:
    return readers.read_lines(path, strict=strict)
  except readers.DataFormatError as e:
    raise InputError(str(e)) from None


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
    InputError: missing or non-UTF-8 file, or a line that is not a well-formed query of that
      format (message `FILE:LINE: problem`).
  """
  if target_format not in metrics.FORMATS:
    raise InputError(f"unknown target format {target_format!r}; expected one of {metrics.FORMATS}")
  out = []
  for number, line in enumerate(read_lines(path, strict=True), start=1):
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
    InputError: missing file or a line that is not an integer (message `FILE:LINE: ...`).
  """
  out: list[Optional[int]] = []
  for number, line in enumerate(read_lines(path), start=1):
    line = line.strip()
    if not line:
      out.append(None)
      continue
    try:
      out.append(int(line))
    except ValueError:
      raise InputError(f"{path}:{number}: expected an integer recursionDepth, got {line!r}") from None
  return out


def check_same_length(name_a: str, path_a: Any, lines_a: Sequence[Any],
                      name_b: str, path_b: Any, lines_b: Sequence[Any]) -> None:
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


def evaluate_files(predictions: str | pathlib.Path, targets: str | pathlib.Path,
                   target_format: str = metrics.RIR,
                   questions: Optional[str | pathlib.Path] = None,
                   depths: Optional[str | pathlib.Path] = None,
                   errors_out: Optional[str | pathlib.Path] = None) -> dict[str, Any]:
  """Scores a prediction file against a target file (what the command line does).

  Args:
    predictions: RIR predictions, one per line (any bytes; junk is scored as wrong).
    targets: gold queries, one per line (see `load_targets`).
    target_format: "rir" or "sparql".
    questions: optional question file, line-parallel; only used in `errors_out`.
    depths: optional recursionDepth file (see `load_depths`) for accuracy by complexity.
    errors_out: optional path of a JSON-lines file with one record per example:
      {"line", "category", "target", "prediction", ["question"], plus the set differences}.

  Returns:
    `metrics.evaluate`'s dict, plus "by_complexity" when depths are given, and the file names.

  Raises:
    InputError: missing files, length mismatch (names both counts and both files), malformed
      target, bad depth.
  """
  gold = load_targets(targets, target_format)
  preds = read_lines(predictions, strict=False)
  check_same_length("predictions", predictions, preds, "targets", targets, gold)
  result = metrics.evaluate(gold, preds, metrics.RIR)
  if depths is not None:
    depth_list = load_depths(depths)
    check_same_length("depths", depths, depth_list, "targets", targets, gold)
    result["by_complexity"] = {
        str(d): v for d, v in metrics.accuracy_by_complexity(gold, preds, depth_list).items()}
  question_list = None
  if questions is not None:
    question_list = read_lines(questions, strict=False)
    check_same_length("questions", questions, question_list, "targets", targets, gold)
  if errors_out is not None:
    with open(errors_out, "w", encoding="utf-8") as f:
      for i, (t, p) in enumerate(zip(gold, preds)):
        analysis = metrics.analyze_error(t, p)
        record: dict[str, Any] = {"line": i + 1, "category": analysis.category}
        if question_list is not None:
          record["question"] = question_list[i]
        record.update(target=t, prediction=p,
                      missing_properties=list(analysis.missing_properties),
                      extra_properties=list(analysis.extra_properties),
                      missing_entities=list(analysis.missing_entities),
                      extra_entities=list(analysis.extra_entities))
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
  result["predictions"] = str(predictions)
  result["targets"] = str(targets)
  return result


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="python -m mcwq_t5x.evaluate",
      description="Exact match, BLEU, query equivalence and error categories of MCWQ "
                  "predictions (Cui et al., TACL 2022).")
  parser.add_argument("--predictions", required=True, help="predicted RIR queries, one a line")
  parser.add_argument("--targets", required=True, help="gold queries, one a line")
  parser.add_argument("--target_format", choices=metrics.FORMATS, default=metrics.RIR,
                      help="format of --targets: rir (translations/*.sparql) or sparql "
                           "(one query a line, or official/ 'IN: ...  OUT: ...' lines)")
  parser.add_argument("--questions", help="line-parallel questions (shown in --errors_out)")
  parser.add_argument("--depths", help="line-parallel recursionDepth values, for accuracy by "
                                       "complexity")
  parser.add_argument("--json", dest="json_out", help="write the result JSON here too")
  parser.add_argument("--errors_out", help="write per-example error categories (JSON lines)")
  return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Runs the command line; returns the exit status (0 ok, 2 bad input)."""
  args = _parser().parse_args(argv)
  try:
    result = evaluate_files(args.predictions, args.targets, args.target_format,
                            questions=args.questions, depths=args.depths,
                            errors_out=args.errors_out)
  except InputError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  text = json.dumps(result, indent=2, ensure_ascii=False)
  print(text)
  if args.json_out:
    pathlib.Path(args.json_out).write_text(text + "\n", encoding="utf-8")
  return 0


if __name__ == "__main__":
  sys.exit(main())
