#!/usr/bin/env python3
r"""Speed of the engine on a GPU/TPU at the paper's shapes: training MFU, decoding, a sharded step.

Needs only jax, flax, optax, orbax and numpy. For each model of `--preset`, after compilation and
warm-up, with random weights and full-length synthetic batches on one device: the train main's
step (`Trainer.compile_train_step`, AdamW, dropout 0.1, float32 params, `--dtype` activations) with
examples/s, tokens/s, MFU and XLA's FLOPs and memory; greedy and beam decoding
(`predict_batch_with_aux`) in questions/s and tokens/s; with 2+ devices, a data- and a
model-parallel step of the first model. MFU = `flops.train_step_flops` / step s / the dense bf16
peak of `PEAK_BF16_TFLOPS` (by `device_kind`), `--peak_tflops`, else the matmul peak measured here
(always reported). Presets: `paper` = mT5-small (batch 24) and mT5-base (batch 12), 256/512 tokens
(docs/recipe.md), vocabulary 250,112, bfloat16; `tiny` = 1 + 1 layers, 128 pieces (the CPU test).
Writes `--out`/benchmark.json and benchmark.md whole after every phase (`"complete": true` last).

  python scripts/benchmark.py --preset paper --out $OUT   # a lent GPU (docs/benchmarks.md)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform as platform_lib
import resource
import sys
import time
from typing import Any, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from mcwq_t5x.data import writers  # noqa: E402
from mcwq_t5x.engine import flops as flops_lib  # noqa: E402
from mcwq_t5x.engine import model as model_lib  # noqa: E402
from mcwq_t5x.engine import network  # noqa: E402
from mcwq_t5x.engine import partitioning  # noqa: E402
from mcwq_t5x.engine import trainer as trainer_lib  # noqa: E402

# Dense (no sparsity) bf16 peak of one chip: (device_kind substring, TFLOP/s, source). The first
# match of `device_kind` (case-insensitive) wins, so the variants come before their family.
PEAK_BF16_TFLOPS = (
    ("H200 NVL", 835.5, "NVIDIA H200 datasheet (2024), H200 NVL: 1,671 TFLOPS BF16 with sparsity"),
    ("H200", 989.5, "NVIDIA H200 datasheet (2024), H200 SXM: 1,979 TFLOPS BF16 with sparsity"),
    ("H100 PCIe", 756.5,
     "NVIDIA H100 datasheet (2023), H100 PCIe: 1,513 TFLOPS BF16 with sparsity"),
    ("H100", 989.5, "NVIDIA H100 datasheet (2023), H100 SXM: 1,979 TFLOPS BF16 with sparsity"),
    ("A100", 312.0, "NVIDIA A100 datasheet (2021): 312 TFLOPS BF16 dense"),
    ("TPU v4", 275.0, "Google Cloud TPU docs, TPU v4: 275 TFLOPS bf16 per chip"),
    ("TPU v5 lite", 197.0, "Google Cloud TPU docs, TPU v5e: 197 TFLOPS bf16 per chip"),
    ("TPU v5e", 197.0, "Google Cloud TPU docs, TPU v5e: 197 TFLOPS bf16 per chip"),
)


@dataclasses.dataclass(frozen=True)
class Shape:
  """One benchmarked model: a `network.CONFIGS` preset with overrides and its batch shape."""
  name: str
  preset: str
  overrides: tuple[tuple[str, Any], ...]
  batch: int
  input_length: int
  target_length: int


_TINY = (("vocab_size", 128), ("num_encoder_layers", 1), ("num_decoder_layers", 1))
PRESETS = {
    # The recipe card (docs/recipe.md): batch 24 mT5-small, 12 mT5-base; 256/512 tokens.
    "paper": (
        Shape("mt5_small", "mt5_small", (), 24, 256, 512),
        Shape("mt5_base", "mt5_base", (), 12, 256, 512),
    ),
    "tiny": (Shape("tiny", "tiny", _TINY, 4, 16, 16),),
}
DEFAULTS = {  # per preset: timed steps, warm-up steps, timed decode batches, matmul n, budget s
    "paper": dict(steps=20, warmup_steps=2, decode_batches=2, matmul_n=8192, time_budget_s=360),
    "tiny": dict(steps=2, warmup_steps=1, decode_batches=1, matmul_n=256, time_budget_s=900),
}
_START = time.perf_counter()


def _phase(text: str) -> None:
  """Prints a progress line with the seconds since the process started."""
  print(f"[{time.perf_counter() - _START:7.1f}s] {text}", flush=True)


def table_peak(device_kind: str) -> tuple[Optional[float], Optional[str]]:
  """(dense bf16 TFLOP/s, source) of `PEAK_BF16_TFLOPS`'s first entry in `device_kind`, or
  (None, None)."""
  for key, tflops, source in PEAK_BF16_TFLOPS:
    if key.lower() in device_kind.lower():
      return tflops, source
  return None, None


def measured_peak(device: jax.Device, dtype: Any, n: int) -> float:
  """TFLOP/s of the best of 5 [n, n] x [n, n] `jnp.dot`s in `dtype` on `device`, after one
  compiling call (`flops.time_matmul`: 2 n^3 FLOPs a product)."""
  with jax.default_device(device):  # why: drawn on the device, no host copy of n^2 numbers
    x, y = jax.random.normal(jax.random.PRNGKey(0), (2, n, n), dtype)
  dot = jax.jit(jnp.dot).lower(x, y).compile()
  matmul = lambda: dot(x, y).block_until_ready()
  matmul()
  return flops_lib.time_matmul(matmul, n, repeats=5) / 1e3


def synthetic_batch(rng: np.random.Generator, vocab: int, batch: int, in_len: int,
                    tgt_len: int) -> dict[str, np.ndarray]:
  """Random full-length int32 batch in `EncDecFeatureConverter` layout (EOS, id 1, last;
  decoder inputs = targets shifted right after BOS 0), loss weights all 1 (float32)."""
  enc = rng.integers(2, vocab, (batch, in_len), dtype=np.int32)
  tgt = rng.integers(2, vocab, (batch, tgt_len), dtype=np.int32)
  enc[:, -1] = 1
  tgt[:, -1] = 1
  dec = np.concatenate([np.zeros((batch, 1), np.int32), tgt[:, :-1]], 1)
  return {
      "encoder_input_tokens": enc,
      "decoder_input_tokens": dec,
      "decoder_target_tokens": tgt,
      "decoder_loss_weights": np.ones((batch, tgt_len), np.float32)
  }


def _cost_flops(compiled: Any) -> Optional[float]:
  """XLA's FLOP count of a compiled program, or None where the backend gives none."""
  try:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"]) if cost and "flops" in cost else None
  except Exception:  # why: cost analysis is optional per backend and JAX version
    return None


