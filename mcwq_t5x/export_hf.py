r"""Exports a checkpoint to a Hugging Face Transformers folder
(`mcwq_t5x.checkpointing.export_hf`).

  python -m mcwq_t5x.export_hf --checkpoint runs/tiny_random_split_en --out exported/tiny
  python -m mcwq_t5x.export_hf --checkpoint ckpts/checkpoint_1000000 --model_config mt5_small \
      --vocab mc4.250000.100extra/sentencepiece.model --max_new_tokens 512 --out exported/mt5_small

A run of `mcwq_t5x.train` needs no more than `--checkpoint` (its run.json says the rest); other
checkpoints need `--model_config`, `--vocab` and `--max_new_tokens`. On success it prints one line
saying what it wrote where.
"""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Optional, Sequence
from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import export_hf
from mcwq_t5x.engine import network
from mcwq_t5x import console


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Command line; returns the exit status (0 ok, 1 bad input, 2 bad flags)."""
  parser = argparse.ArgumentParser(
      prog="python -m mcwq_t5x.export_hf",
      description="Export a checkpoint to a Hugging Face Transformers folder.")
  parser.add_argument(
      "--checkpoint",
      required=True,
      help="MODEL_DIR, an Orbax step folder, a T5X checkpoint_N folder or a "
      "Hugging Face folder")
  parser.add_argument("--out", required=True, help="folder to write")
  parser.add_argument(
      "--model_config",
      default=None,
      help=f"a preset of network.CONFIGS ({', '.join(sorted(network.CONFIGS))}) or a JSON file "
      "of network.T5Config fields (default: the run's run.json, the Hugging Face config.json)")
  parser.add_argument(
      "--vocab",
      default=None,
      help="SentencePiece .model file (default: the vocabulary the run's run.json records, the "
      "Hugging Face folder's spiece.model)")
  parser.add_argument(
      "--extra_ids",
      type=int,
      default=None,
      help="sentinel ids after the vocabulary's pieces (default: as run.json or "
      "tokenizer_config.json says, else 0)")
  parser.add_argument(
      "--max_new_tokens",
      type=int,
      default=None,
      help="decoding length written to generation_config.json (default: the run's "
      "feature_lengths['targets'] in run.json, the Hugging Face generation_config.json's)")
  parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
  try:
    options = ("model_config", "vocab", "extra_ids", "max_new_tokens", "overwrite")
    out = export_hf.export_checkpoint(args.checkpoint, args.out,
                                      **{k: getattr(args, k) for k in options})
  except (ValueError, checkpoint_paths.NotACheckpointError) as e:
    # ValueError includes CheckpointMismatchError / IncompleteCheckpointError.
    console.print_error(e)
    return 1
  print(export_hf.summary(out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
