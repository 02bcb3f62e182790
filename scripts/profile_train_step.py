#!/usr/bin/env python3
r"""Where a training step's time goes: a `jax.profiler` trace of our training steps, by kind of work.

Trains the network of `scripts/benchmark_vs_hf.py` (same flags) as its epoch does (`--host_devices`
XLA CPU devices, the training main's XLA flags and `malloc` options), prints the compile time,
runs `--warmup_steps`, traces `--steps` (`jax.profiler.ProfileData`) and shares the process's CPU
time among kinds of work (docs/benchmarks.md defines them), with model FLOP/s against the matmul
peak and the `--top` longest instructions of each kind; `--no-trace` only times the steps.
`--host_devices 1,2`: one report per count from one process (the largest count's devices; a
smaller count's mesh is the first of them).

  python scripts/profile_train_step.py --steps 5 --host_devices 1,2
  python scripts/profile_train_step.py --steps 20 --no-trace
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import resource
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

KINDS = ("matmuls", "gradient all-reduce", "attention elementwise", "layer norms",
         "MLP elementwise", "embedding and loss", "residual adds and dropout", "optimizer",
         "copies and transposes", "other")


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


def _cpu_seconds() -> float:
  """User + system CPU time of this process (all threads) so far."""
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def cpu_time_peak(n: int = 2048, repeats: int = 3) -> float:
  """The best GFLOP per CPU-second (user + system time of the process, all threads) of NumPy's
  float32 [n, n] x [n, n] product: the kernel's rate per core, which the other processes of a
  loaded machine do not lower as they lower its wall-clock rate."""
  import numpy as np
  x = np.random.default_rng(0).random((n, n), dtype=np.float32)
  best = float("inf")
  for _ in range(repeats):
    before = _cpu_seconds()
    np.matmul(x, x)
    best = min(best, _cpu_seconds() - before)
  return 2.0 * n**3 / max(best, 1e-6) / 1e9


def analyse(trace_file: str, hlo_text: str, timing: dict[str, float], steps: int, step_flops: float,
            peak_gflops: float, cpu_peak: float, cores: int, top: int) -> list[str]:
  """The report's lines (see the module docstring) from a trace, the compiled step's text and the
  traced window's `timing` ({"wall", "process_cpu", "host_cpu"} seconds)."""
  import jax
  instructions, computations = parse_hlo(hlo_text)
  data = jax.profiler.ProfileData.from_file(trace_file)
  spans: dict[str, float] = collections.Counter()
  per_op: dict[str, float] = collections.Counter()
  waits = 0.0
  for plane in data.planes:
    if plane.name != "/host:CPU":
      continue
    for line in plane.lines:
      if line.name == "python":
        continue
      for event in line.events:
        name = event.name
        if name == "Rendezvous" or name.startswith("Wait: pending"):
          waits += event.duration_ns / 1e9
        elif name in instructions:
          spans[kind_of(name, instructions, computations)] += event.duration_ns / 1e9
          per_op[name] += event.duration_ns / 1e9
  wall = timing["wall"]
  total = cores * wall
  device_cpu = max(timing["process_cpu"] - timing["host_cpu"], 0.0)
  in_spans = sum(spans.values())
  # The device threads' CPU time, shared among the kinds as their instructions' wall time.
  share = {k: device_cpu * v / in_spans for k, v in spans.items()}
  share["host (Python: batches, dispatch)"] = timing["host_cpu"]
  share["idle (no CPU time of this process)"] = max(total - timing["process_cpu"], 0.0)
  gflops = step_flops * steps / wall / 1e9
  lines = [
      f"{steps} traced steps: {wall:.2f} s wall ({wall / steps:.3f} s/step) on {cores} cores "
      f"({total:.2f} core-seconds); the process used {timing['process_cpu']:.2f} CPU-seconds",
      f"model FLOPs: {gflops:.1f} GFLOP/s ({step_flops / 1e9:.2f} GFLOP a step), "
      f"{100 * gflops / peak_gflops:.1f}% of the {peak_gflops:.1f} GFLOP/s matmul peak",
      "share of the cores' time (device threads' CPU time shared by their instructions' time):"
  ]
  for kind in sorted(share, key=lambda k: -share[k]):
    lines.append(
        f"  {kind:<36} {share[kind] / steps:7.3f} s/step  {100 * share[kind] / total:5.1f}%")
  matmul_rate = step_flops * steps / max(share.get("matmuls", 0.0), 1e-9) / 1e9
  step_rate = step_flops * steps / max(timing["process_cpu"], 1e-9) / 1e9
  lines.append(f"per CPU-second (NumPy's matmul: {cpu_peak:.1f} GFLOP per CPU-second): the "
               f"step {step_rate:.1f} ({100 * step_rate / cpu_peak:.1f}%), its matmul "
               f"instructions {matmul_rate:.1f} ({100 * matmul_rate / cpu_peak:.1f}%)")
  lines.append(f"rendezvous waits of the all-reduces: {waits / steps:.3f} s/step of wall time "
               "(one device waiting for the other; not counted above)")
  by_kind: dict[str, list[str]] = collections.defaultdict(list)
  for name, _ in per_op.most_common():
    by_kind[kind_of(name, instructions, computations)].append(name)
  lines.append(f"the {top} longest instructions of each kind (wall time):")
  for kind in sorted(by_kind, key=lambda k: -share[k]):
    lines.append(f"  {kind}:")
    for name in by_kind[kind][:top]:
      lines.append(f"    {per_op[name] / steps * 1e3:7.1f} ms/step  {name}: "
                   f"{instructions[name]['op_name'][-90:]}")
  return lines


