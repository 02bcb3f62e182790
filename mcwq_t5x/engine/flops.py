"""Model FLOPs of a training step and of decoding, and the machine's float32 matmul peak measured in-process.

Utilisation = model FLOPs per second / matmul peak. `train_step_flops` counts the matmul FLOPs of
one forward + backward pass of a T5 network on padded batch shapes from a config's sizes alone (so
the benchmark's PyTorch worker counts with the same formula); `matmul_peak` is the best GFLOP/s of
float32 [n, n] x [n, n] products on the kernels at hand (NumPy's BLAS, XLA's `jnp.dot`, or any
callable). Imports NumPy only; JAX only inside `matmul_peak`.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np


def train_step_flops(config: Any, batch: int, input_length: int, target_length: int) -> float:
  """Matmul FLOPs of one training step (forward and backward) of `config`'s network.

  3 x the forward matmuls over the padded shapes (a multiply-add is 2 FLOPs): exactly the step
  jaxpr's `dot_general`s, but the relative position bias's one-hot contraction (a table lookup
  written as a matmul, as T5X's; no model FLOPs). `config`: a `T5Config` or any object with its
  size fields (no JAX); AttributeError if one is missing.
  """
  # B = batch, Li/Lt = input/target length, d = emb_dim, a = heads * head_dim, f = mlp_dim,
  # m = len(mlp_activations); without the L^2 and Lt Li attention terms this is 6 * params * tokens.
  b, li, lt = batch, input_length, target_length
  d, a, f = config.emb_dim, config.num_heads * config.head_dim, config.mlp_dim
  m = len(config.mlp_activations)
  # encoder layer: 2 B [Li d a 4 + Li^2 a 2 + Li d f (m + 1)]
  encoder = 2 * b * (li * d * a * 4 + li * li * a * 2 + li * d * f * (m + 1))
  # decoder layer: 2 B [Lt d a 4 + Lt^2 a 2 + (Lt + Li) d a 2 + Lt Li a 2 + Lt d f (m + 1)]
  decoder = 2 * b * (
      lt * d * a * 4 + lt * lt * a * 2 + (lt + li) * d * a * 2 + lt * li * a * 2 + lt * d * f *
      (m + 1))
  output = 2 * b * lt * d * config.vocab_size  # a dense layer or the tied embedding alike
  # why 3: the backward pass does two matmuls of each forward one's size.
  return 3.0 * (config.num_encoder_layers * encoder + config.num_decoder_layers * decoder + output)


def batch_train_step_flops(config: Any, shapes: Mapping[str, Sequence[int]]) -> Optional[float]:
  """`train_step_flops` for "encoder_input_tokens" [B, Li] and "decoder_target_tokens" [B, Lt] of
  `shapes`; None without `config` or a feature."""
  if config is None or "encoder_input_tokens" not in shapes or "decoder_target_tokens" not in shapes:
    return None
  b, li = shapes["encoder_input_tokens"][:2]
  lt = shapes["decoder_target_tokens"][1]
  return train_step_flops(config, int(b), int(li), int(lt))


def decode_flops(config: Any,
                 input_lengths: Sequence[int],
                 generated_lengths: Sequence[int],
                 beams: int = 1) -> float:
  """Matmul FLOPs of decoding questions with a KV cache (greedy: `beams` 1; beam search).

  Per question: the encoder once over its `input_lengths[i]` tokens; per beam, the cross-attention
  keys and values once, then for each of its `generated_lengths[i]` tokens one decoder step (the
  projections and MLP of one position, attention over the t cached positions and the input) and
  the output layer of one position. Padding, finished beams and the beams' candidate ranking are
  not counted, so both systems are credited the same work. `config`: as `train_step_flops`.

  Raises:
    ValueError: the two length lists differ in size.
  """
  if len(input_lengths) != len(generated_lengths):
    raise ValueError(f"{len(input_lengths)} input lengths, {len(generated_lengths)} generated")
  d, a, f = config.emb_dim, config.num_heads * config.head_dim, config.mlp_dim
  m = len(config.mlp_activations)
  total = 0.0
  for li, n in zip(input_lengths, generated_lengths):
    encoder = 2 * (li * d * a * 4 + li * li * a * 2 + li * d * f * (m + 1))
    cross_kv = 2 * li * d * a * 2
    # n steps: projections (self q k v o, cross q o), MLP, attention over t = 1..n keys + li
    steps = 2 * (n * (d * a * 6 + d * f * (m + 1) + li * a * 2) + n * (n + 1) // 2 * a * 2)
    output = 2 * n * d * config.vocab_size
    total += config.num_encoder_layers * encoder + beams * (
        config.num_decoder_layers * (cross_kv + steps) + output)
  return float(total)


@dataclasses.dataclass(frozen=True)
class MatmulPeak:
  """A measured float32 matmul peak: `gflops` (10^9 FLOP/s, 2 n^3 FLOPs a product) of the fastest
  `kernel` ("numpy", "XLA", or a given name), `measured` {kernel: GFLOP/s}, size `n`."""
  gflops: float
  kernel: str
  measured: Mapping[str, float]
  n: int

  def describe(self) -> str:
    """E.g. "XLA 2048x2048 float32 matmul (numpy 130.2, XLA 135.0 GFLOP/s)"."""
    each = ", ".join(f"{k} {v:.1f}" for k, v in self.measured.items())
    return f"{self.kernel} {self.n}x{self.n} float32 matmul ({each} GFLOP/s)"


def time_matmul(matmul: Callable[[], Any], n: int, repeats: int = 3) -> float:
  """Best GFLOP/s of `repeats` calls of `matmul` ([n, n] x [n, n], returns when done); ValueError
  < 1."""
  if repeats < 1:
    raise ValueError(f"time_matmul: repeats must be >= 1, got {repeats}")
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    matmul()
    best = min(best, time.perf_counter() - t)
  return 2.0 * n**3 / max(best, 1e-12) / 1e9


def _xla_matmul(x: np.ndarray, y: np.ndarray) -> Callable[[], Any]:
  """`jnp.dot(x, y)` compiled for JAX's first local device (the process's XLA flags apply)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  device = jax.local_devices()[0]
  xd, yd = jax.device_put(x, device), jax.device_put(y, device)
  dot = jax.jit(jnp.dot).lower(xd, yd).compile()
  return lambda: dot(xd, yd).block_until_ready()


