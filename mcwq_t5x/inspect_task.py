"""Prints a SeqIO task's preprocessed examples and token-length statistics.

Use it to choose TASK_FEATURE_LENGTHS: the statistics are over the whole split (each example once,
a mixture's tasks one after another), lengths count the EOS token, and nothing is truncated.

Usage:
  python -m mcwq_t5x.inspect_task mcwq_mcd1_he --split validation -n 5
  python -m mcwq_t5x.inspect_task mcwq_gold_zh --split test --max-examples 0
"""
from __future__ import annotations

import argparse
import difflib
import sys
import time
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from mcwq_t5x.data import paths
from mcwq_t5x.data import pipeline
from mcwq_t5x.data import vocab
from mcwq_t5x import console

PERCENTILES = (50, 90, 95, 99)
PROGRESS_EVERY_S = 5.0  # seconds between two progress lines while the split is read


class UnknownTaskError(KeyError):
  """The task/mixture name is not registered; the message lists close matches."""

  def __str__(self) -> str:  # KeyError would repr() the message.
    return str(self.args[0])


def get_task(name: str):
  """The registered seqio Task or Mixture `name` (`tasks` imported first).

  UnknownTaskError lists the closest registered names.
  """
  import seqio  # pylint: disable=g-import-not-at-top
  import tasks  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import

  names = sorted(set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names()))
  if name not in names:
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    mcwq = [n for n in names if n.startswith("mcwq_")]
    hint = (f"did you mean: {', '.join(close)}?"
            if close else f"registered MCWQ tasks include: {', '.join(mcwq[:8])}, ...")
    raise UnknownTaskError(f"unknown task or mixture {name!r}; {hint}")
  return seqio.get_mixture_or_task(name)


def length_stats(lengths: Sequence[int]) -> dict[str, float]:
  """Percentiles 50/90/95/99 (linear interpolation), max, mean and count of `lengths`."""
  a = np.asarray(lengths, dtype=np.int64)
  if a.size == 0:
    return {"count": 0}
  out = {f"p{p}": float(np.percentile(a, p)) for p in PERCENTILES}
  out.update(max=int(a.max()), mean=float(a.mean()), count=int(a.size))
  return out


def inspect(name: str,
            split: str = "validation",
            num_examples: int = 5,
            max_examples: Optional[int] = None,
            out=None,
            progress=None) -> dict[str, Any]:
  """{"inputs": stats, "targets": stats} (`length_stats`) of `split`; prints `num_examples`
  examples.

  `max_examples` None or 0: the whole split (a mixture's tasks one after another); `out` (default
  stdout) gets the examples and statistics, `progress` (default stderr) `[  12 s] ...` lines
  every `PROGRESS_EVERY_S`. Raises UnknownTaskError, DataNotFoundError (missing data or vocabulary).
  """
  out = out or sys.stdout  # why at call time: the streams of the caller's moment (a test's capture)
  progress = progress or sys.stderr
  start = time.monotonic()
  say = lambda message: print(f"[{time.monotonic() - start:4.0f} s] {message}", file=progress)
  say("loading SeqIO, TensorFlow and the MCWQ tasks")
  task = get_task(name)
  say(f"reading and tokenising {name} {split}")
  prefix = pipeline.input_prefix_of(task)
  if prefix is not None:
    print(
        f"input prefix: {prefix!r}" if prefix else "input prefix: none (the bare question)",
        file=out)
  ds = _unlimited_dataset(task, split)
  if max_examples:
    ds = ds.take(max_examples)
  features = task.output_features
  lengths: dict[str, list[int]] = {k: [] for k in features}
  shown, count = time.monotonic(), 0
  for i, ex in enumerate(ds.as_numpy_iterator()):
    count += 1
    for k in features:
      if k in ex:
        lengths[k].append(len(ex[k]))
    if i < num_examples:
      _print_example(i, ex, features, out)
    if time.monotonic() - shown >= PROGRESS_EVERY_S:
      shown = time.monotonic()
      say(f"{i + 1:,} examples")
  say(f"{count:,} examples read")
  stats = {k: length_stats(v) for k, v in lengths.items()}
  print(f"\nlength statistics ({name}, {split}; tokens incl. EOS):", file=out)
  print(
      f"{'feature':>8} {'count':>7} {'mean':>7} " +
      " ".join(f"{'p' + str(p):>6}" for p in PERCENTILES) + f" {'max':>6}",
      file=out)
  for k, s in stats.items():
    if s.get("count"):
      print(
          f"{k:>8} {s['count']:>7} {s['mean']:>7.1f} " +
          " ".join(f"{s['p' + str(p)]:>6.0f}" for p in PERCENTILES) + f" {s['max']:>6}",
          file=out)
  suggestion = {k: int(-(-s["max"] // 8) * 8) for k, s in stats.items() if s.get("count")}
  print(f"TASK_FEATURE_LENGTHS covering every example (rounded up to 8): {suggestion}", file=out)
  return stats


@pipeline.without_autograph
def _unlimited_dataset(task, split: str):
  """`task`'s preprocessed `split` once, in source order (a mixture's tasks one after another,
  `pipeline.one_epoch`), without a length limit (traced without AutoGraph:
  `pipeline.without_autograph`)."""
  return pipeline.one_epoch(
      task, split,
      lambda sub: sub.get_dataset(sequence_length=None, split=split, shuffle=False, num_epochs=1))


def _print_example(i: int, ex: Mapping[str, Any], features, out) -> None:
  print(f"--- example {i}", file=out)
  for k, feature in features.items():
    if k not in ex:
      continue
    ids = ex[k].tolist()
    text = feature.vocabulary.decode(ids)
    pre = ex.get(f"{k}_pretokenized")
    if pre is not None:
      pre = pre.decode("utf-8") if isinstance(pre, bytes) else str(pre)
      print(f"{k}_pretokenized: {pre}", file=out)
    print(f"{k} ({len(ids)} ids): {ids}", file=out)
    print(f"{k} decoded: {text}", file=out)


def main(argv: Optional[Sequence[str]] = None) -> int:
  """`python -m mcwq_t5x.inspect_task TASK [--split S] [-n N]`: exit status 0, 2 (unknown task) or 1
  (missing data, vocabulary or split; one stderr line)."""
  parser = argparse.ArgumentParser(
      prog="python -m mcwq_t5x.inspect_task", description=__doc__.split("\n\n")[0])
  parser.add_argument("task", help="seqio task or mixture name, e.g. mcwq_mcd1_he")
  parser.add_argument("--split", default="validation", help="train, validation or test")
  parser.add_argument(
      "-n", "--num-examples", type=int, default=5, help="examples to print (default 5)")
  parser.add_argument(
      "--max-examples",
      type=int,
      default=0,
      help="limit the statistics to this many examples (0: all)")
  args = parser.parse_args(argv)
  try:
    vocab.check_vocabulary_variable()
    inspect(args.task, args.split, args.num_examples, args.max_examples)
  except UnknownTaskError as e:
    console.print_error(e)
    return 2
  except vocab.VocabularyNotFoundError as e:  # $MCWQ_VOCAB names a missing or unreadable file
    console.print_error(e)
    return 1
  except (paths.DataNotFoundError, ValueError) as e:  # e.g. --split train without train files
    console.print_error(e, f"{args.task} split {args.split!r}: ")
    return 1
  return 0


if __name__ == "__main__":
  console.quiet_native_logs()
  sys.exit(main())