def main(argv=None) -> None:
  import benchmark_vs_hf as bench  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(
      description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--task", default="mcwq_random_split_en")
  parser.add_argument("--split", default="validation")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--pack_input_length", type=int, default=40)
  parser.add_argument("--pack_target_length", type=int, default=72)
  bench.add_network_flags(parser)
  parser.add_argument(
      "--host_devices",
      type=_device_counts,
      default=[1],
      help="as the benchmark's epoch; comma-separated counts: one report each (e.g. 1,2)")
  parser.add_argument("--warmup_steps", type=int, default=3)
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--top", type=int, default=3, help="instructions listed per kind")
  parser.add_argument(
      "--trace_dir",
      default="",
      help="keep the traces here, one <N>_devices folder per report (default: temporary)")
  parser.add_argument(
      "--trace",
      action=argparse.BooleanOptionalAction,
      default=True,
      help="--no-trace: time the steps only (wall and CPU time), no profile")
  args = parser.parse_args(argv)

  from mcwq_t5x.engine import cpu_settings
  cpu_settings.set_host_device_count(max(args.host_devices))
  cpu_settings.set_xla_cpu_flags()
  cpu_settings.set_host_malloc_options()
  import jax

  if len(jax.devices()) < max(args.host_devices):  # why: XLA_FLAGS may already set fewer
    parser.error(f"--host_devices {max(args.host_devices)}: this process has "
                 f"{len(jax.devices())} devices (XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r})")
  from mcwq_t5x.data import pipeline

  cfg = bench._dataset_config(args, pack=True)  # pylint: disable=protected-access
  arrays = pipeline.load_feature_arrays(cfg)
  batches = pipeline.DeterministicBatches(arrays, args.batch_size, seed=0, shuffle=True)
  peaks: list[Any] = []  # why: (matmul peak, CPU-time peak), timed once for all the reports
  for count in args.host_devices:
    _report(args, bench, batches, jax.devices()[:count], peaks)


def _device_counts(text: str) -> list[int]:
  """`--host_devices`: "2" -> [2], "1,2" -> [1, 2] (each at least 1)."""
  try:
    counts = [int(c) for c in text.split(",")]
  except ValueError as e:
    raise argparse.ArgumentTypeError(f"{text!r}: comma-separated device counts, e.g. 1,2") from e
  if any(c < 1 for c in counts):
    raise argparse.ArgumentTypeError(f"{text!r}: each device count must be at least 1")
  return counts


def _report(args: argparse.Namespace, bench: Any, batches: Any, devices: list[Any],
            peaks: list[Any]) -> None:
  """Compiles, warms up and traces the step on a mesh of `devices` and prints its report (module
  docstring); `peaks` holds the matmul and CPU-time peaks once the first report timed them."""
  import glob

  import jax

  from mcwq_t5x.engine import flops
  from mcwq_t5x.engine import partitioning

  partitioner = partitioning.Partitioner(devices=devices)
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
  compile_wall, compile_cpu = time.perf_counter(), _cpu_seconds()
  compiled = trainer.compile_train_step(shardings, first).lower(state, first, trainer.dropout_rng,
                                                                guard).compile()
  compile_wall, compile_cpu = time.perf_counter() - compile_wall, _cpu_seconds() - compile_cpu
  trainer._train_step_fn = compiled  # pylint: disable=protected-access
  hlo_text = compiled.as_text()
  step_flops = flops.train_step_flops(
      bench._flop_config(args),  # pylint: disable=protected-access
      args.batch_size,
      args.pack_input_length,
      args.pack_target_length)

  def run(start: int, count: int) -> float:
    nonlocal state, guard
    pending = []
    host = 0.0
    cpu = _cpu_seconds()
    t = time.perf_counter()
    for step in range(start, start + count):
      h = time.thread_time()
      batch = partitioner.make_global_batch(batches.batch(step, rows), args.batch_size)
      state, metrics, guard = trainer.train_step_async(state, batch, guard)
      host += time.thread_time() - h
      pending.append(metrics)
      if len(pending) > 2:  # as the training main: at most 2 steps in flight
        jax.block_until_ready(pending.pop(0))
    jax.block_until_ready(pending)
    wall = time.perf_counter() - t
    return {"wall": wall, "process_cpu": _cpu_seconds() - cpu, "host_cpu": host}

  run(0, args.warmup_steps)
  print(f"{len(devices)} devices, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')}")
  print(f"compiling the step: {compile_wall:.1f} s wall, {compile_cpu:.1f} CPU-seconds")
  if not args.trace:
    timing = run(args.warmup_steps, args.steps)
    print(f"{args.steps} steps: {timing['wall'] / args.steps:.3f} s/step wall, "
          f"{timing['process_cpu'] / args.steps:.3f} CPU-seconds/step, "
          f"{step_flops * args.steps / timing['wall'] / 1e9:.1f} GFLOP/s, "
          f"{step_flops * args.steps / timing['process_cpu'] / 1e9:.1f} GFLOP per CPU-second")
    return
  with tempfile.TemporaryDirectory() as tmp:
    trace_dir = args.trace_dir or tmp
    trace_dir = os.path.join(trace_dir, f"{len(devices)}_devices")  # why: one trace per report
    jax.profiler.start_trace(trace_dir)
    timing = run(args.warmup_steps, args.steps)
    jax.profiler.stop_trace()
    trace = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))[-1]
    if not peaks:
      peaks.extend([flops.matmul_peak(), cpu_time_peak()])
    peak, cpu_peak = peaks
    print(f"matmul peak: {peak.gflops:.1f} GFLOP/s, {peak.describe()}")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    for line in analyse(trace, hlo_text, timing, args.steps, step_flops, peak.gflops, cpu_peak,
                        cores, args.top):
      print(line)


if __name__ == "__main__":
  main()
