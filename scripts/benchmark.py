#!/usr/bin/env python3
r"""Speed benchmark of the T5/mT5 network on a GPU/TPU: a training step and decoding.

  python scripts/benchmark.py --model tiny --dtype float32 --batch_size 16
  python scripts/benchmark.py --model mt5_small --dtype bfloat16 \
      --batch_size 64 --input_length 64 --target_length 128 --beam 4

Times, after compilation on one device, an Adafactor training step (optax, as T5X fine-tuning)
and greedy / beam-search decoding of `network.Transformer` at a preset size with random params on
synthetic batches. Prints examples/s, target tokens/s, step and compile time, peak memory and,
on a GPU/TPU, model FLOPs utilisation (`model_flops` / step time / `--peak_tflops`, default from
the device kind: H100/H200 989, A100 312, V100 125 dense bf16 TFLOP/s). On a CPU it says so
first (`scripts/benchmark_vs_hf.py` is the CPU comparison). No TensorFlow or SeqIO.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from mcwq_t5x.engine import model as model_lib  # noqa: E402
from mcwq_t5x.engine import network  # noqa: E402

# Dense bf16 peak FLOP/s per chip (vendor data sheets).
_PEAK_TFLOPS = {
    "H200": 989.4,
    "H100": 989.4,
    "A100": 312.0,
    "V100": 125.0,
    "L4": 121.0,
    "A10": 125.0,
    "TPU v4": 275.0,
    "TPU v5": 197.0
}


def model_flops(cfg: network.T5Config, batch: int, in_len: int, tgt_len: int) -> dict[str, float]:
  """Analytic FLOPs (2 per multiply-add) of the forward pass of one batch.

  Counts every matmul: Q/K/V/O projections, attention scores and weighted
  sums (full square, no causal halving), the MLP (one `wi` per activation)
  and the output layer; embeddings lookups, norms and softmax are ignored.
  Training = 3 x forward (backward = 2 x forward), as in Kaplan et al. 2020.

  Returns:
    {"forward": F, "train_step": 3F} in FLOPs per batch.
  """
  d, j, f, v = cfg.emb_dim, cfg.num_heads * cfg.head_dim, cfg.mlp_dim, \
      cfg.vocab_size
  n_wi = len(cfg.mlp_activations)
  mlp = 2 * (n_wi * d * f + f * d)
  enc_tok = cfg.num_encoder_layers * (2 * 4 * d * j + 2 * 2 * in_len * j + mlp)
  dec_tok = cfg.num_decoder_layers * (
      2 * 4 * d * j + 2 * 2 * tgt_len * j  # self-attention
      + 2 * 2 * d * j + 2 * 2 * in_len * j  # cross-attention q, o, scores
      + mlp) + 2 * d * v
  cross_kv = cfg.num_decoder_layers * 2 * 2 * d * j * in_len  # per example
  fwd = batch * (in_len * enc_tok + tgt_len * dec_tok + cross_kv)
  return {"forward": float(fwd), "train_step": 3.0 * fwd}


def peak_memory() -> tuple[Optional[float], str]:
  """(peak bytes, source): device memory_stats or the process's peak RSS."""
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # Backends without memory_stats raise various errors.
    stats = None
  if stats and "peak_bytes_in_use" in stats:
    return float(stats["peak_bytes_in_use"]), "device peak_bytes_in_use"
  rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  return float(rss_kb) * 1024.0, "process peak RSS (host)"


def _time(fn: Callable[[], Any], steps: int) -> tuple[float, float]:
  """(first call seconds incl. compile, mean seconds of `steps` more calls)."""
  t0 = time.perf_counter()
  jax.block_until_ready(fn())
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  for _ in range(steps):
    out = fn()
  jax.block_until_ready(out)
  return first, (time.perf_counter() - t0) / steps


def synthetic_batch(rng: np.random.Generator, vocab: int, batch: int, in_len: int,
                    tgt_len: int) -> dict[str, jax.Array]:
  """Random full-length batch in EncDecFeatureConverter layout (EOS last)."""
  enc = rng.integers(2, vocab, (batch, in_len), dtype=np.int32)
  tgt = rng.integers(2, vocab, (batch, tgt_len), dtype=np.int32)
  enc[:, -1] = 1
  tgt[:, -1] = 1
  dec = np.concatenate([np.zeros((batch, 1), np.int32), tgt[:, :-1]], 1)
  return {
      "encoder_input_tokens": jnp.asarray(enc),
      "decoder_input_tokens": jnp.asarray(dec),
      "decoder_target_tokens": jnp.asarray(tgt),
      "decoder_loss_weights": jnp.ones((batch, tgt_len), jnp.float32)
  }


def _phase(text: str) -> None:
  """Prints a progress line (with the time since the process started) at once."""
  print(f"[{time.perf_counter() - _START:7.1f}s] {text}", flush=True)


