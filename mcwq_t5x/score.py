"""Scores a file of predictions against a file of gold queries (`mcwq_t5x.evaluation.score`).

  python -m mcwq_t5x.score --predictions P --targets T [--target_format {rir,sparql}]
      [--questions Q] [--depths D] [--json OUT] [--errors_out OUT.jsonl]
  python -m mcwq_t5x.score --predictions P [--targets T] --release DIR --split NAME
      --part {train,dev,test} --execute [--endpoint {oxigraph,remote}] [--codex DIR]
      [--ntriples F ...] [--url URL] [--rate S] [--timeout S] [--retries N] [--cache FILE]
"""
from __future__ import annotations

import argparse
import functools
import json
import pathlib
import sys
from typing import Optional, Sequence
from mcwq_t5x.data import readers
from mcwq_t5x.data import writers
from mcwq_t5x.evaluation import execution
from mcwq_t5x.evaluation import metrics
from mcwq_t5x.evaluation import score
from mcwq_t5x.stores import cache as cache_lib
from mcwq_t5x.stores import flags as store_flags
from mcwq_t5x.stores import transport
from mcwq_t5x import console

_DEFAULT_CODEX = pathlib.Path(__file__).resolve().parents[2] / "shared" / "wikidata" / "codex-m"


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="python -m mcwq_t5x.score",
      description="Exact match, BLEU, query equivalence, error categories and (with --execute) "
      "execution accuracy of MCWQ predictions (Cui et al., TACL 2022).")
  parser.add_argument("--predictions", required=True, help="predicted RIR queries, one a line")
  parser.add_argument(
      "--targets",
      help="gold queries, one a line (default with --release: the "
      "release's queries of --split/--part)")
  parser.add_argument(
      "--target_format",
      choices=metrics.FORMATS,
      default=metrics.RIR,
      help="format of --targets: rir (translations/*.sparql) or sparql "
      "(one query a line, or official/ 'IN: ...  OUT: ...' lines)")
  parser.add_argument("--questions", help="line-parallel questions (shown in --errors_out)")
  parser.add_argument(
      "--depths", help="line-parallel recursionDepth values, for accuracy by "
      "complexity")
  parser.add_argument("--json", dest="json_out", help="write the result JSON here too")
  parser.add_argument("--errors_out", help="write per-example error categories (JSON lines)")
  group = parser.add_argument_group(
      "release and execution accuracy",
      "Execution accuracy is not a metric of the MCWQ paper: a prediction is right when it has "
      "the gold query's answers on a SPARQL store (the embedded CoDEx-M subgraph of Wikidata, or "
      "a remote endpoint). It runs where the store covers the query: a query's placeholders "
      "M0... must be bound to entities, which only a release gives (--release: dataset.json's "
      "`entities`, or its `sparql` field in the published MCWQ release); without --release only "
      "the targets without placeholders run (none of MCWQ's official/ files). Reported as "
      "'x of n executable (n of N)'. With --release the predictions are line-parallel with "
      "splits/SPLIT.json's PARTIdxs")
  group.add_argument(
      "--release",
      help="release folder (dataset.json, splits/), e.g. the output "
      "of python -m preprocessing.migrate")
  group.add_argument("--split", help="split name (splits/SPLIT.json)")
  group.add_argument("--part", choices=readers.PARTS, help="split part")
  group.add_argument(
      "--execute",
      action="store_true",
      help="run predictions and gold queries on the store (with the release's "
      "entities) and report execution accuracy")
  group.add_argument(
      "--answers",
      dest="answers_out",
      help="with --execute: write each line's outcome and its gold and predicted "
      "answers here (JSON lines)")
  group.add_argument(
      "--endpoint",
      choices=("oxigraph", "remote"),
      default="oxigraph",
      help="embedded pyoxigraph store (--codex/--ntriples) or a remote SPARQL "
      "endpoint (--url)")
  group.add_argument(
      "--codex",
      default=str(_DEFAULT_CODEX),
      help="CoDEx folder loaded into the embedded store ('' for none)")
  group.add_argument(
      "--ntriples", nargs="*", default=[], help="N-Triples files loaded into the embedded store")
  store_flags.add_endpoint_arguments(group)
  group.add_argument(
      "--cache",
      help="JSON-lines file keeping the store's answers across runs "
      "(one file per store)")
  group.add_argument(
      "--max_answers",
      type=int,
      default=execution.DEFAULT_MAX_ANSWERS,
      help="SELECT answers with more values count as truncated (wrong)")
  return parser


def _make_endpoint(args: argparse.Namespace) -> cache_lib.CachedEndpoint:
  """The store `--execute` runs on (`store_flags.endpoint_from_arguments`), cached.

  Raises:
    ValueError, FileNotFoundError: see `mcwq_t5x.stores.oxigraph.embedded_store` and
      `store_flags.remote_endpoint_from_arguments`.
  """
  return cache_lib.CachedEndpoint(store_flags.endpoint_from_arguments(args), args.cache)


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Runs the command line; returns the exit status: 0 ok, 2 bad input (naming file and line), 3
  execution accuracy undefined (the JSON is still printed), 1 a Retry-After too long."""
  parser = _parser()
  args = parser.parse_args(argv)
  if args.targets is None and args.release is None:
    parser.error("give --targets, or --release with --split and --part")
  if args.release is not None and (args.split is None or args.part is None):
    parser.error("--release needs --split and --part")
  if args.answers_out and not args.execute:
    parser.error("--answers needs --execute")
  if args.max_answers < 1:
    parser.error("--max_answers must be at least 1")
  endpoint = None
  if args.execute:
    endpoint = functools.partial(_make_endpoint, args)
  try:
    result = score.evaluate_files(
        args.predictions,
        args.targets,
        args.target_format,
        questions=args.questions,
        depths=args.depths,
        errors_out=args.errors_out,
        release=args.release,
        split=args.split,
        part=args.part,
        endpoint=endpoint,
        max_answers=args.max_answers,
        answers_out=args.answers_out)
  except (score.InputError, readers.DataFormatError) as e:
    console.print_error(e)
    return 2
  except (transport.RetryAfterTooLong, writers.ResultWriteError) as e:
    console.print_error(e)
    return 1
  for warning in result["warnings"]:
    print(f"warning: {warning}", file=sys.stderr)
  undefined = None
  if args.execute:
    execution_result = result["execution"]
    execution_result["endpoint"] = (
        args.url if args.endpoint == "remote" else
        f"oxigraph: {args.codex or ''} {' '.join(args.ntriples)}".strip())
    undefined = execution_result.get("undefined")
    gold_errors = execution_result["outcomes"][execution.GOLD_ERROR]
    if gold_errors and not undefined:
      print(
          f"warning: the gold query of {gold_errors} examples failed on the store; they are "
          "left out of execution accuracy (execution.endpoint_errors lists the first ones)",
          file=sys.stderr)
  text = json.dumps(result, indent=2, ensure_ascii=False)
  print(text)
  if args.execute:
    print(result["execution"]["executable_of"], file=sys.stderr)
  if args.json_out:
    try:
      writers.write_atomic(args.json_out, text + "\n")
    except writers.ResultWriteError as e:
      console.print_error(e)  # one line; the previous file stays whole
      return 1
  if undefined:
    console.print_error(RuntimeError(undefined))
    return score.EXIT_UNDEFINED
  return 0


if __name__ == "__main__":
  sys.exit(main())