def _memory_gib(compiled: Any) -> Optional[float]:
  """Arguments + outputs + temporaries - aliased (donated) bytes of a compiled program, in GiB."""
  try:
    m = compiled.memory_analysis()
    total = (
        m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes -
        m.alias_size_in_bytes)
    return total / 2**30
  except Exception:  # why: memory analysis is optional per backend
    return None


def train_row(shape: Shape, cfg: network.T5Config, partitioner: partitioning.Partitioner,
              steps: int, warmup_steps: int, peak_tflops: float,
              measured_tflops: float) -> tuple[dict[str, Any], Any, Any]:
  """Times the train main's step (`Trainer.compile_train_step`) of `cfg` on `partitioner`'s mesh.

  Returns (the row's figures, the model, the final params). Raises `NonFiniteLossError` if a step
  was not finite (`Trainer.check_finite`).
  """
  model = model_lib.EncoderDecoderModel(network.Transformer(cfg))
  lr = trainer_lib.create_learning_rate_schedule(5e-4, "linear", decay_steps=50000)
  trainer = trainer_lib.Trainer(
      model, partitioner, lr, optimizer=trainer_lib.make_optimizer(lr, "adamw", grad_clip_norm=1.0))
  b, li, lt = shape.batch, shape.input_length, shape.target_length
  t0 = time.perf_counter()
  state = trainer.create_state({"encoder_input_tokens": (b, li), "decoder_input_tokens": (b, lt)})
  init_s = time.perf_counter() - t0  # why: on an H200, mT5-small's phase less its compile was 66 s
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(state.params))
  batch = partitioner.make_global_batch(
      synthetic_batch(np.random.default_rng(0), cfg.vocab_size, b, li, lt))
  rng = jax.device_put(trainer.dropout_rng, partitioner.replicated)
  guard = trainer.initial_guard()
  shardings = jax.tree_util.tree_map(lambda x: x.sharding, state)
  t0 = time.perf_counter()
  compiled = trainer.compile_train_step(shardings, batch).lower(state, batch, rng, guard).compile()
  compile_s = time.perf_counter() - t0
  for _ in range(warmup_steps):
    state, _, guard = compiled(state, batch, rng, guard)
  jax.block_until_ready(state)
  t0 = time.perf_counter()
  for _ in range(steps):
    state, _, guard = compiled(state, batch, rng, guard)
  jax.block_until_ready(state)
  step_s = (time.perf_counter() - t0) / steps
  trainer.check_finite(guard, state)
  model_flops = flops_lib.train_step_flops(cfg, b, li, lt)
  achieved = model_flops / step_s / 1e12
  mesh = {k: int(v) for k, v in partitioner.mesh.shape.items()}
  row = {
      "model": shape.name,
      "params": n_params,
      "devices": int(partitioner.mesh.size),
      "mesh": dict(mesh),
      "batch": b,
      "input_length": li,
      "target_length": lt,
      "init_s": init_s,
      "compile_s": compile_s,
      "warmup_steps": warmup_steps,
      "steps": steps,
      "step_s": step_s,
      "examples_per_s": b / step_s,
      "target_tokens_per_s": b * lt / step_s,
      "model_flops_per_step": model_flops,
      "xla_flops_per_step": _cost_flops(compiled),
      "model_tflops_per_s": achieved,
      "mfu": achieved / (peak_tflops * int(partitioner.mesh.size)),
      "mfu_of_measured_peak": achieved / (measured_tflops * int(partitioner.mesh.size)),
      "step_memory_gib": _memory_gib(compiled),
  }
  return row, model, state.params


