"""`scripts/benchmark_vs_hf.py` runs as users run it (a fresh process) on real MCWQ questions and
prints its figures: one line per system, and the ratio line last.

Speed itself is never asserted (the figures depend on the machine). One tiny run of two modes, as
one command, on 16 of the 155 Hebrew gold questions (the plumbing, not an epoch: a step or two,
two decode batches): the epoch mode (a 1-layer width-32 network; our
real training path, `mcwq_t5x.train.train`, against transformers; on 1 XLA device, the
default, the program compiles in a quarter less CPU time than on 2, whose data-parallel mesh the
partitioning and multi-process tests cover; the fixed-shape mode times a plain step loop of the
same trainer and model, which the trainer and model tests cover) and the decode
mode, greedy, of the session's trained run of our engine (`conftest.our_run`: its run.json gives
the network), exported and decoded by both systems: greedy search on the same weights gives the
same queries (beam search takes the same path with another method, covered by the decoding tests).
The eval mode's two whole processes (the README's eval command and a transformers user's script)
are not run here: the command it builds for ours is checked in-process.
"""
import pathlib
import re
import sys

import pytest

import mains

pytest.importorskip("torch")
pytest.importorskip("transformers")

TINY = [
    "--modes", "epoch,decode", "--task", "mcwq_gold_he", "--split", "test", "--max_examples", "16",
    "--emb_dim", "32", "--num_heads", "2", "--head_dim", "16", "--mlp_dim", "64", "--num_layers",
    "1", "--batch_size", "8", "--decode_methods", "greedy", "--decode_batch_size", "8",
    "--input_length", "40", "--target_length", "128"
]
DECODE_QUESTIONS = 16


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
    rate, tokens, seconds, rss, steps = map(
        float,
        re.search(
            r"([\d.]+) ex/s\s+([\d.]+) tgt tok/s\s+([\d.]+) s\s+([\d.]+) GiB peak RSS  "
            r"\((\d+) steps\)", line).groups())
    # seconds below 10 have three decimals: 16 examples of transformers' epoch are not 0.0 s
    assert rate > 0 and tokens > rate and seconds > 0 and 0.1 < rss < 24 and steps >= 1, line
  # The run's peak: the fastest of the kernels each worker timed in its own process.
  peak_lines = [l for l in lines if l.startswith("matmul peak: ")]
  assert len(peak_lines) == 1, lines
  top, kernel, each = re.fullmatch(
      r"matmul peak: ([\d.]+) GFLOP/s \((numpy|XLA|torch); best per kernel: (.*); 2048x2048 "
      r"float32, timed in each worker\)", peak_lines[0]).groups()
  measured = {k: float(v) for k, v in (e.split(" ") for e in each.split(", "))}
  assert set(measured) == {"numpy", "XLA", "torch"
                          } and measured[kernel] == float(top) == max(measured.values()), peak_lines
  for system in ("ours", "hf"):
    flops = [l for l in lines if l.startswith(f"{system} epoch: ")]
    assert len(flops) == 1, lines
    achieved, peak, share = map(
        float,
        re.fullmatch(
            rf"{system} epoch: ([\d.]+) GFLOP/s of ([\d.]+) GFLOP/s matmul peak "
            r"\(([\d.]+)%\)", flops[0]).groups())
    # >= 0: ours on 16 examples, its compilation counted, prints 0.0 GFLOP/s (one decimal)
    assert 0 <= achieved and peak == float(top) and share == pytest.approx(
        100 * achieved / peak, abs=0.6)
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
    # Ours, the only run, compiled (its compilation cache, a folder of the run, was empty).
    assert line.endswith("(compiles)") == line.lstrip().startswith("ours"), line
  assert sum(bool(re.fullmatch(r"decode ratio ours/hf: \d+\.\d\d", l)) for l in lines) == 1
  assert not any("beam4" in l for l in lines)


def test_eval_mode_runs_the_readme_eval_command_on_the_runs_network(our_run, tmp_path):
  """`--modes eval` (here without its two processes, which the decode mode's comparison above
  covers): our side is the README's eval command, with the bindings that give the checkpoint's
  network (the session run's is smaller than the preset)."""
  import argparse  # pylint: disable=g-import-not-at-top
  import ast  # pylint: disable=g-import-not-at-top
  import dataclasses  # pylint: disable=g-import-not-at-top

  from mcwq_t5x.checkpointing import run_info  # pylint: disable=g-import-not-at-top
  from mcwq_t5x.engine import network  # pylint: disable=g-import-not-at-top

  import readme_commands as rc  # pylint: disable=g-import-not-at-top
  bench = mains.load_script("benchmark_vs_hf")
  args = argparse.Namespace(
      checkpoint=str(our_run),
      decode_model="tiny",
      task="mcwq_gold_he",
      split="test",
      decode_batch_size=16,
      max_examples=64)
  command = bench._our_eval_command(args, str(our_run), str(tmp_path / "out"))  # pylint: disable=protected-access
  readme = rc.COMMANDS[rc.OUR_EVAL][1].split()
  assert command[:2] == [sys.executable, "-m"] and command[2:5] == readme[2:5], (command, readme)
  prefix = "--gin.network.get_config."
  bindings = dict(a[len(prefix):].split("=", 1) for a in command if a.startswith(prefix))
  assert "emb_dim" in bindings, command  # 32 in the run, 64 in the preset
  built = dataclasses.replace(network.CONFIGS["tiny"], **{
      k: ast.literal_eval(v) for k, v in bindings.items()
  })
  run_path = run_info.find(our_run)
  recorded = run_info.network_config(run_info.read(run_path), run_path)
  assert dataclasses.replace(
      built, dropout_rate=0.0) == dataclasses.replace(
          recorded, dropout_rate=0.0)
  assert "--gin.NUM_EXAMPLES=64" in command and "--gin.BATCH_SIZE=16" in command


def test_the_mt5_small_shape_gives_the_flags_defaults_and_given_flags_win():
  """`--shape mt5_small`: mT5-small's sizes and the paper's lengths (the gin file's
  TASK_FEATURE_LENGTHS), an explicitly given flag kept."""
  bench = mains.load_script("benchmark_vs_hf")
  args = bench.parse_args(["--shape", "mt5_small", "--num_layers", "2"])
  assert (args.vocab_size, args.emb_dim, args.num_heads, args.head_dim, args.mlp_dim,
          args.num_layers) == (250112, 512, 6, 64, 1024, 2)
  gin = (pathlib.Path(__file__).parents[2] / "gin/mcwq_t5x/mt5_small_mcd1_en.gin").read_text()
  assert f"TASK_FEATURE_LENGTHS = {{'inputs': {args.input_length}, 'targets': " \
      f"{args.target_length}}}" in gin
  assert bench.parse_args([]).vocab_size == 2048
