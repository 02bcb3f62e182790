#!/usr/bin/env python3
r"""Where a training step's time goes: a `jax.profiler` trace of our training steps, by kind of work.

Trains the network of `scripts/benchmark_vs_hf.py` (same flags and defaults: d_model 256, 4+4
layers, 4 heads of 64, d_ff 1024, vocabulary 2,048, float32, dropout 0.1, Adafactor, batch 32 of
packed rows of 40/72 tokens of the English `random_split` dev questions) as the training main
does: `--host_devices` XLA CPU devices (default 2), the main's XLA CPU flags
(`cpu_settings.XLA_CPU_TRAINING_FLAGS`) and host `malloc` options, at most 2 steps in flight.
After `--warmup_steps` untraced steps (compilation), traces `--steps` steps and reads the trace
(`jax.profiler.ProfileData`): every event of XLA's CPU runtime named after an instruction of the
compiled step (a fusion, a copy, an all-reduce, ...) is one piece of work, put in a kind by what
the instruction computes and where in the program it comes from (its `op_name` metadata):

* matmuls: a fusion that contains a `dot` (YNNPACK's or XLA's), or a dot;
* gradient all-reduce: the data-parallel sum of the gradients over the devices (and its
  rendezvous waits);
* attention elementwise: softmax, mask, relative position bias and dropout of the attention
  weights (the `attention` scopes, forward and backward);
* layer norms; MLP elementwise (the gated GELU and its dropout);
* embedding and loss: the token embedding's gather and its gradient's scatter, the log-softmax
  and cross entropy over the vocabulary;
* residual adds and dropout; the optimizer (Adafactor's update, the gradient norm, the
  non-finite guard: the step's work outside the forward and backward passes);
* copies and transposes that XLA inserted between fusions;
* outside the step's instructions: the rest of the device threads' time over the traced
  steps (waiting, dispatching the next step, the host's work in between).

Prints the traced steps' wall time, the time of each kind as a share of the threads' time
(threads that ran the step's instructions x wall time), the FLOP rate of the matmul fusions
alone (`--top` largest listed), and the model FLOPs per second of the steps
(`flops.train_step_flops`). Shares add up to 100%; a loaded machine moves time into the last
line.

Example:
  python scripts/profile_train_step.py --steps 5
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

KINDS = ("matmuls", "gradient all-reduce", "attention elementwise", "layer norms",
         "MLP elementwise", "embedding and loss", "residual adds and dropout", "optimizer",
         "copies and transposes", "other", "outside the step's instructions")


def parse_hlo(text: str) -> tuple[dict[str, dict[str, str]], dict[str, set[str]]]:
  """The instructions and computations of a compiled module's text (`Compiled.as_text()`).

  Returns:
    ({instruction name: {"opcode", "op_name", "calls"}}, {computation name: the opcodes in it}).
  """
  instructions: dict[str, dict[str, str]] = {}
  computations: dict[str, set[str]] = collections.defaultdict(set)
  current = None
  head = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) (?:\(.*\) -> .* )?\{$")
  line_re = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = [^=]*? ([a-z][\w\-]*)\(")
  for line in text.splitlines():
    stripped = line.strip()
    m = head.match(stripped)
    if m and not line.startswith(" "):
      current = m.group(1)
      continue
    m = line_re.match(line)
    if not m:
      continue
    name, opcode = m.groups()
    if current is not None:
      computations[current].add(opcode)
    calls = re.search(r"calls=%?([\w.\-]+)", line)
    op_name = re.search(r'op_name="([^"]*)"', line)
    instructions[name] = {
        "opcode": opcode,
        "calls": calls.group(1) if calls else "",
        "op_name": op_name.group(1) if op_name else ""
    }
  return instructions, computations


def kind_of(name: str, instructions: dict[str, dict[str, str]],
            computations: dict[str, set[str]]) -> str:
  """The kind of work (one of `KINDS`) of the trace event `name`; see the module docstring."""
  if name == "Rendezvous" or name.startswith("Wait: pending_threads"):
    return "gradient all-reduce"
  inst = instructions[name]
  opcode, op_name = inst["opcode"], inst["op_name"]
  inner = computations.get(inst["calls"], set())
  if opcode in ("dot", "convolution") or "dot" in inner or "convolution" in inner:
    return "matmuls"
  if opcode.startswith("all-reduce") or opcode.startswith("all-gather"):
    return "gradient all-reduce"
  if "jvp(" not in op_name and "transpose(" not in op_name and op_name:
    return "optimizer"
  if "attention" in op_name and "layer_norm" not in op_name:
    return "attention elementwise"
  if "norm" in op_name:
    return "layer norms"
  if "/mlp/" in op_name:
    return "MLP elementwise"
  if any(s in op_name for s in ("token_embedder", "logits", "one_hot", "/log", "cross_ent")) or (
      "Transformer" not in op_name and op_name):
    return "embedding and loss"
  if "dropout" in op_name or "/add" in op_name or "rng_bit_generator" in op_name:
    return "residual adds and dropout"
  if opcode in ("copy", "transpose") or "copy" in name or "transpose" in name:
    return "copies and transposes"
  return "other"


def analyse(trace_file: str, hlo_text: str, wall_s: float, steps: int, step_flops: float,
            top: int) -> list[str]:
  """The report's lines (see the module docstring) from a trace and the compiled step's text."""
  import jax
  instructions, computations = parse_hlo(hlo_text)
  data = jax.profiler.ProfileData.from_file(trace_file)
  busy: dict[str, float] = collections.Counter()
  per_op: dict[str, float] = collections.Counter()
  threads = 0
  for plane in data.planes:
    if plane.name != "/host:CPU":
      continue
    for line in plane.lines:
      if line.name == "python":
        continue
      ran = False
      for event in line.events:
        name = event.name
        if name in instructions or name == "Rendezvous" or name.startswith("Wait: pending"):
          busy[kind_of(name, instructions, computations)] += event.duration_ns / 1e9
          per_op[name] += event.duration_ns / 1e9
          ran = ran or name in instructions
      threads += ran
  total = threads * wall_s
  busy["outside the step's instructions"] = max(total - sum(busy.values()), 0.0)
  lines = [
      f"{steps} traced steps: {wall_s:.2f} s wall ({wall_s / steps:.3f} s/step), {threads} "
      f"threads ran the step's instructions ({total:.2f} thread-seconds)",
      f"model FLOPs: {step_flops * steps / wall_s / 1e9:.1f} GFLOP/s "
      f"({step_flops / 1e9:.2f} GFLOP a step)"
  ]
  for kind in sorted(KINDS, key=lambda k: -busy.get(k, 0.0)):
    if busy.get(kind, 0.0) > 0:
      lines.append(f"  {kind:<32} {busy[kind]:8.2f} s  {100 * busy[kind] / total:5.1f}%")
  dots = [
      n for n in per_op if n in instructions and kind_of(n, instructions, computations) == "matmuls"
  ]
  lines.append(f"the {top} longest instructions:")
  for name, seconds in per_op.most_common(top):
    inst = instructions.get(name, {"opcode": "", "op_name": ""})
    lines.append(f"  {seconds / steps * 1e3:8.1f} ms/step  {name} "
                 f"({kind_of(name, instructions, computations)}): {inst['op_name'][-90:]}")
  lines.append(f"{len(dots)} matmul instructions, {busy['matmuls'] / steps:.3f} s a step")
  return lines


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--task", default="mcwq_random_split_en")
  parser.add_argument("--split", default="validation")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--pack_input_length", type=int, default=40)
  parser.add_argument("--pack_target_length", type=int, default=72)
  parser.add_argument("--vocab_size", type=int, default=2048)
  parser.add_argument("--emb_dim", type=int, default=256)
  parser.add_argument("--num_heads", type=int, default=4)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--mlp_dim", type=int, default=1024)
  parser.add_argument("--num_layers", type=int, default=4)
  parser.add_argument("--dropout_rate", type=float, default=0.1)
  parser.add_argument("--learning_rate", type=float, default=1e-3)
  parser.add_argument("--use_hardware_rng", action=argparse.BooleanOptionalAction, default=True)
  parser.add_argument("--host_devices", type=int, default=2)
  parser.add_argument("--warmup_steps", type=int, default=3)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--top", type=int, default=12)
  parser.add_argument("--trace_dir", default="", help="keep the trace here (default: temporary)")
  args = parser.parse_args(argv)

  from mcwq_t5x.engine import cpu_settings
  cpu_settings.set_host_device_count(args.host_devices)
  cpu_settings.set_xla_cpu_flags()
  cpu_settings.set_host_malloc_options()
  import glob

  import jax

  import benchmark_vs_hf as bench
  from mcwq_t5x.data import pipeline
  from mcwq_t5x.engine import flops
  from mcwq_t5x.engine import partitioning

  cfg = bench._dataset_config(args, pack=True)  # pylint: disable=protected-access
  arrays = pipeline.load_feature_arrays(cfg)
  batches = pipeline.DeterministicBatches(arrays, args.batch_size, seed=0, shuffle=True)
  partitioner = partitioning.Partitioner()
  trainer = bench._our_trainer_cls(args)(  # pylint: disable=protected-access
      model=bench._our_model(args),
      partitioner=partitioner,
      seed=0)  # pylint: disable=protected-access
  rows = slice(0, args.batch_size)
  first = partitioner.make_global_batch(batches.batch(0, rows), args.batch_size)
  state = trainer.create_state({
      k: v.shape for k, v in first.items()
  }, {
      k: v.dtype for k, v in first.items()
  })
  guard = trainer.initial_guard()
  shardings = jax.tree_util.tree_map(lambda x: x.sharding, state)
  compiled = trainer.compile_train_step(shardings, first).lower(state, first, trainer.dropout_rng,
                                                                guard).compile()
  trainer._train_step_fn = compiled  # pylint: disable=protected-access
  hlo_text = compiled.as_text()

  def run(start: int, count: int) -> float:
    nonlocal state, guard
    pending = []
    t = time.perf_counter()
    for step in range(start, start + count):
      batch = partitioner.make_global_batch(batches.batch(step, rows), args.batch_size)
      state, metrics, guard = trainer.train_step_async(state, batch, guard)
      pending.append(metrics)
      if len(pending) > 2:  # as the training main: at most 2 steps in flight
        jax.block_until_ready(pending.pop(0))
    jax.block_until_ready(pending)
    return time.perf_counter() - t

  run(0, args.warmup_steps)
  with tempfile.TemporaryDirectory() as tmp:
    trace_dir = args.trace_dir or tmp
    jax.profiler.start_trace(trace_dir)
    wall = run(args.warmup_steps, args.steps)
    jax.profiler.stop_trace()
    trace = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))[-1]
    step_flops = flops.train_step_flops(
        bench._flop_config(args),  # pylint: disable=protected-access
        args.batch_size,
        args.pack_input_length,
        args.pack_target_length)
    print(f"{jax.device_count()} devices, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}")
    for line in analyse(trace, hlo_text, wall, args.steps, step_flops, args.top):
      print(line)
    peak: Any = flops.matmul_peak()
    print(f"matmul peak: {peak.gflops:.1f} GFLOP/s, {peak.describe()}")


if __name__ == "__main__":
  main()
