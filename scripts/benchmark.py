#!/usr/bin/env python3
r"""Speed of the engine on a GPU/TPU at the paper's shapes; the memory and speed of a T5X command.

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

`--mode t5x` measures the user's command instead, `python -m t5x.train --gin_file=gin/<file>.gin`
(needs the real T5X, hence TensorFlow and SeqIO; without them one error line): each experiment file
parsed as T5X's main parses it (the mT5 vocabulary, on gs://, replaced by a 250,112-piece
`seqio.PassThroughVocabulary`), its model, partitioner and `trainer.Trainer` built as
`t5x.train.train` builds them, T5X's own model and network (`gin/recipes/t5x_own_model.gin` after
the file) and ours (the files' default) with each `REMAT_POLICY`. Memory: XLA's analysis of the
whole training step (AdamW state included; compiled from abstract state and batch, never run) and
of its loss and gradient alone, at the file's batch, and the largest batch within 80 GiB (fit
from the file's batch and twice it, then found by compiling: `largest_batch`). Time: the step
with random weights and a synthetic full-length batch, on a CPU at mT5-small's shape and batch 2,
on an accelerator at the files' batches (30 steps; MFU, peak memory); the ratio ours / T5X's own.
Presets: `paper` = gin/mt5_base_mcd1_he.gin (batch 12) and gin/mt5_small_mcd1_he.gin (batch 24),
256/512 tokens; `tiny` = the latter with 1 + 1 tiny layers, memory at batch 4, 16/512 tokens,
time at batch 1, 16/128 (the test). Writes `--out`/benchmark_t5x.json and benchmark_t5x.md.

  python scripts/benchmark.py --preset paper --out $OUT   # a lent GPU (docs/benchmarks.md)
  python scripts/benchmark.py --mode t5x --preset paper --out runs/benchmark_t5x  # CPU: memory
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
  peak RSS (VmHWM of /proc/self/status, which `reset_peak_memory` resets; `ru_maxrss` elsewhere)."""
  try:
    stats = device.memory_stats()
  except Exception:  # why: backends without memory_stats raise various errors
    stats = None
  if stats and "peak_bytes_in_use" in stats:
    return stats["peak_bytes_in_use"] / 2**30, "device peak_bytes_in_use"
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        if line.startswith("VmHWM:"):
          return int(line.split()[1]) / 2**20, "process peak RSS"  # why: kB
  except OSError:
    pass
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "process peak RSS"


def reset_peak_memory(device: jax.Device) -> tuple[Optional[float], bool]:
  """Starts a row's peak: the process's peak RSS is reset to its current RSS (Linux: "5" written
  to /proc/self/clear_refs); a device's `peak_bytes_in_use` cannot be reset. Returns (the peak
  now, GiB; whether it was reset)."""
  peak, source = device_peak_memory_gib(device)
  if source == "process peak RSS":
    try:
      with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")
      return device_peak_memory_gib(device)[0], True
    except OSError:
      pass
  return peak, False


def row_peak_memory_gib(device: jax.Device, start: tuple[Optional[float],
                                                         bool]) -> tuple[Optional[float], str]:
  """(peak GiB of the row begun by `start = reset_peak_memory(device)`, source): None where the
  peak could not be reset and did not rise above an earlier row's (that row's figure, not this
  one's)."""
  peak, source = device_peak_memory_gib(device)
  before, was_reset = start
  if was_reset or before is None or peak is None or peak > before:
    return peak, source
  return None, f"{source}: not above the {before:.3g} GiB of an earlier row (it cannot be reset)"


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
  """Writes `out`/<stem>.json and <stem>.md whole (`writers.open_atomic`): benchmark.{json,md}
  (`markdown`), or benchmark_t5x.{json,md} (`t5x_markdown`) for `--mode t5x`'s results."""
  stem, to_markdown = (("benchmark_t5x", t5x_markdown) if results.get("mode") == "t5x" else
                       ("benchmark", markdown))
  texts = {f"{stem}.json": json.dumps(results, indent=1) + "\n", f"{stem}.md": to_markdown(results)}
  for name, text in texts.items():
    with writers.open_atomic(os.path.join(out, name)) as f:
      f.write(text)


# --- --mode t5x: the user's command, `python -m t5x.train --gin_file=gin/<experiment>.gin` -------