def decoded_lengths(tokens: np.ndarray) -> np.ndarray:
  """Tokens of each row [B, L] up to and including its first EOS (id 1), or L without one."""
  eos = tokens == 1
  return np.where(eos.any(1), eos.argmax(1) + 1, tokens.shape[1])


def decode_row(shape: Shape, model: Any, params: Any, vocab: int, method: str, beam: int,
               alpha: float, batches: int) -> dict[str, Any]:
  """Times `predict_batch_with_aux` (greedy, or beam search with `beam` beams and `alpha`) on a
  synthetic batch of `shape`, up to `shape.target_length` tokens; first call = compile + run."""
  b, li, lt = shape.batch, shape.input_length, shape.target_length
  arrays = synthetic_batch(np.random.default_rng(1), vocab, b, li, lt)
  batch = {"encoder_input_tokens": jnp.asarray(arrays["encoder_input_tokens"])}
  n = beam if method == "beam_search" else 1

  def run():
    return model.predict_batch_with_aux(
        params,
        batch,
        num_decodes=n,
        method=method,
        decoder_params={"alpha": alpha} if method == "beam_search" else None,
        max_decode_length=lt)[0]

  t0 = time.perf_counter()
  tokens = np.asarray(jax.block_until_ready(run()))
  first_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  for _ in range(batches):
    out = run()
  jax.block_until_ready(out)
  batch_s = (time.perf_counter() - t0) / batches
  decoded = int(decoded_lengths(tokens).sum())
  return {
      "model": shape.name,
      "method": "greedy" if n == 1 else f"beam{n}",
      "beams": n,
      "alpha": alpha if n > 1 else None,
      "batch": b,
      "input_length": li,
      "decode_length": lt,
      "first_call_s": first_s,
      "batches": batches,
      "batch_s": batch_s,
      "decoded_tokens": decoded,
      "questions_per_s": b / batch_s,
      "tokens_per_s": decoded / batch_s,
  }


def device_peak_memory_gib(device: jax.Device) -> tuple[Optional[float], str]:
  """(peak GiB, source): the device's `peak_bytes_in_use` where it has one, else the process's
  peak RSS."""
  try:
    stats = device.memory_stats()
  except Exception:  # why: backends without memory_stats raise various errors
    stats = None
  if stats and "peak_bytes_in_use" in stats:
    return stats["peak_bytes_in_use"] / 2**30, "device peak_bytes_in_use"
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "process peak RSS"


def _fmt(x: Optional[float], spec: str = ".3g") -> str:
  return "n/a" if x is None else format(x, spec)


