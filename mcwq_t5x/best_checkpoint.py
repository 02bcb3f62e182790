"""Prints the checkpoint of a MODEL_DIR with the best logged metric
(`mcwq_t5x.checkpointing.best_checkpoint`).

  python -m mcwq_t5x.best_checkpoint MODEL_DIR [--metric NAME] [--mode min|max]
"""
from __future__ import annotations

import logging
import sys
from typing import Optional, Sequence
from mcwq_t5x.checkpointing import best_checkpoint
from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x import console


def main(argv: Optional[Sequence[str]] = None) -> int:
  """`python -m mcwq_t5x.best_checkpoint MODEL_DIR [--metric NAME] [--mode min|max]`: prints the
  checkpoint `best_checkpoint.checkpoint_path` chooses.

  Returns:
    The exit status: 0, or 1 when MODEL_DIR holds no checkpoint (one line on stderr).
  """
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(
      prog="python -m mcwq_t5x.best_checkpoint",
      description="Print the checkpoint of a MODEL_DIR (ours or T5X's) with the best logged "
      "metric, the one the eval files decode.")
  parser.add_argument("model_dir", help="a training MODEL_DIR (or one checkpoint_<step> folder)")
  parser.add_argument(
      "--metric",
      default="training_eval/loss",
      help="eval_metrics.jsonl key or T5X's {run}/{tag} TensorBoard name (default: "
      "training_eval/loss, the dev loss); 'none' = the newest checkpoint")
  parser.add_argument("--mode", choices=("min", "max"), default="min", help="default min")
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
  try:
    metric = None if args.metric.lower() == "none" else args.metric
    print(best_checkpoint.checkpoint_path(args.model_dir, metric, args.mode))
  except checkpoint_paths.NotACheckpointError as e:
    console.print_error(e)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
