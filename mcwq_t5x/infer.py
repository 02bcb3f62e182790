r"""Inference main: questions (a file or stdin) -> RIR queries, or executable SPARQL with --sparql.

Usage:
  echo "Did M0 direct M1" | python -m mcwq_t5x.infer --gin_file=gin/mcwq_t5x/models/tiny.gin \
      --gin_file=gin/mcwq_t5x/runs/infer.gin --gin.CHECKPOINT_PATH="'runs/tiny'" --sparql
  python -m mcwq_t5x.infer --gin_file=... --input=questions.txt --output=queries.txt

One UTF-8 question per input line (placeholders M0..M9 as in MCWQ; bytes that are not UTF-8 are
an error naming the line), one output line per input
line, in order; questions are normalised as the training data is. An empty question gives an
empty line, RIR that `rir_to_sparql` rejects the line `ERROR: <reason>` (both with a warning).
With PREDICT_KWARGS {'num_decodes': 4, 'return_all_decodes': True} a line holds the decodes
separated by tabs, ascending score (the last is the one printed without it). `--output` is replaced
whole or not at all (`writers.write_atomic`): a full disk keeps the previous file and ends in one
line, `ResultWriteError: cannot write FILE: ...`. The vocabulary, dtype and INPUT_PREFIX are the
run.json's unless set (a WARNING names both prefixes when the command line's differs).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from mcwq_t5x.checkpointing import run_info
from mcwq_t5x.data import paths
from mcwq_t5x.data import readers
from mcwq_t5x.data import vocab
from mcwq_t5x.data import writers
from mcwq_t5x.engine import compilation_cache
from mcwq_t5x.engine import cpu_settings
from mcwq_t5x.engine import partitioning
from mcwq_t5x.evaluation import prediction
from mcwq_t5x import console
from mcwq_t5x import gin_utils


def encode_questions(questions: Sequence[str],
                     vocabulary: Any,
                     input_length: int,
                     input_prefix: str = "") -> np.ndarray:
  """int32 [len(questions), input_length] (0 = padding, EOS = 1 as in T5): prefix + normalised
  question + EOS, trimmed, padded, as the SeqIO task tokenises."""
  out = np.zeros((len(questions), input_length), np.int32)
  for i, q in enumerate(questions):
    q = readers.normalize_question(q)
    ids = list(vocabulary.encode(input_prefix + q))[:input_length - 1] + [int(vocabulary.eos_id)]
    out[i, :len(ids)] = ids
  return out


def infer(questions: Sequence[str],
          *,
          model: Any,
          checkpoint_path: str,
          vocabulary: Any = None,
          input_prefix: str = "",
          input_length: int = 64,
          max_decode_length: int = 256,
          batch_size: int = 64,
          predict_kwargs: Optional[dict[str, Any]] = None,
          partitioner: Optional[partitioning.Partitioner] = None) -> list[Any]:
  """The predicted RIR of each question, in input order (a list of `num_decodes` strings each with
  `return_all_decodes`, ascending score, best last; "" and a warning for an empty question).

  `input_prefix` must match training (the tasks' `prefix`); `input_length` counts EOS (longer
  questions are trimmed); `batch_size` is rounded up to the data-parallel devices. Raises
  ValueError (bad `predict_kwargs`, checked first; no vocabulary; size mismatch),
  run_info.VocabularyMismatchError.
  """
  predict_kwargs = prediction.check_predict_kwargs(model, predict_kwargs, allow_all_decodes=True)
  vocabulary = vocabulary if vocabulary is not None else getattr(model, "input_vocabulary", None)
  if vocabulary is None:
    raise ValueError("infer needs a vocabulary (gin: infer.vocabulary = %VOCABULARY)")
  run_info.check_model_vocabulary(vocabulary, model, "infer", checkpoint_path)
  partitioner = partitioner or partitioning.Partitioner()
  params, _, _ = prediction.load_params(model, partitioner, checkpoint_path)
  normalized = [readers.normalize_question(q) for q in questions]
  for i in empty_question_lines(normalized):
    logging.warning("question %d is empty: its output line is left empty", i)
  todo = [q for q in normalized if q]
  if not todo:
    return [""] * len(questions)
  arrays = {
      "encoder_input_tokens": encode_questions(todo, vocabulary, input_length, input_prefix),
      "decoder_input_tokens": np.zeros((len(todo), max_decode_length), np.int32)
  }
  infer_fn = prediction.get_infer_fn(model, partitioner, batch_size, predict_kwargs)
  tokens = infer_fn(params, arrays)
  if predict_kwargs.get("return_all_decodes"):
    decoded = iter([vocabulary.decode([int(t) for t in row]) for row in rows] for rows in tokens)
  else:
    decoded = iter(vocabulary.decode([int(t) for t in row]) for row in tokens)
  return [next(decoded) if q else "" for q in normalized]


def empty_question_lines(questions: Sequence[str]) -> list[int]:
  """The 1-based numbers of the questions that are empty after `readers.normalize_question`."""
  return [i for i, q in enumerate(questions, 1) if not readers.normalize_question(q)]


def to_sparql_lines(rirs: Iterable[Any], skip: Iterable[int] = ()) -> list[Any]:
  """RIR -> SPARQL per line (each of a list with `return_all_decodes`); malformed RIR ->
  'ERROR: ...' (warned); the 1-based lines in `skip` (empty questions) stay empty."""
  from mcwq_t5x.data import rir  # pylint: disable=g-import-not-at-top
  skip = set(skip)

  def convert(i, r):
    if i in skip:
      return ""
    try:
      return rir.rir_to_sparql(r)
    except rir.RIRError as e:
      logging.warning("line %d: prediction is not valid RIR (%s): %s", i, e, r)
      return f"ERROR: {e}"

  return [[convert(i, x)
           for x in r] if isinstance(r, list) else convert(i, r)
          for i, r in enumerate(rirs, 1)]


def format_lines(predictions: Sequence[Any]) -> str:
  """One output line per question: a prediction's line breaks become spaces; a list of
  predictions (`return_all_decodes`) is joined by tabs (tabs inside one become spaces)."""

  def one(p: str) -> str:
    return " ".join(p.splitlines())

  # Tabs separate decodes, so a tab inside one becomes a space.
  return "".join(("\t".join(one(x).replace("\t", " ")
                            for x in p) if isinstance(p, list) else one(p)) + "\n"
                 for p in predictions)


#: `--help` epilog: the gin files and macros of this main.
GIN_HELP = gin_utils.gin_help(['gin/mcwq_t5x/models/tiny.gin + gin/mcwq_t5x/runs/infer.gin'], [
    'CHECKPOINT_PATH', 'INPUT_PREFIX (default: the run\'s, run.json)', 'INPUT_LENGTH',
    'MAX_DECODE_LENGTH', 'BATCH_SIZE', 'PREDICT_KWARGS', 'HOST_DEVICE_COUNT'
])


def main(argv: Optional[Sequence[str]] = None) -> list[str]:
  """Entry point (`python -m mcwq_t5x.infer`): gin flags + --input/--output/--sparql -> `infer`."""
  console.setup_logging()
  gin_utils.use_main_module_as("mcwq_t5x.infer")

  def extra(parser: argparse.ArgumentParser):
    parser.add_argument("--input", default="-", help="questions, one per line ('-' = stdin)")
    parser.add_argument("--output", default="-", help="output file ('-' = stdout)")
    parser.add_argument(
        "--sparql",
        action="store_true",
        help="print executable SPARQL (mcwq_t5x.data.rir.rir_to_sparql) instead of RIR")

  try:
    args = gin_utils.parse_flags(
        argv,
        description=__doc__.splitlines()[0],
        extra_args=extra,
        prog="python -m mcwq_t5x.infer",
        epilog=GIN_HELP)
  except gin_utils.GinConfigError as e:  # a typo in a flag or file: one line, exit status 1
    raise console.one_line_exit(e) from e
  try:  # before the model is built: bad input fails fast
    if args.input == "-":
      # "\n" alone ends a line: a form feed or U+2028 inside a question never splits it.
      lines = readers.decode_lines(sys.stdin.buffer.read(), "<stdin>")
    elif not os.path.isfile(args.input):
      raise FileNotFoundError(f"{args.input}: no such file")
    else:
      lines = readers.read_lines(args.input)
  except (FileNotFoundError, readers.DataFormatError) as e:
    raise console.one_line_exit(e) from None
  questions = [readers.normalize_question(l) for l in lines]
  try:
    vocab.check_vocabulary_variable()
    run_info.adopt_recorded_vocabulary(gin_utils.macro_value("CHECKPOINT_PATH"))
    gin_utils.adopt_recorded_dtype(
        gin_utils.macro_value("CHECKPOINT_PATH"), args.command_line_bindings)
    gin_utils.adopt_recorded_input_prefix(
        gin_utils.macro_value("CHECKPOINT_PATH"), args.command_line_bindings)
    gin_utils.call_configured(cpu_settings.set_host_device_count)
    compilation_cache.use_persistent_cache()
    gin_utils.call_configured(partitioning.initialize_distributed)
    predictions = gin_utils.call_configured(infer, questions)  # pylint: disable=no-value-for-parameter
  except (paths.DataNotFoundError,
          *prediction.INPUT_ERRORS) as e:  # a missing vocabulary file: one line, exit status 1
    raise console.one_line_exit(e) from e
  if args.sparql:
    predictions = to_sparql_lines(predictions, skip=empty_question_lines(questions))
  out = format_lines(predictions)
  if args.output == "-":
    sys.stdout.write(out)
  else:
    try:  # why: a failed write (a full disk) keeps the previous file, not a partial one
      writers.write_atomic(args.output, out)
    except writers.ResultWriteError as e:
      raise console.one_line_exit(e) from e
  return predictions


if __name__ == "__main__":
  console.quiet_native_logs()
  main()
