r"""Inference main: questions (a file or stdin) -> RIR queries, or executable SPARQL with --sparql.

Usage:
  echo "Did M0 direct M1" | python -m mcwq_t5x.infer --gin_file=gin/models/tiny.gin \
      --gin_file=gin/runs/infer.gin --gin.CHECKPOINT_PATH="'runs/tiny'" --sparql
  python -m mcwq_t5x.infer --gin_file=... --input=questions.txt --output=queries.txt

One question per input line (entity placeholders M0..M9 as in MCWQ); one output line per input
line, in order. With --sparql the RIR is converted by `mcwq_t5x.rir.rir_to_sparql`; a prediction
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
from mcwq_t5x import partitioning

if __name__ == "__main__":
  # Run the package module (one gin registration of `infer`), see mcwq_t5x/train.py.
  from mcwq_t5x import infer as _infer_module  # pylint: disable=g-import-not-at-top
  _infer_module.main()
  sys.exit(0)


def encode_questions(questions: Sequence[str], vocabulary: Any, input_length: int,
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


@gin.configurable
def infer(questions: Sequence[str], *,
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
    checkpoint_path: CHECKPOINT_PATH (see `mcwq_t5x.eval.load_params`).
    vocabulary: input/output vocabulary (default the model's `input_vocabulary`).
    input_prefix: prepended to each question; must match training (tasks' `prefix`, default "").
    input_length: input tokens (EOS included; longer questions are trimmed).
    max_decode_length: output tokens.
    batch_size: decoding batch size.
    predict_kwargs: `model.predict_batch` options (e.g. beam search {"num_decodes": 4}).
    partitioner: mesh.

  Returns:
    The predicted RIR strings, in input order.

  Raises:
    ValueError: no vocabulary, or vocabulary/model size mismatch.
  """
  from mcwq_t5x import eval as eval_lib  # pylint: disable=g-import-not-at-top
  from mcwq_t5x import train as train_lib  # pylint: disable=g-import-not-at-top
  from mcwq_t5x import utils  # pylint: disable=g-import-not-at-top
  vocabulary = vocabulary if vocabulary is not None else getattr(model, "input_vocabulary", None)
  if vocabulary is None:
    raise ValueError("infer needs a vocabulary (gin: infer.vocabulary = %VOCABULARY)")
  size = train_lib.model_vocab_size(model)
  if size is not None:
    utils.check_vocab_size(vocabulary, size, where="infer")
  partitioner = partitioner or partitioning.Partitioner()
  params, _, _ = eval_lib.load_params(model, partitioner, checkpoint_path)
  if not questions:
    return []
  arrays = {"encoder_input_tokens": encode_questions(questions, vocabulary, input_length,
                                                     input_prefix),
            "decoder_input_tokens": np.zeros((len(questions), max_decode_length), np.int32)}
  predictor = train_lib.Predictor(model, partitioner, batch_size, predict_kwargs)
  predictor.params = params
  tokens = predictor.predict_arrays(arrays)
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


def main(argv: Optional[Sequence[str]] = None) -> list[str]:
  """Entry point: gin flags + --input/--output/--sparql -> `infer`."""
  gin_utils.setup_logging()

  def extra(parser: argparse.ArgumentParser):
    parser.add_argument("--input", default="-", help="questions, one per line ('-' = stdin)")
    parser.add_argument("--output", default="-", help="output file ('-' = stdout)")
    parser.add_argument("--sparql", action="store_true",
                        help="print executable SPARQL (mcwq_t5x.rir.rir_to_sparql) instead of RIR")

  args = gin_utils.parse_flags(argv, description=__doc__.splitlines()[0], extra_args=extra)
  partitioning.set_host_device_count()
  partitioning.initialize_distributed()
  if args.input == "-":
    lines = sys.stdin.read().splitlines()
  else:
    with open(args.input, encoding="utf-8") as f:
      lines = f.read().splitlines()
  questions = [l.strip() for l in lines]
  predictions = infer(questions)  # pylint: disable=no-value-for-parameter
  if args.sparql:
    predictions = to_sparql_lines(predictions)
  text = "".join(p + "\n" for p in predictions)
  if args.output == "-":
    sys.stdout.write(text)
  else:
    with open(args.output, "w", encoding="utf-8") as f:
      f.write(text)
  return predictions