def matmul_peak(n: int = 2048,
                repeats: int = 3,
                kernels: Sequence[str] = ("numpy", "XLA"),
                extra: Optional[Mapping[str, Callable[[np.ndarray, np.ndarray], Any]]] = None,
                platform: Optional[str] = None) -> MatmulPeak:
  """`MatmulPeak` of the fastest float32 [n, n] kernel timed in this process: "numpy" (CPU only),
  "XLA" (`jnp.dot`, compiled first), and `extra` {name: fn(x, y)}. ValueError: none, or unknown."""
  unknown = [k for k in kernels if k not in ("numpy", "XLA")]
  if unknown:
    raise ValueError(f"matmul_peak: unknown kernel(s) {unknown}; choose from ['numpy', 'XLA']")
  if platform is None:
    platform = "cpu"
    if "XLA" in kernels:
      import jax  # pylint: disable=g-import-not-at-top
      platform = jax.default_backend()
  rng = np.random.default_rng(0)
  x = rng.random((n, n), dtype=np.float32)
  y = rng.random((n, n), dtype=np.float32)
  measured: dict[str, float] = {}
  if "numpy" in kernels and platform == "cpu":
    measured["numpy"] = time_matmul(lambda: np.matmul(x, y), n, repeats)
  if "XLA" in kernels:
    measured["XLA"] = time_matmul(_xla_matmul(x, y), n, repeats)
  for name, fn in (extra or {}).items():
    fn(x, y)
    measured[name] = time_matmul(lambda fn=fn: fn(x, y), n, repeats)
  if not measured:
    raise ValueError(f"matmul_peak: no kernel timed (kernels={list(kernels)}, extra="
                     f"{sorted(extra or {})}, platform={platform!r})")
  best = max(measured, key=measured.get)
  return MatmulPeak(gflops=measured[best], kernel=best, measured=measured, n=n)
