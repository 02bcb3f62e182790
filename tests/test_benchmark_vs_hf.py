"""`scripts/benchmark_vs_hf.py` runs as users run it (a fresh process) on real MCWQ questions and
prints its figures: one line per system, and the ratio line last.

Speed itself is never asserted (the figures depend on the machine); the run is made tiny (64
questions, a 1-layer width-32 network) and runs the epoch mode only, our real training path
(`mcwq_t5x.train.train`) against transformers: the fixed-shape mode times a plain step loop of
the same trainer and model, which the trainer and model tests cover."""
import re
import sys

import pytest

import mains

pytest.importorskip("torch")
pytest.importorskip("transformers")

TINY = [
    "--max_examples", "64", "--emb_dim", "32", "--num_heads", "2", "--head_dim", "16", "--mlp_dim",
    "64", "--num_layers", "1", "--batch_size", "16", "--modes", "epoch"
]


def test_benchmark_vs_hf_prints_both_systems_and_the_ratios(mcwq_dir):
  del mcwq_dir
  out = mains.run([sys.executable, "scripts/benchmark_vs_hf.py", *TINY], timeout=1200)
  lines = out.stdout.strip().splitlines()
  runs = [l for l in lines if re.match(r"^\s*(ours|hf) (epoch|fixed)", l)]
  assert len(runs) == 2, out.stdout
  for line in runs:
    rate, tokens, seconds, rss = map(
        float,
        re.search(r"([\d.]+) ex/s\s+([\d.]+) tgt tok/s\s+([\d.]+) s\s+([\d.]+) GiB", line).groups())
    assert rate > 0 and tokens > rate and seconds > 0 and 0.1 < rss < 24, line
  # Both systems trained on the same 64 questions (the same target tokens: nothing truncated).
  assert "WARNING" not in out.stdout, out.stdout
  assert re.fullmatch(r"epoch ratio ours/hf: \d+\.\d\d", lines[-1]), lines[-3:]
  assert "fixed-shape" not in out.stdout


TINY_DECODE = [
    "--modes", "decode", "--max_examples", "24", "--decode_train_steps", "2", "--batch_size", "8",
    "--decode_batch_size", "16", "--input_length", "32", "--target_length", "72"
]


def test_benchmark_vs_hf_decode_prints_both_systems_and_the_ratio(mcwq_dir):
  """`--modes decode`: the tiny preset trained 2 steps, exported, decoded by both systems."""
  del mcwq_dir
  out = mains.run([sys.executable, "scripts/benchmark_vs_hf.py", *TINY_DECODE], timeout=1200)
  lines = out.stdout.strip().splitlines()
  runs = [l for l in lines if re.match(r"^\s*(ours|hf) decode (greedy|beam4)", l)]
  assert len(runs) == 4, out.stdout
  for line in runs:
    rate, seconds, rss, same, n = re.search(
        r"([\d.]+) questions/s\s+([\d.]+) s\s+([\d.]+) GiB peak RSS\s+(\d+)/(\d+) identical",
        line).groups()
    assert float(rate) > 0 and float(seconds) > 0 and 0.1 < float(rss) < 24, line
    assert int(n) == 24 and 0 <= int(same) <= 24, line
  assert re.fullmatch(r"decode ratio ours/hf: \d+\.\d\d", lines[-1]), lines[-3:]
