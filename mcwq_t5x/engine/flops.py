"""Model FLOPs of a training step, and the machine's float32 matmul peak measured in-process.

Utilisation = model FLOPs per second / matmul peak: how close a training step comes to the
fastest float32 matrix product the machine's kernels run. The training main logs it with every
periodic step line (`mcwq_t5x.train.train`), `scripts/benchmark_vs_hf.py` prints it for both
systems.

* `train_step_flops`: the matmul FLOPs of one forward + backward pass of a T5 network on given
  batch shapes (what the step computes on its padded rows). It reads only a config's sizes, so
  that a process without JAX (the benchmark's PyTorch worker) counts with the same formula.
* `matmul_peak`: the best GFLOP/s of float32 [n, n] x [n, n] products, timed on the kernels at
  hand (NumPy's BLAS; XLA's `jnp.dot` on one device; any other callable, e.g. PyTorch's), each
  the best of a few calls.

Imports NumPy only; JAX is imported inside `matmul_peak` when the XLA kernel is timed.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np


def train_step_flops(config: Any, batch: int, input_length: int, target_length: int) -> float:
  """Matmul FLOPs of one training step (forward and backward) of `config`'s network.

  Counted per matmul of the forward pass over the padded shapes (what the step computes; a
  multiply-add is 2 FLOPs), times 3 for forward + backward (the backward pass does two matmuls
  of each forward one's size: gradients of the activations and of the weights, or of both
  operands of an attention product). With B = batch, Li/Lt = input/target length, d = emb_dim,
  a = num_heads * head_dim, f = mlp_dim, m = len(mlp_activations), V = vocab_size:

    encoder layer: 2 B [Li d a 4 + Li^2 a 2 + Li d f (m + 1)]
    decoder layer: 2 B [Lt d a 4 + Lt^2 a 2 + (Lt + Li) d a 2 + Lt Li a 2 + Lt d f (m + 1)]
    output layer:  2 B Lt d V  (a dense layer or the tied embedding alike)
    step = 3 (num_encoder_layers encoder + num_decoder_layers decoder + output)

  This is exactly the sum over the `dot_general`s of the training step's jaxpr
  (`tests/unit/engine/test_flops.py`). Elementwise work (softmax, layer norms, activations, dropout, the
  optimizer) and gathers (embeddings, relative position biases) are not counted; XLA's own
  `cost_analysis()` of the compiled step, which counts them too, is about 1% higher for the
  benchmark network of `scripts/benchmark_vs_hf.py`. Without the attention products (the Li^2,
  Lt^2 and Lt Li terms) this is the usual "6 * parameters * tokens" rule, each weight counted on
  the tokens it is applied to.

  Args:
    config: `mcwq_t5x.engine.network.T5Config`, or any object with its fields `emb_dim`,
      `num_heads`, `head_dim`, `mlp_dim`, `mlp_activations`, `num_encoder_layers`,
      `num_decoder_layers`, `vocab_size`.
    batch: rows per step (global batch).
    input_length, target_length: tokens per encoder / decoder row (padded lengths).

  Returns:
    FLOPs as a float.

  Raises:
    AttributeError: `config` lacks one of the fields.
  """
  b, li, lt = batch, input_length, target_length
  d, a, f = config.emb_dim, config.num_heads * config.head_dim, config.mlp_dim
  m = len(config.mlp_activations)
  encoder = 2 * b * (li * d * a * 4 + li * li * a * 2 + li * d * f * (m + 1))
  decoder = 2 * b * (
      lt * d * a * 4 + lt * lt * a * 2 + (lt + li) * d * a * 2 + lt * li * a * 2 + lt * d * f *
      (m + 1))
  output = 2 * b * lt * d * config.vocab_size
  return 3.0 * (config.num_encoder_layers * encoder + config.num_decoder_layers * decoder + output)


def batch_train_step_flops(config: Any, shapes: Mapping[str, Sequence[int]]) -> Optional[float]:
  """`train_step_flops` of a batch given by its feature shapes.

  Args:
    config: as `train_step_flops`.
    shapes: feature name -> shape of the global batch; reads "encoder_input_tokens" [B, Li] and
      "decoder_target_tokens" [B, Lt].

  Returns:
    FLOPs, or None when `config` is None or a feature is missing (a model this count does not
    describe).
  """
  if config is None or "encoder_input_tokens" not in shapes or "decoder_target_tokens" not in shapes:
    return None
  b, li = shapes["encoder_input_tokens"][:2]
  lt = shapes["decoder_target_tokens"][1]
  return train_step_flops(config, int(b), int(li), int(lt))


@dataclasses.dataclass(frozen=True)
class MatmulPeak:
  """A measured float32 matmul peak.

  Attributes:
    gflops: GFLOP/s of the fastest kernel timed (10^9 FLOPs per second, 2 n^3 FLOPs a product).
    kernel: its name ("numpy", "XLA", or a name given to `matmul_peak`).
    measured: GFLOP/s of every kernel timed, by name.
    n: the matrices' size.
  """
  gflops: float
  kernel: str
  measured: Mapping[str, float]
  n: int

  def describe(self) -> str:
    """E.g. "XLA 2048x2048 float32 matmul (numpy 130.2, XLA 135.0 GFLOP/s)"."""
    each = ", ".join(f"{k} {v:.1f}" for k, v in self.measured.items())
    return f"{self.kernel} {self.n}x{self.n} float32 matmul ({each} GFLOP/s)"


def time_matmul(matmul: Callable[[], Any], n: int, repeats: int = 3) -> float:
  """Best GFLOP/s of `repeats` calls of `matmul`, a [n, n] x [n, n] product that returns when done.

  Raises:
    ValueError: `repeats` < 1.
  """
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
  """The best float32 matmul GFLOP/s of the kernels at hand, timed in this process.

  Each kernel multiplies the same two [n, n] float32 matrices `repeats` times and counts its
  fastest call (NumPy's first call, which starts its BLAS threads, is one of them; XLA's product
  is compiled before it is timed). With the defaults this takes about 6 products: about 0.8 s
  at 130 GFLOP/s. Timed on a loaded machine the figure is lower: compare figures of one process.

  Args:
    n: matrix size.
    repeats: calls per kernel.
    kernels: of "numpy" (`np.matmul`, NumPy's BLAS on all cores) and "XLA" (`jnp.dot` on JAX's
      first local device: the kernel and flags a training step of this process uses). On an
      accelerator (`platform` not "cpu") "numpy" is skipped: the host's BLAS is not the peak
      of the device that trains.
    extra: more kernels, name -> function(x, y) that returns when the product is done (e.g.
      PyTorch's `torch.matmul` on tensors made from x and y), called once untimed first.
    platform: JAX's default backend (None: "cpu" unless "XLA" is timed, then JAX's).

  Returns:
    `MatmulPeak` of the fastest kernel.

  Raises:
    ValueError: no kernel to time, or an unknown kernel name.
  """
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