_START = time.perf_counter()


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
  """Command line (module docstring): prints the timings and returns them as a dict."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="tiny", choices=sorted(network.CONFIGS))
  parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  parser.add_argument("--batch_size", type=int, default=16)
  parser.add_argument("--input_length", type=int, default=64)
  parser.add_argument("--target_length", type=int, default=128)
  parser.add_argument(
      "--decode_length", type=int, default=None, help="decode length (default: --target_length)")
  parser.add_argument(
      "--beam", type=int, default=4, help="beam size for the beam-search timing (0: skip)")
  parser.add_argument("--alpha", type=float, default=0.6)
  parser.add_argument("--vocab_size", type=int, default=None)
  parser.add_argument(
      "--steps", type=int, default=5, help="timed iterations after the compiling one")
  parser.add_argument("--skip_decode", action="store_true")
  parser.add_argument(
      "--peak_tflops",
      type=float,
      default=None,
      help="peak FLOP/s of one device in TFLOP/s for MFU")
  parser.add_argument("--json", default=None, help="also write results here")
  args = parser.parse_args(argv)

  overrides = {"dtype": args.dtype}
  if args.vocab_size:
    overrides["vocab_size"] = args.vocab_size
  cfg = network.get_config(args.model, **overrides)
  model = model_lib.EncoderDecoderModel(network.Transformer(cfg))
  device = jax.devices()[0]
  print(
      f"device: {device.platform} {device.device_kind} "
      f"(timing uses 1 of {jax.device_count()} devices)",
      flush=True)
  if device.platform == "cpu":
    print(
        "NOTE: this is a GPU/TPU benchmark; on a CPU each phase can take minutes (use a small "
        "--model/--batch_size/--target_length, or scripts/benchmark_vs_hf.py to compare with "
        "transformers on a CPU)",
        flush=True)
  shapes = {
      "encoder_input_tokens": (1, args.input_length),
      "decoder_input_tokens": (1, args.target_length)
  }
  params = jax.jit(lambda r: nn.unbox(model.get_initial_variables(r, shapes)["params"]))(
      jax.random.PRNGKey(0))
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
  print(f"model: {args.model} {cfg}\nparameters: {n_params:,}")

  batch = synthetic_batch(
      np.random.default_rng(0), cfg.vocab_size, args.batch_size, args.input_length,
      args.target_length)
  optimizer = optax.adafactor(1e-3)
  opt_state = optimizer.init(params)

  def train_step(p, s, b, rng):
    (loss, _), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(p, b, rng)
    updates, s = optimizer.update(grads, s, p)
    return optax.apply_updates(p, updates), s, loss

  step = jax.jit(train_step, donate_argnums=(0, 1))
  _phase("compiling the training step")
  t0 = time.perf_counter()
  compiled = step.lower(params, opt_state, batch, jax.random.PRNGKey(1)).compile()
  compile_s = time.perf_counter() - t0
  xla_flops = None
  try:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    xla_flops = float(cost.get("flops")) if cost else None
  except Exception:  # cost analysis is optional per backend.
    xla_flops = None
  state = {"p": params, "s": opt_state, "i": 0}

  def run_step():
    state["i"] += 1
    state["p"], state["s"], loss = compiled(state["p"], state["s"], batch,
                                            jax.random.PRNGKey(state["i"]))
    return loss

  _phase(f"timing {args.steps} training steps (compiled in {compile_s:.1f}s)")
  _, step_s = _time(run_step, args.steps)
  flops = model_flops(cfg, args.batch_size, args.input_length, args.target_length)
  results: dict[str, Any] = {
      "model": args.model,
      "dtype": args.dtype,
      "params": n_params,
      "device": f"{device.platform}:{device.device_kind}",
      "batch_size": args.batch_size,
      "input_length": args.input_length,
      "target_length": args.target_length,
      "train_compile_s": compile_s,
      "train_step_s": step_s,
      "train_examples_per_s": args.batch_size / step_s,
      "train_target_tokens_per_s": args.batch_size * args.target_length / step_s,
      "model_tflops_per_step": flops["train_step"] / 1e12,
      "xla_tflops_per_step": None if xla_flops is None else xla_flops / 1e12,
      "achieved_tflops_per_s": flops["train_step"] / step_s / 1e12,
  }
  peak = args.peak_tflops
  if peak is None and device.platform in ("gpu", "tpu"):
    peak = next((v for k, v in _PEAK_TFLOPS.items() if k.lower() in device.device_kind.lower()),
                None)
  if peak and device.platform in ("gpu", "tpu") or args.peak_tflops:
    results["peak_tflops"] = peak
    results["mfu"] = flops["train_step"] / step_s / (peak * 1e12)

  decode_len = args.decode_length or args.target_length
  if not args.skip_decode:
    params = state["p"]
    modes = [("greedy", 1)] + ([("beam", args.beam)] if args.beam else [])
    for name, n in modes:
      fn = lambda n=n: model.predict_batch_with_aux(
          params,
          batch,
          num_decodes=n,
          decoder_params={"alpha": args.alpha} if n > 1 else None,
          max_decode_length=decode_len)
      _phase(f"decoding: {name}" + (f" (beam {n})" if n > 1 else "") +
             f", {decode_len} tokens, compiling then timing {max(1, args.steps // 2)} batches")
      first, per = _time(fn, max(1, args.steps // 2))
      tokens, _ = fn()
      decoded = int(np.sum(np.asarray(tokens) > 0))
      results[f"{name}_beam"] = n
      results[f"{name}_first_call_s"] = first
      results[f"{name}_batch_s"] = per
      results[f"{name}_examples_per_s"] = args.batch_size / per
      results[f"{name}_decoded_tokens_per_s"] = decoded / per
      results[f"{name}_decode_length"] = decode_len
  mem, source = peak_memory()
  results["peak_memory_gib"] = mem / 2**30 if mem else None
  results["peak_memory_source"] = source

  for key, value in results.items():
    if isinstance(value, float):
      print(f"{key:32s} {value:.6g}")
    else:
      print(f"{key:32s} {value}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1)
  return results


if __name__ == "__main__":
  main()