# T5X's own model and network, added after an experiment file (the files' default is the T5X model
# on our engine, `mcwq_t5x.t5x_bridge.models.EncoderDecoderModel`).
T5X_OWN_RECIPE = "gin/recipes/t5x_own_model.gin"
T5X_OWN, T5X_OURS = "t5x_own", "ours"
REMAT_POLICIES = ("none", "minimal", "full")
T5X_VOCAB_SIZE = 250112  # mT5's 250,100 pieces padded to a multiple of 128, as the files' network
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TINY_T5X = (("emb_dim", 32), ("num_heads", 2), ("head_dim", 16), ("mlp_dim", 64),
             ("num_encoder_layers", 1), ("num_decoder_layers", 1))


@dataclasses.dataclass(frozen=True)
class GinShape:
  """One experiment file as `python -m t5x.train --gin_file=<gin_file>` trains it; `batch` and
  `lengths` (inputs, targets) None: the file's BATCH_SIZE and TASK_FEATURE_LENGTHS; `network`:
  T5Config overrides (the vocabulary stays at 250,112 rows)."""
  name: str
  gin_file: str
  batch: Optional[int] = None
  lengths: Optional[tuple[int, int]] = None
  network: tuple[tuple[str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class T5xPreset:
  """`--mode t5x`'s work: the memory analysis of each of `shapes` (at the file's batch; with
  `memory_limit_gib`, also the largest batch within it), for ours with each of `remat_policies`
  (empty: the files' default policy alone); on a CPU the step time at `cpu_timed`, on an
  accelerator at each of `shapes`."""
  shapes: tuple[GinShape, ...]
  cpu_timed: GinShape
  memory_limit_gib: Optional[float]
  remat_policies: tuple[str, ...]


_MT5_SMALL = "gin/mt5_small_mcd1_he.gin"
T5X_PRESETS = {
    # The paper's recipe (docs/recipe.md): mT5-base batch 12, mT5-small batch 24, 256/512 tokens;
    # the CPU step time at mT5-small's shape, batch 2; the largest batch on an 80 GB GPU.
    "paper":
        T5xPreset(
            (GinShape("mt5_base", "gin/mt5_base_mcd1_he.gin"), GinShape("mt5_small", _MT5_SMALL)),
            GinShape("mt5_small", _MT5_SMALL, batch=2), 80.0, REMAT_POLICIES),
    # The test's: 1 + 1 tiny layers over the 250,112-piece output layer; memory at batch 4, 16/512
    # tokens (8 of the fused loss's 256-token chunks), the step time at batch 1, 16/128 tokens.
    "tiny":
        T5xPreset((GinShape("tiny", _MT5_SMALL, 4, (16, 512), _TINY_T5X),),
                  GinShape("tiny", _MT5_SMALL, 1, (16, 128), _TINY_T5X), None, ()),
}
T5X_DEFAULTS = {  # (cpu, accelerator): timed steps, warm-up steps, time budget s
    "cpu": dict(steps=3, warmup_steps=1, time_budget_s=1e9),
    "accelerator": dict(steps=30, warmup_steps=2, time_budget_s=420),
}


def t5x_unavailable() -> Optional[str]:
  """Why the real T5X's training step cannot be built in this Python (None: it can): its
  `t5x/models.py` imports seqio (line 38) and tensorflow (line 43) at its top, and
  `t5x/utils.py` (`TrainStateInitializer`) both too (lines 47, 54); the GPU image has neither."""
  try:
    import t5x.train  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    return f"{type(e).__name__}: {e}"
  return None


def _figures(compiled: Any) -> dict[str, float]:
  """XLA's memory analysis of a compiled program in GiB: arguments, outputs, temporaries, aliased
  (donated arguments reused as outputs) and total = arguments + outputs + temporaries - aliased."""
  m = compiled.memory_analysis()
  figures = {
      "arguments": m.argument_size_in_bytes,
      "outputs": m.output_size_in_bytes,
      "temporaries": m.temp_size_in_bytes,
      "aliased": m.alias_size_in_bytes
  }
  figures["total"] = (
      figures["arguments"] + figures["outputs"] + figures["temporaries"] - figures["aliased"])
  return {k: v / 2**30 for k, v in figures.items()}


@dataclasses.dataclass
class UserCommand:
  """What `t5x.train.train` gets from the parsed gin files: the model, partitioner and trainer
  class, the batch and lengths; `kind` (`T5X_OWN`/`T5X_OURS`) and `remat_policy` read from the
  model built, not from the request."""
  model: Any
  partitioner: Any
  trainer_cls: Any
  batch: int
  input_length: int
  target_length: int
  kind: str
  model_class: str
  network_class: str
  remat_policy: Optional[str]
  gin_files: list[str]
  gin_bindings: list[str]

  def input_shapes(self, rows: int) -> dict[str, tuple[int, int]]:
    """The unpacked batch of T5X's EncDecFeatureConverter (`pack = False` in the files)."""
    li, lt = self.input_length, self.target_length
    return {
        "encoder_input_tokens": (rows, li),
        "decoder_input_tokens": (rows, lt),
        "decoder_target_tokens": (rows, lt),
        "decoder_loss_weights": (rows, lt)
    }

  def initializer(self, rows: int) -> Any:
    """T5X's `utils.TrainStateInitializer` of `rows` rows, as `t5x.train.train` makes it (the
    state's shapes by `jax.eval_shape`: nothing allocated)."""
    from t5x import utils  # pylint: disable=g-import-not-at-top
    shapes = self.input_shapes(rows)
    return utils.TrainStateInitializer(
        optimizer_def=self.model.optimizer_def,
        init_fn=self.model.get_initial_variables,
        input_shapes=shapes,
        input_types={k: jnp.int32 for k in shapes},
        partitioner=self.partitioner)

  def trainer(self, initializer: Any, state: Any) -> Any:
    """`trainer_cls` (T5X's `trainer.Trainer` with the files' learning rate) as `t5x.train.train`
    makes it, without evaluations or summaries."""
    return self.trainer_cls(
        model=self.model,
        train_state=state,
        partitioner=self.partitioner,
        eval_names=[],
        summary_dir=None,
        train_state_axes=initializer.train_state_axes,
        rng=jax.random.PRNGKey(0))

  def abstract_batch(self, rows: int) -> dict[str, jax.ShapeDtypeStruct]:
    return {k: jax.ShapeDtypeStruct(v, jnp.int32) for k, v in self.input_shapes(rows).items()}


def _model_kind(model: Any) -> str:
  """`T5X_OWN` for T5X's `models.EncoderDecoderModel` over `t5x.examples.t5.network`, `T5X_OURS`
  for a model class of ours over `mcwq_t5x.engine.network`; ValueError for anything else."""
  cls, net = type(model), type(model.module)
  if cls.__module__ == "t5x.models" and net.__module__ == "t5x.examples.t5.network":
    return T5X_OWN
  if cls.__module__.startswith("mcwq_t5x.") and net.__module__ == "mcwq_t5x.engine.network":
    return T5X_OURS
  raise ValueError(f"the gin files built {cls.__module__}.{cls.__name__} over "
                   f"{net.__module__}.{net.__name__}: neither T5X's own model nor ours")


def parse_user_command(shape: GinShape,
                       kind: str,
                       remat_policy: Optional[str] = None,
                       batch: Optional[int] = None) -> UserCommand:
  """Parses `shape.gin_file` as `python -m t5x.train --gin_file=...` does (`__main__` is
  `t5x.train`), T5X's own model by `T5X_OWN_RECIPE` after it where that file exists, ours with
  `REMAT_POLICY = remat_policy`, the vocabulary a 250,112-piece `seqio.PassThroughVocabulary`
  (mT5's SentencePiece model is on gs://), and builds what `t5x.train.train` gets. The gin config
  stays parsed (the trainer class reads its bindings when called) until the next parse.

  Raises ValueError when the files build another model than `kind` (ours asked of a checkout
  whose files train T5X's own model, say) or `shape.network` did not reach the network;
  `gin_utils.GinConfigError` for a file or binding gin refuses (REMAT_POLICY unknown to the files).
  """
  import gin  # pylint: disable=g-import-not-at-top
  import seqio  # pylint: disable=g-import-not-at-top
  import t5x.train  # pylint: disable=g-import-not-at-top
  from mcwq_t5x import gin_utils  # pylint: disable=g-import-not-at-top
  files = [shape.gin_file]
  if kind == T5X_OWN and os.path.exists(os.path.join(_REPO, T5X_OWN_RECIPE)):
    files.append(T5X_OWN_RECIPE)
  bindings = ["MODEL_DIR = '/tmp/benchmark_t5x_unused'"]  # why: required, never written
  rows = batch or shape.batch
  if rows is not None:
    bindings.append(f"BATCH_SIZE = {rows}")
  if shape.lengths is not None:
    bindings.append(
        f"TASK_FEATURE_LENGTHS = {{'inputs': {shape.lengths[0]}, 'targets': {shape.lengths[1]}}}")
  if kind == T5X_OURS and remat_policy is not None:
    bindings.append(f"REMAT_POLICY = '{remat_policy}'")
  saved = sys.modules["__main__"]
  sys.modules["__main__"] = t5x.train  # why: the files `import __main__ as train_script`
  try:
    gin_utils.parse_gin(files, bindings, finalize=False)
    gin.bind_parameter("VOCABULARY/macro.value",
                       seqio.PassThroughVocabulary(T5X_VOCAB_SIZE, eos_id=1))
    for field, value in shape.network:
      bound = False
      for selector in ("t5x.examples.t5.network.T5Config", "mcwq_t5x.engine.network.T5Config"):
        try:
          gin.query_parameter(f"{selector}.{field}")
        except ValueError:
          continue  # why: this network's config is not configured by these files
        gin.bind_parameter(f"{selector}.{field}", value)
        bound = True
      if not bound:
        raise ValueError(f"{files}: no T5Config.{field} binding to override")
    model = gin.query_parameter("%MODEL").scoped_configurable_fn()
    partitioner = gin.query_parameter("train_script.train.partitioner").scoped_configurable_fn()
    trainer_cls = gin.query_parameter("train_script.train.trainer_cls").scoped_configurable_fn
    lengths = gin.query_parameter("%TASK_FEATURE_LENGTHS")
    rows = gin.query_parameter("%BATCH_SIZE")
  finally:
    sys.modules["__main__"] = saved
  built = _model_kind(model)
  if built != kind:
    raise ValueError(f"{' + '.join(files)} trains {type(model).__module__}."
                     f"{type(model).__name__}, not {kind}'s model")
  config = model.module.config
  wrong = {f: getattr(config, f, None) for f, v in shape.network if getattr(config, f, None) != v}
  if wrong or config.vocab_size != T5X_VOCAB_SIZE:
    raise ValueError(f"{files}: the network's config has {wrong or config.vocab_size}, "
                     f"not the overrides {dict(shape.network)} / {T5X_VOCAB_SIZE} rows")
  policy = getattr(config, "remat_policy", None)
  if kind == T5X_OURS and remat_policy is not None and policy != remat_policy:
    raise ValueError(f"REMAT_POLICY = '{remat_policy}' gave a network with {policy!r}")
  return UserCommand(model, partitioner, trainer_cls, int(rows), int(lengths["inputs"]),
                     int(lengths["targets"]), built, f"{type(model).__module__}."
                     f"{type(model).__name__}", f"{type(model.module).__module__}."
                     f"{type(model.module).__name__}", policy, files, bindings[1:])


# Compiles that are analysed, never run, skip LLVM's optimisation of the machine code: XLA assigns
# the buffers before it, so the analysis is the same (equal to the byte at the tiny preset,
# mT5-small 'full' and mT5-base T5X's own; docs/benchmarks.md), for half of XLA:CPU's compile time
# at the tiny preset.
ANALYSIS_COMPILER_OPTIONS = {"xla_backend_optimization_level": 0}


def compile_for_analysis(partitioned_fn: Any, *args: Any) -> Any:
  """`partitioned_fn` (T5X's `PjittedFnWithContext`) lowered for `args` (arrays or
  `jax.ShapeDtypeStruct`s) and compiled with `ANALYSIS_COMPILER_OPTIONS`, as T5X's
  `PjitPartitioner.compile` compiles it otherwise: for `memory_analysis()`, never to be run."""
  return partitioned_fn.lower(*args).compile(compiler_options=ANALYSIS_COMPILER_OPTIONS)


def step_memory(command: UserCommand, rows: int, loss_and_gradient: bool = False) -> dict[str, Any]:
  """XLA's memory analysis (`_figures`, GiB) of the user's command's whole training step at `rows`
  rows: T5X's `Trainer` train step (the model's `loss_fn` under `jax.value_and_grad`, the files'
  optimizer update, the donated state) partitioned by the files' partitioner and compiled from
  abstract state and batch, never run. `loss_and_gradient`: also that of the step's
  `jax.value_and_grad(model.loss_fn, has_aux=True)` alone (T5X's `accumulate_grads_microbatched`
  without microbatches), under "loss_and_gradient"."""
  init = command.initializer(rows)
  state = init.global_train_state_shape
  batch = command.abstract_batch(rows)
  trainer = command.trainer(init, state)
  try:
    t0 = time.perf_counter()
    step_fn = trainer._partitioned_train_step  # pylint: disable=protected-access
    compiled = compile_for_analysis(step_fn, state, batch)
    out: dict[str, Any] = {"step": _figures(compiled), "compile_s": time.perf_counter() - t0}
  finally:
    trainer.close()
  del compiled
  if loss_and_gradient:
    model = command.model

    def loss_and_grad(params, batch, rng):
      return jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch, rng)

    fn = command.partitioner.partition(
        loss_and_grad,
        in_axis_resources=(init.train_state_axes.params, command.partitioner.data_partition_spec,
                           None),
        out_axis_resources=None)
    out["loss_and_gradient"] = _figures(
        compile_for_analysis(fn, state.params, batch, jax.random.PRNGKey(0)))
  return out


def largest_batch(total_at: Any,
                  b1: int,
                  t1: float,
                  b2: int,
                  t2: float,
                  limit_gib: float,
                  tries: int = 5,
                  growth: int = 32,
                  tolerance: float = 0.02) -> dict[str, Any]:
  """The largest batch whose step fits `limit_gib` GiB, found by compiling (`total_at(batch)`,
  GiB): each try is the secant through the last two compiles (XLA's buffers grow about affinely
  with the batch, though not between the smallest batches), at most `growth` times the largest
  batch compiled yet and inside the bracket (the largest batch compiled within the limit, the
  smallest over it); a secant that lands on the bracket's lower end tries the batch above it.
  Stops when the bracket is at most `tolerance` of its upper end (or 1 row) wide, or after `tries`
  compiles. Returns the first line's fit, each try (predicted and compiled totals), `largest`
  (the largest compiled batch within the limit; None if none is) and `smallest_over` (the
  smallest compiled batch over it; None if none is)."""
  points = [(b1, t1), (b2, t2)]
  attempts = []

  def bracket() -> tuple[Optional[int], Optional[int]]:
    within = [b for b, t in points if t <= limit_gib]
    over = [b for b, t in points if t > limit_gib]
    return (max(within) if within else None), (min(over) if over else None)

  for _ in range(tries):
    low, high = bracket()
    if high is not None and high - (low or 0) <= max(1, tolerance * high):
      break  # why: the boundary is known to `tolerance` (or exactly: one row apart)
    (xa, ya), (xb, yb) = points[-2], points[-1]
    slope = (yb - ya) / (xb - xa)
    top = max(b for b, _ in points)
    predicted = int(xb + (limit_gib - yb) // slope) if slope > 0 else top * growth
    predicted = min(predicted, top * growth)  # why: a flat start predicts absurd batches
    if high is not None:
      predicted = min(predicted, high - 1)
    if low is not None and predicted <= low:
      predicted = low + 1  # why: the secant found no more room; the next row settles it
    if predicted < 1 or predicted in [b for b, _ in points]:
      break
    total = total_at(predicted)
    attempts.append({
        "batch": predicted,
        "predicted_total_gib": yb + slope * (predicted - xb),
        "compiled_total_gib": total
    })
    points.append((predicted, total))
  low, high = bracket()
  per_row = (t2 - t1) / (b2 - b1)
  return {
      "limit_gib": limit_gib,
      "fit_batches": [b1, b2],
      "per_row_gib": per_row,
      "fixed_gib": t1 - per_row * b1,
      "tries": attempts,
      "largest": low,
      "smallest_over": high
  }


def memory_row(shape: GinShape, kind: str, remat_policy: Optional[str],
               limit_gib: Optional[float]) -> dict[str, Any]:
  """The whole step's and the loss and gradient's memory at the file's batch, and with
  `limit_gib` the largest batch within it (`largest_batch`: fit from the file's batch and twice
  it, then bracketed by compiling); `remat_policy` None: the files' default."""
  command = parse_user_command(shape, kind, remat_policy)
  b = command.batch
  first = step_memory(command, b, loss_and_gradient=True)
  fit = None
  if limit_gib is not None:
    second = step_memory(command, 2 * b)
    fit = largest_batch(lambda rows: step_memory(command, rows)["step"]["total"], b,
                        first["step"]["total"], 2 * b, second["step"]["total"], limit_gib)
    fit["second_step"] = second["step"]
  return {
      "shape": shape.name,
      "gin_files": command.gin_files,
      "gin_bindings": command.gin_bindings,
      "model": command.kind,
      "model_class": command.model_class,
      "network_class": command.network_class,
      "remat_policy": command.remat_policy,
      "batch": b,
      "input_length": command.input_length,
      "target_length": command.target_length,
      "step": first["step"],
      "loss_and_gradient": first["loss_and_gradient"],
      "compile_s": first["compile_s"],
      "largest_batch": fit,
  }


def _process_cpu_s() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def timed_row(shape: GinShape, kind: str, steps: int, warmup_steps: int, peak_tflops: float,
              device: jax.Device) -> dict[str, Any]:
  """Times the user's command's step (the files' remat policy): T5X's `TrainStateInitializer.
  from_scratch` (random weights), its `Trainer` step compiled for a synthetic full-length batch,
  `warmup_steps` then `steps` timed steps; median wall and process CPU seconds a step, MFU, XLA's
  memory of the step and the row's peak (`row_peak_memory_gib`). Raises FloatingPointError on a
  non-finite metric."""
  command = parse_user_command(shape, kind)
  b, li, lt = command.batch, command.input_length, command.target_length
  peak_start = reset_peak_memory(device)
  init = command.initializer(b)
  t0 = time.perf_counter()
  state = init.from_scratch(jax.random.PRNGKey(0))
  init_s = time.perf_counter() - t0
  trainer = command.trainer(init, state)
  arrays = synthetic_batch(np.random.default_rng(0), T5X_VOCAB_SIZE, b, li, lt)
  sharding = jax.sharding.NamedSharding(command.partitioner.mesh,
                                        command.partitioner.data_partition_spec)
  batch = {k: jax.device_put(v.astype(np.int32), sharding) for k, v in arrays.items()}
  try:
    t0 = time.perf_counter()
    step_fn = trainer._partitioned_train_step  # pylint: disable=protected-access
    compiled = command.partitioner.compile(step_fn, state, batch)
    compile_s = time.perf_counter() - t0
    for _ in range(warmup_steps):
      state, metrics = compiled(state, batch)
    jax.block_until_ready(state)
    walls, cpus = [], []
    for _ in range(steps):
      t0, c0 = time.perf_counter(), _process_cpu_s()
      state, metrics = compiled(state, batch)
      jax.block_until_ready((state, metrics))
      walls.append(time.perf_counter() - t0)
      cpus.append(_process_cpu_s() - c0)
  finally:
    trainer.close()
  leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(metrics)]
  if not all(np.isfinite(x).all() for x in leaves if np.issubdtype(x.dtype, np.floating)):
    raise FloatingPointError(f"{kind} at {shape.name}: a non-finite training metric")
  step_s = float(np.median(walls))
  model_flops = flops_lib.train_step_flops(command.model.module.config, b, li, lt)
  peak_gib, peak_source = row_peak_memory_gib(device, peak_start)
  row = {
      "shape": shape.name,
      "gin_files": command.gin_files,
      "model": command.kind,
      "model_class": command.model_class,
      "remat_policy": command.remat_policy,
      "batch": b,
      "input_length": li,
      "target_length": lt,
      "init_s": init_s,
      "compile_s": compile_s,
      "warmup_steps": warmup_steps,
      "steps": steps,
      "step_s": step_s,
      "step_s_min": min(walls),
      "cpu_s_per_step": float(np.median(cpus)),
      "examples_per_s": b / step_s,
      "model_flops_per_step": model_flops,
      "mfu": model_flops / step_s / 1e12 / peak_tflops,
      "step_memory_gib": _figures(compiled),
      "peak_memory_gib": peak_gib,
      "peak_memory_source": peak_source,
  }
  del state, compiled, batch
  return row


def t5x_markdown(results: dict[str, Any]) -> str:
  """The T5X mode's results as Markdown: heading, memory table, step-time table, ratios, skipped."""
  d = results["device"]
  lines = [
      f"# scripts/benchmark.py --mode t5x --preset {results['preset']}", "",
      f"{d['count']} x {d['platform']} {d['device_kind']} ({results['cpu'] or 'n/a'}); "
      f"jax {results['versions']['jax']}; {_fmt(results['wall_s'], '.0f')} s", ""
  ]
  if results["memory"]:
    limit = results["memory_limit_gib"]
    fit_head = ("" if limit is None else f" GiB a row | largest batch within {limit:g} GiB: "
                "batches compiled (predicted total; compiled total GiB) |")
    lines += [
        "| step of | model | remat_policy | batch | total GiB | arguments | temporaries | outputs "
        "| aliased | loss and gradient temporaries GiB |" + fit_head,
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" +
        ("" if limit is None else " ---: | ---: |")
    ]
    for r in results["memory"]:
      s, fit = r["step"], r["largest_batch"]
      line = (f"| {r['shape']} | {r['model']} | {r['remat_policy'] or '-'} | {r['batch']} "
              f"| {s['total']:.2f} | {s['arguments']:.2f} | {s['temporaries']:.2f} "
              f"| {s['outputs']:.2f} | {s['aliased']:.2f} "
              f"| {r['loss_and_gradient']['temporaries']:.2f} |")
      if fit is not None:
        over = fit.get("smallest_over")
        line += f" {fit['per_row_gib']:.3f} | {fit['largest']}" + (
            f" ({over} over)" if over is not None else "") + ": " + ", ".join(
                f"{t['batch']} ({t['predicted_total_gib']:.2f}; {t['compiled_total_gib']:.2f})"
                for t in fit["tries"]) + " |"
      lines.append(line)
  if results["timed"]:
    lines += [
        "", "| timed step of | model | remat_policy | batch, input/target | steps | s/step "
        "(median) | CPU s/step | examples/s | MFU | step memory GiB | peak GiB |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    ]
    for r in results["timed"]:
      lines.append(f"| {r['shape']} | {r['model']} | {r['remat_policy'] or '-'} "
                   f"| {r['batch']}, {r['input_length']}/{r['target_length']} | {r['steps']} "
                   f"| {r['step_s']:.4g} | {r['cpu_s_per_step']:.4g} "
                   f"| {r['examples_per_s']:.4g} | {100 * r['mfu']:.2f}% "
                   f"| {r['step_memory_gib']['total']:.2f} | {_fmt(r['peak_memory_gib'])} |")
  for name, ratio in results["ratios"].items():
    lines.append(f"\nours / T5X's own, {name}: {ratio['step_s']:.3f} (s/step), "
                 f"{ratio['cpu_s_per_step']:.3f} (CPU s/step)")
  lines += [""] + [f"Skipped: {s}" for s in results["skipped"]]
  return "\n".join(lines).rstrip() + "\n"


def _cpu_model() -> Optional[str]:
  """`Model name` of /proc/cpuinfo (what `lscpu` prints), or None."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return None


def t5x_main(args: argparse.Namespace) -> dict[str, Any]:
  """`--mode t5x` (module docstring): memory rows, then timed rows, of each kind in `--models`."""
  unavailable_because = t5x_unavailable()
  if unavailable_because:
    print(
        f"ModuleNotFoundError: --mode t5x builds the real T5X's training step, and T5X imports "
        f"seqio and tensorflow (t5x/models.py lines 38 and 43; the GPU image has neither); "
        f"here import t5x.train failed ({unavailable_because}): install T5X "
        f"(bash scripts/install_t5x.sh) or run --mode engine",
        file=sys.stderr,
        flush=True)
    sys.exit(1)
  devices = jax.devices()
  device = devices[0]
  where = "cpu" if device.platform == "cpu" else "accelerator"
  for key, value in T5X_DEFAULTS[where].items():
    if getattr(args, key) is None:
      setattr(args, key, value)
  preset = T5X_PRESETS[args.preset]
  shapes, cpu_timed = preset.shapes, preset.cpu_timed
  if args.memory_limit_gib is None:
    args.memory_limit_gib = preset.memory_limit_gib
  if args.models:
    shapes = tuple(s for s in shapes if s.name in args.models.split(","))
  kinds = args.t5x_models.split(",")
  policies = (args.remat_policies.split(",") if args.remat_policies is not None else list(
      preset.remat_policies)) or [None]  # why None: no REMAT_POLICY binding, the files' default
  phases = (args.phases or ("memory,time" if where == "cpu" else "time")).split(",")
  if device.platform == "cpu":
    timed_shapes = (cpu_timed,)
  else:  # why: on an accelerator, the user's command at the files' batches
    timed_shapes = shapes
  os.makedirs(args.out, exist_ok=True)
  tflops, source = table_peak(device.device_kind)
  if args.peak_tflops:
    used, how = args.peak_tflops, "--peak_tflops"
  elif tflops:
    used, how = tflops, f"table: {source}"
  else:  # why float32 on a CPU: XLA:CPU emulates bfloat16 products, far below its float32 rate
    n, dtype = (512, jnp.float32) if where == "cpu" else (8192, jnp.bfloat16)
    used, how = measured_peak(device, dtype, n), f"measured {jnp.dtype(dtype).name} jnp.dot, n {n}"
  results: dict[str, Any] = {
      "mode": "t5x",
      "preset": args.preset,
      "device": {
          "platform": device.platform,
          "device_kind": device.device_kind,
          "count": len(devices)
      },
      "cpu": _cpu_model(),
      "versions": {
          "jax": jax.__version__,
          "python": platform_lib.python_version()
      },
      "peak": {
          "used_tflops": used,
          "used": how
      },
      "memory_limit_gib": args.memory_limit_gib,
      "memory": [],
      "timed": [],
      "ratios": {},
      "skipped": [],
      "wall_s": None,
      "complete": False,
  }

  def within_budget(what: str) -> bool:
    if time.perf_counter() - _START <= args.time_budget_s:
      return True
    results["skipped"].append(f"{what}: the {args.time_budget_s:.0f} s time budget was spent")
    _phase(f"skipped {what} (time budget)")
    return False

  def unavailable(what: str, error: Exception) -> None:
    results["skipped"].append(f"{what}: {type(error).__name__}: {error}")
    _phase(f"skipped {what}: {type(error).__name__}: {error}")

  # why own first: T5X's own files bind short selectors that become ambiguous once ours are
  # registered in the process (tests/unit/entry_points/t5x_gin_values.py).
  variants = [(k, None) for k in kinds if k == T5X_OWN] + [(k, p) for k in kinds if k == T5X_OURS
                                                           for p in policies]
  if "time" in phases:
    for shape in timed_shapes:
      for kind in kinds:
        what = f"{shape.name} {kind} timed step (batch {shape.batch or 'of the file'})"
        if not within_budget(what):
          continue
        _phase(f"{what}: random weights, compiling, {args.warmup_steps} warm-up and "
               f"{args.steps} timed steps")
        try:
          results["timed"].append(
              timed_row(shape, kind, args.steps, args.warmup_steps, used, device))
        except ValueError as e:
          unavailable(what, e)
        write_results(results, args.out)
      rows = {r["model"]: r for r in results["timed"] if r["shape"] == shape.name}
      if T5X_OWN in rows and T5X_OURS in rows:
        results["ratios"][f"{shape.name} batch {rows[T5X_OWN]['batch']}"] = {
            k: rows[T5X_OURS][k] / rows[T5X_OWN][k] for k in ("step_s", "cpu_s_per_step")
        }
  if "memory" in phases:
    for kind, policy in variants:
      for shape in shapes:
        what = f"{shape.name} {kind}" + (f" remat_policy {policy}" if policy else "") + " memory"
        if not within_budget(what):
          continue
        _phase(f"{what}: compiling the step and the loss and gradient at the file's batch" + (
            "" if args.memory_limit_gib is None else
            f"; the step at twice it and the largest batch within {args.memory_limit_gib:g} GiB"))
        try:
          results["memory"].append(memory_row(shape, kind, policy, args.memory_limit_gib))
        except ValueError as e:
          unavailable(what, e)
        write_results(results, args.out)
  results["wall_s"] = time.perf_counter() - _START
  results["complete"] = True
  write_results(results, args.out)
  print(t5x_markdown(results), flush=True)
  _phase(f"wrote {os.path.join(args.out, 'benchmark_t5x.json')} and benchmark_t5x.md")
  return results


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
  parser.add_argument(
      "--mode",
      default="engine",
      choices=("engine", "t5x"),
      help="engine: our engine's step and decoding; t5x: the user's `python -m t5x.train` step")
  parser.add_argument(
      "--t5x_models",
      default=f"{T5X_OWN},{T5X_OURS}",
      help=f"--mode t5x: any of {T5X_OWN} (T5X's own model and network), {T5X_OURS}")
  parser.add_argument(
      "--remat_policies",
      default=None,
      help="--mode t5x: the REMAT_POLICY values of ours' memory rows (default: the preset's, "
      "paper all three, tiny the files' default)")
  parser.add_argument(
      "--phases",
      default=None,
      help="--mode t5x: any of memory,time (default: both on a CPU, time on an accelerator)")
  parser.add_argument(
      "--memory_limit_gib",
      type=float,
      default=None,
      help="--mode t5x: the largest batch whose step's XLA buffers fit this (default: the "
      "preset's, paper 80; tiny none)")
  args = parser.parse_args(argv)
  if args.mode == "t5x":
    if args.preset not in T5X_PRESETS:
      parser.error(f"--mode t5x: --preset must be one of {sorted(T5X_PRESETS)}")
    if not set(args.t5x_models.split(",")) <= {T5X_OWN, T5X_OURS}:
      parser.error(f"--t5x_models: any of {T5X_OWN},{T5X_OURS}")
    if args.remat_policies and not set(args.remat_policies.split(",")) <= set(REMAT_POLICIES):
      parser.error(f"--remat_policies: any of {','.join(REMAT_POLICIES)}")
    if args.phases and not set(args.phases.split(",")) <= {"memory", "time"}:
      parser.error("--phases: any of memory,time")
    return t5x_main(args)
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
