#!/usr/bin/env python3
"""Trains (or finds in the cache) the small offline SentencePiece model of mcwq-t5x.

The model (see `mcwq_t5x.data.vocab`) is trained on the questions and RIR queries of every
available MCWQ `train`/`dev` file, reproducibly, and cached in `$MCWQ_CACHE_DIR/spm/`
(default `~/.cache/mcwq_t5x/spm/`). Prints its path, size, MD5 and token-length figures.

Usage:
  python scripts/train_vocab.py                       # default: 2,000 pieces, into the cache
  python scripts/train_vocab.py --vocab-size 4000
  python scripts/train_vocab.py --output /tmp/mcwq.model --data-dir /data/mcwq
"""
from __future__ import annotations

import argparse
import hashlib
import pathlib
import sys
import time
from typing import Optional, Sequence

_REPO = pathlib.Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:
  sys.path.insert(0, str(_REPO))

from mcwq_t5x.data import vocab  # noqa: E402  pylint: disable=g-import-not-at-top


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Command line (module docstring): trains (or finds cached) the small SentencePiece model and
  prints its path, size and md5; returns the exit status."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--data-dir", default=None, help="MCWQ directory (default: $MCWQ_DATA_DIR)")
  parser.add_argument("--vocab-size", type=int, default=vocab.DEFAULT_VOCAB_SIZE)
  parser.add_argument("--model-type", default="bpe", choices=("bpe", "unigram"))
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
      "--output", type=pathlib.Path, default=None, help="write the model here instead of the cache")
  args = parser.parse_args(argv)
  config = vocab.SmallVocabConfig(
      vocab_size=args.vocab_size, model_type=args.model_type, seed=args.seed)
  start = time.time()
  if args.output is not None:
    sentences = vocab.training_corpus(args.data_dir, config.parts)
    path = vocab.train_sentencepiece(sentences, args.output, config)
  else:
    path = vocab.small_vocab_path(args.data_dir, config)
  elapsed = time.time() - start

  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  sp = spm.SentencePieceProcessor(model_file=str(path))
  print(f"model: {path}")
  print(f"pieces: {sp.get_piece_size()}  pad={sp.pad_id()} eos={sp.eos_id()} "
        f"unk={sp.unk_id()} bos={sp.bos_id()}")
  print(f"md5: {hashlib.md5(path.read_bytes()).hexdigest()}")
  print(f"time (train or cache lookup): {elapsed:.1f} s")
  print(f"use it with: export MCWQ_VOCAB={path}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
