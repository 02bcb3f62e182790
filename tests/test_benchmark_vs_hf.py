"""`scripts/benchmark_vs_hf.py` runs as users run it (a fresh process) on real MCWQ questions and
prints its figures: one line per system, and the ratio line last.

Speed itself is never asserted (the figures depend on the machine). One tiny run of three modes,
as one command, on 64 of the 155 Hebrew gold questions: the epoch mode (a 1-layer width-32 network;
our real training path, `mcwq_t5x.train.train`, against transformers; the fixed-shape mode times a
plain step loop of the same trainer and model, which the trainer and model tests cover), the decode
mode, greedy, of the session's trained run of our engine (`conftest.our_run`: its run.json gives
the network), exported and decoded by both systems: greedy search on the same weights gives the
same queries (beam search takes the same path with another method, covered by the decoding tests),
and the eval mode: the README's eval command (with gin bindings for the run's network) and a
transformers user's script as whole processes, which give the same predictions and exact match.
"""
import re
import sys

import pytest

import mains

pytest.importorskip("torch")
pytest.importorskip("transformers")

TINY = [
    "--modes", "epoch,decode,eval", "--task", "mcwq_gold_he", "--split", "test", "--max_examples",
    "64", "--emb_dim", "32", "--num_heads", "2", "--head_dim", "16", "--mlp_dim", "64",
    "--num_layers", "1", "--batch_size", "16", "--decode_methods", "greedy", "--decode_batch_size",
    "16", "--input_length", "40", "--target_length", "128"
]
DECODE_QUESTIONS = 64


@pytest.fixture(scope="module")
def lines(our_run):
  out = mains.run(
      [sys.executable, "scripts/benchmark_vs_hf.py", *TINY, "--checkpoint",
       str(our_run)],
      timeout=1200)
  assert "WARNING" not in out.stdout, out.stdout  # both trained on the same target tokens
  return out.stdout.strip().splitlines()


def test_epoch_prints_both_systems_the_flop_rate_and_the_ratio(lines):
  runs = [l for l in lines if re.match(r"^\s*(ours|hf) (epoch|fixed) +[\d.]+ ex/s", l)]
  assert len(runs) == 2, lines
  for line in runs:
    rate, tokens, seconds, rss = map(
        float,
        re.search(r"([\d.]+) ex/s\s+([\d.]+) tgt tok/s\s+([\d.]+) s\s+([\d.]+) GiB", line).groups())
    assert rate > 0 and tokens > rate and seconds > 0 and 0.1 < rss < 24, line
  for system in ("ours", "hf"):
    flops = [l for l in lines if l.startswith(f"{system} epoch: ")]
    assert len(flops) == 1, lines
    achieved, peak, share = map(
        float,
        re.fullmatch(
            rf"{system} epoch: ([\d.]+) GFLOP/s of ([\d.]+) GFLOP/s matmul peak "
            r"\(([\d.]+)%\)", flops[0]).groups())
    assert 0 < achieved and 0 < peak and share == pytest.approx(100 * achieved / peak, abs=0.6)
  assert re.fullmatch(r"epoch ratio ours/hf: \d+\.\d\d", lines[-1]), lines[-3:]
  assert not any("fixed-shape" in l for l in lines)


def test_decode_prints_both_systems_and_the_ratio(lines):
  runs = [l for l in lines if re.match(r"^\s*(ours|hf) decode (greedy|beam4)", l)]
  assert len(runs) == 2, lines
  for line in runs:
    rate, seconds, rss, same, n = re.search(
        r"([\d.]+) questions/s\s+([\d.]+) s\s+([\d.]+) GiB peak RSS\s+(\d+)/(\d+) identical",
        line).groups()
    assert float(rate) > 0 and float(seconds) > 0 and 0.1 < float(rss) < 24, line
    # Float32 on both sides: a near-tie between two tokens may go either way, nothing more.
    assert int(n) == DECODE_QUESTIONS and int(same) >= DECODE_QUESTIONS - 2, line
  assert sum(bool(re.fullmatch(r"decode ratio ours/hf: \d+\.\d\d", l)) for l in lines) == 1
  assert not any("beam4" in l for l in lines)


def test_eval_prints_both_whole_processes_and_the_ratio(lines):
  runs = [l for l in lines if re.match(r"^\s*(ours|hf) eval process", l)]
  assert len(runs) == 2, lines
  exact = []
  for line in runs:
    seconds, rss, em, same, n = re.search(
        r"([\d.]+) s\s+([\d.]+) GiB peak RSS\s+exact match ([\d.]+)\s+(\d+)/(\d+) identical",
        line).groups()
    assert float(seconds) > 0 and 0.1 < float(rss) < 24, line
    assert int(n) == DECODE_QUESTIONS and int(same) >= DECODE_QUESTIONS - 2, line
    exact.append(float(em))
  # Each prediction that differs moves an exact match by at most 100/64.
  assert abs(exact[0] - exact[1]) <= 100 * (DECODE_QUESTIONS - int(same)) / DECODE_QUESTIONS + 0.01
  assert 0 < exact[0] < 100, runs  # the run learned something, but not everything
  assert sum(bool(re.fullmatch(r"eval process time ours/hf: \d+\.\d\d", l)) for l in lines) == 1