def markdown(results: dict[str, Any]) -> str:
  """The results as Markdown: a heading line, a training table, a decoding table, skipped."""
  d, p = results["device"], results["peak"]
  lines = [
      f"# scripts/benchmark.py --preset {results['preset']}", "",
      f"{d['count']} x {d['platform']} {d['device_kind']}; {results['dtype']} activations; "
      f"peak {_fmt(p['used_tflops'], '.4g')} TFLOP/s ({p['used']}); measured {p['dtype']} "
      f"matmul {_fmt(p['measured_tflops'], '.4g')} TFLOP/s (n {p['measured_n']}); "
      f"jax {results['versions']['jax']}; {_fmt(results['wall_s'], '.0f')} s", "",
      "| training step | devices (data x model) | batch, input/target | step s | examples/s "
      "| model TFLOP/s | MFU | MFU of measured | compile s | step memory GiB | state init s |",
      "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  ]
  for r in results["train"]:
    lines.append(f"| {r['model']} | {r['devices']} ({r['mesh']['data']} x {r['mesh']['model']}) "
                 f"| {r['batch']}, {r['input_length']}/{r['target_length']} | {r['step_s']:.4g} "
                 f"| {r['examples_per_s']:.4g} | {r['model_tflops_per_s']:.4g} "
                 f"| {100 * r['mfu']:.1f}% | {100 * r['mfu_of_measured_peak']:.1f}% "
                 f"| {r['compile_s']:.1f} | {_fmt(r['step_memory_gib'])} | {r['init_s']:.1f} |")
  lines += [
      "", "| decoding | method | batch, input/decode length | batch s | questions/s | tokens/s "
      "| first call s |", "| --- | --- | --- | ---: | ---: | ---: | ---: |"
  ]
  for r in results["decode"]:
    lines.append(f"| {r['model']} | {r['method']} | {r['batch']}, {r['input_length']}/"
                 f"{r['decode_length']} | {r['batch_s']:.4g} | {r['questions_per_s']:.4g} "
                 f"| {r['tokens_per_s']:.4g} | {r['first_call_s']:.1f} |")
  if results["peak_memory_gib"] is not None:
    lines += [
        "", f"Peak memory: {results['peak_memory_gib']:.3g} GiB "
        f"({results['peak_memory_source']})."
    ]
  lines += [""] + [f"Skipped: {s}" for s in results["skipped"]]
  return "\n".join(lines).rstrip() + "\n"


def write_results(results: dict[str, Any], out: str) -> None:
  """Writes `out`/benchmark.json and `out`/benchmark.md whole (`writers.open_atomic`)."""
  texts = {
      "benchmark.json": json.dumps(results, indent=1) + "\n",
      "benchmark.md": markdown(results)
  }
  for name, text in texts.items():
    with writers.open_atomic(os.path.join(out, name)) as f:
      f.write(text)


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
  """Command line (module docstring); returns the results written to `--out`."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--preset", default="paper", choices=sorted(PRESETS))
  parser.add_argument("--out", required=True, help="folder for benchmark.json and benchmark.md")
  parser.add_argument("--models", default="", help="comma-separated subset of the preset's models")
  parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  parser.add_argument(
      "--remat_policy",
      default="none",
      choices=("none", "minimal", "full"),
      help="T5Config.remat_policy of the trained networks")
  parser.add_argument("--steps", type=int, default=None, help="timed training steps")
  parser.add_argument(
      "--warmup_steps", type=int, default=None, help="untimed steps after compiling")
  parser.add_argument("--decode_batches", type=int, default=None, help="timed decoding batches")
  parser.add_argument("--beam", type=int, default=4)
  parser.add_argument("--alpha", type=float, default=0.6, help="beam search length penalty")
  parser.add_argument("--peak_tflops", type=float, default=None, help="override the peak")
  parser.add_argument("--matmul_n", type=int, default=None, help="size of the measured matmul")
  parser.add_argument("--time_budget_s", type=float, default=None, help="no phase starts later")
  parser.add_argument("--skip_decode", action="store_true")
  args = parser.parse_args(argv)
  defaults = DEFAULTS[args.preset]
  for key, value in defaults.items():
    if getattr(args, key) is None:
      setattr(args, key, value)
  shapes = PRESETS[args.preset]
  if args.models:
    wanted = args.models.split(",")
    unknown = sorted(set(wanted) - {s.name for s in shapes})
    if unknown:
      parser.error(f"--models: {unknown} not in preset {args.preset!r} "
                   f"({[s.name for s in shapes]})")
    shapes = tuple(s for s in shapes if s.name in wanted)
  if args.steps < 1 or args.decode_batches < 1 or args.warmup_steps < 0:
    parser.error("--steps and --decode_batches must be >= 1, --warmup_steps >= 0")
  os.makedirs(args.out, exist_ok=True)

  devices = jax.devices()
  device = devices[0]
  dtype = jnp.dtype(args.dtype)
  _phase(f"{len(devices)} x {device.platform} {device.device_kind}; measuring the {args.dtype} "
         f"matmul peak (n {args.matmul_n})")
  measured = measured_peak(device, dtype, args.matmul_n)
  tflops, source = table_peak(device.device_kind)
  if args.peak_tflops:
    used, how = args.peak_tflops, "--peak_tflops"
  elif tflops and args.dtype == "bfloat16":
    used, how = tflops, f"table: {source}"
  else:
    used, how = measured, f"measured {args.dtype} jnp.dot, n {args.matmul_n}"
  results: dict[str, Any] = {
      "preset": args.preset,
      "dtype": args.dtype,
      "device": {
          "platform": device.platform,
          "device_kind": device.device_kind,
          "count": len(devices)
      },
      "versions": {
          "jax": jax.__version__,
          "python": platform_lib.python_version()
      },
      "peak": {
          "used_tflops": used,
          "used": how,
          "table_tflops": tflops,
          "table_source": source,
          "measured_tflops": measured,
          "measured_n": args.matmul_n,
          "dtype": args.dtype
      },
      "train": [],
      "decode": [],
      "skipped": [],
      "peak_memory_gib": None,
      "peak_memory_source": None,
      "wall_s": None,
      "complete": False,
  }
  if device.platform == "cpu" and args.preset == "paper":
    print("NOTE: the paper preset on a CPU takes hours; --preset tiny is the CPU check", flush=True)

  def within_budget(what: str) -> bool:
    if time.perf_counter() - _START <= args.time_budget_s:
      return True
    results["skipped"].append(f"{what}: the {args.time_budget_s:.0f} s time budget was spent")
    _phase(f"skipped {what} (time budget)")
    return False

  one_device = partitioning.Partitioner(devices=devices[:1])
  methods = [] if args.skip_decode else [("greedy", 1)] + ([("beam_search",
                                                             args.beam)] if args.beam > 1 else [])
  # why each model whole (training, then its decoders) before the next: a lease cut short still
  # gives one model's complete figures.
  for shape in shapes:
    cfg = network.get_config(
        shape.preset, dtype=args.dtype, remat_policy=args.remat_policy, **dict(shape.overrides))
    if not within_budget(f"{shape.name} training step"):
      continue
    _phase(f"{shape.name}: creating the state, compiling and timing the training step "
           f"({args.warmup_steps} warm-up, {args.steps} timed; batch {shape.batch}, "
           f"{shape.input_length}/{shape.target_length})")
    row, model, params = train_row(shape, cfg, one_device, args.steps, args.warmup_steps, used,
                                   measured)
    results["train"].append(row)
    write_results(results, args.out)
    for method, n in methods:
      if not within_budget(f"{shape.name} {method} decoding"):
        continue
      _phase(f"{shape.name}: {method}" + (f" ({n} beams)" if n > 1 else "") +
             f" decoding {shape.target_length} tokens, compiling then timing "
             f"{args.decode_batches} batch(es)")
      results["decode"].append(
          decode_row(shape, model, params, cfg.vocab_size, method, n, args.alpha,
                     args.decode_batches))
      write_results(results, args.out)
    del model, params  # why: frees the model's parameters before the next one is created
  if len(devices) < 2:
    results["skipped"].append(f"2-device sharded step: {len(devices)} device")
    _phase("skipped the 2-device sharded step (1 device)")
  else:
    shape = shapes[0]
    cfg = network.get_config(
        shape.preset, dtype=args.dtype, remat_policy=args.remat_policy, **dict(shape.overrides))
    for num_partitions, kind in ((1, "data parallel"), (2, "model parallel")):
      if not within_budget(f"{shape.name} 2-device {kind} step"):
        continue
      _phase(f"{shape.name}: the training step on 2 devices, {kind}")
      row = train_row(shape, cfg, partitioning.Partitioner(num_partitions, devices=devices[:2]),
                      args.steps, args.warmup_steps, used, measured)[0]
      results["train"].append(row)
      write_results(results, args.out)
  results["peak_memory_gib"], results["peak_memory_source"] = device_peak_memory_gib(device)
  results["wall_s"] = time.perf_counter() - _START
  # why: the GPU image has none of them; the run must not have needed one.
  results["imported"] = sorted(m for m in ("tensorflow", "seqio", "torch") if m in sys.modules)
  results["complete"] = True
  write_results(results, args.out)
  print(markdown(results), flush=True)
  _phase(f"wrote {os.path.join(args.out, 'benchmark.json')} and benchmark.md")
  return results


if __name__ == "__main__":
  main()
