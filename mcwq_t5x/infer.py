r"""Inference main: questions (a file or stdin) -> RIR queries, or executable SPARQL with --sparql.

Usage:
  echo "Did M0 direct M1" | python -m mcwq_t5x.infer --gin_file=gin/mcwq_t5x/models/tiny.gin \
      --gin_file=gin/mcwq_t5x/runs/infer.gin --gin.CHECKPOINT_PATH="'runs/tiny'" --sparql
  python -m mcwq_t5x.infer --gin_file=... --input=questions.txt --output=queries.txt

One question per input line (entity placeholders M0..M9 as in MCWQ; lines end at "\n" only, a
trailing "\r" is dropped, so form feeds or Unicode line separators inside a question never split
it); one output line per input line, in order. With --sparql the RIR is converted by `mcwq_t5x.rir.rir_to_sparql`; a prediction
that is not valid RIR gives the line `ERROR: <reason>` (and a warning on stderr), so lines stay
aligned.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Any, Iterable, Optional, Sequence

import gin
import numpy as np

from mcwq_t5x import gin_utils
from mcwq_t5x import inference
from mcwq_t5x import partitioning
from mcwq_t5x import utils


def encode_questions(questions: Sequence[str],
                     vocabulary: Any,
                     input_length: int,
                     input_prefix: str = "") -> np.ndarray:
  """Tokenizes questions like the SeqIO task: prefix + question, EOS appended, trimmed, padded.

  Returns:
    int32 [len(questions), input_length] (0 = padding, EOS = 1 as in T5).
  """
  out = np.zeros((len(questions), input_length), np.int32)
  for i, q in enumerate(questions):
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
          partitioner: Optional[partitioning.Partitioner] = None) -> list[str]:
  """Predicts the RIR query of each question.

  Args:
    questions: question strings.
    model: MODEL.
    checkpoint_path: CHECKPOINT_PATH (see `mcwq_t5x.inference.load_params`).
    vocabulary: input/output vocabulary (default the model's `input_vocabulary`).
    input_prefix: prepended to each question; must match training (tasks' `prefix`, default "").
    input_length: input tokens (EOS included; longer questions are trimmed).
    max_decode_length: output tokens.
    batch_size: decoding batch size (rounded up to a multiple of the data-parallel devices).
    predict_kwargs: `model.predict_batch` options (e.g. beam search {"num_decodes": 4}).
    partitioner: mesh.

  Returns:
    The predicted RIR strings, in input order.

  Raises:
    ValueError: no vocabulary, or vocabulary/model size mismatch.
  """
  vocabulary = vocabulary if vocabulary is not None else getattr(model, "input_vocabulary", None)
  if vocabulary is None:
    raise ValueError("infer needs a vocabulary (gin: infer.vocabulary = %VOCABULARY)")
  utils.check_vocab_size(vocabulary, model.module.config.vocab_size, where="infer")
  partitioner = partitioner or partitioning.Partitioner()
  params, _, _ = inference.load_params(model, partitioner, checkpoint_path)
  if not questions:
    return []
  arrays = {
      "encoder_input_tokens": encode_questions(questions, vocabulary, input_length, input_prefix),
      "decoder_input_tokens": np.zeros((len(questions), max_decode_length), np.int32)
  }
  infer_fn = inference.get_infer_fn(model, partitioner, batch_size, predict_kwargs)
  tokens = infer_fn(params, arrays)
  return [vocabulary.decode([int(t) for t in row]) for row in tokens]


def to_sparql_lines(rirs: Iterable[str]) -> list[str]:
  """RIR -> SPARQL per line; malformed RIR -> 'ERROR: ...' (warned on stderr)."""
  from mcwq_t5x import rir  # pylint: disable=g-import-not-at-top
  out = []
  for i, r in enumerate(rirs, 1):
    try:
      out.append(rir.rir_to_sparql(r))
    except rir.RIRError as e:
      logging.warning("line %d: prediction is not valid RIR (%s): %s", i, e, r)
      out.append(f"ERROR: {e}")
  return out


def read_lines(text: str) -> list[str]:
  """Splits `text` into lines at "\n" only (a trailing "\r" of each line is dropped; a final
  newline ends the last line rather than starting an empty one)."""
  lines = text.split("\n")
  if lines and lines[-1] == "":
    lines.pop()
  return [l[:-1] if l.endswith("\r") else l for l in lines]


def main(argv: Optional[Sequence[str]] = None) -> list[str]:
  """Entry point (`python -m mcwq_t5x.infer`): gin flags + --input/--output/--sparql -> `infer`."""
  gin_utils.setup_logging()
  gin_utils.use_main_module_as("mcwq_t5x.infer")

  def extra(parser: argparse.ArgumentParser):
    parser.add_argument("--input", default="-", help="questions, one per line ('-' = stdin)")
    parser.add_argument("--output", default="-", help="output file ('-' = stdout)")
    parser.add_argument(
        "--sparql",
        action="store_true",
        help="print executable SPARQL (mcwq_t5x.rir.rir_to_sparql) instead of RIR")

  args = gin_utils.parse_flags(argv, description=__doc__.splitlines()[0], extra_args=extra)
  gin_utils.call_configured(partitioning.set_host_device_count)
  partitioning.set_inference_cpu_options()
  gin_utils.call_configured(partitioning.initialize_distributed)
  if args.input == "-":
    text = sys.stdin.buffer.read().decode("utf-8")
  else:
    with open(args.input, encoding="utf-8", newline="") as f:
      text = f.read()
  questions = [l.strip() for l in read_lines(text)]
  predictions = gin_utils.call_configured(infer, questions)  # pylint: disable=no-value-for-parameter
  if args.sparql:
    predictions = to_sparql_lines(predictions)
  out = "".join(" ".join(p.splitlines()) + "\n" for p in predictions)
  if args.output == "-":
    sys.stdout.write(out)
  else:
    with open(args.output, "w", encoding="utf-8") as f:
      f.write(out)
  return predictions


if __name__ == "__main__":
  main()
