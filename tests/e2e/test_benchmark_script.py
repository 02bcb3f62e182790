"""scripts/benchmark.py, the accelerator benchmark: the README run of docs/benchmarks.md's command
(with `--preset tiny`, on 2 XLA CPU devices; `readme_commands.BENCHMARK`), its JSON's figures
against hand counts, its Markdown table's rows, and no TensorFlow, SeqIO or PyTorch imported (the
GPU image has none of them)."""
import json

import pytest

import readme_commands as rc
import scenarios

pytestmark = pytest.mark.xdist_group(f"readme-{rc.chain(rc.BENCHMARK)}")  # reads its README run

# The tiny preset: batch 4, 16 input and 16 target tokens, 1 + 1 layers, d_model 64, 4 heads of 16,
# d_ff 256 (gated GELU: 2 `wi`), vocabulary 128, untied output layer.
B, LI, LT, D, A, F, V = 4, 16, 16, 64, 64, 256, 128


def _matmul(m, k, n):
  return 2 * m * k * n


# Forward matmuls of one example, counted one by one (a multiply-add is 2 FLOPs).
_ENCODER = (
    4 * _matmul(LI, D, A)  # q, k, v, o
    + _matmul(LI, A, LI) + _matmul(LI, LI, A)  # scores, weighted sum
    + 2 * _matmul(LI, D, F) + _matmul(LI, F, D))  # wi_0, wi_1, wo
_DECODER = (
    4 * _matmul(LT, D, A) + _matmul(LT, A, LT) + _matmul(LT, LT, A)  # self-attention
    + 2 * _matmul(LT, D, A) + 2 * _matmul(LI, D, A)  # cross-attention q, o; k, v
    + _matmul(LT, A, LI) + _matmul(LT, LI, A)  # cross-attention scores, weighted sum
    + 2 * _matmul(LT, D, F) + _matmul(LT, F, D)  # MLP
    + _matmul(LT, D, V))  # output layer
TRAIN_FLOPS = 3 * B * (_ENCODER + _DECODER)  # backward = 2 x forward
# Embedding and output layer; per layer q, k, v, o, wi_0, wi_1, wo, an RMS norm scale per block
# (2 encoder, 3 decoder); a relative position bias table (32 buckets x 4 heads) and a final norm
# per stack.
PARAMS = (
    V * D + D * V + (4 * D * A + 2 * D * F + F * D + 2 * D) +
    (8 * D * A + 2 * D * F + F * D + 3 * D) + 2 * (32 * 4 + D))


def test_tiny_preset_without_tensorflow_seqio_or_torch(readme):
  run = scenarios.check(readme.result(rc.BENCHMARK))
  assert "--out runs/benchmark" in run["command"] and run["command"].endswith("--preset tiny")
  out = readme.repo / "runs/benchmark"
  results = json.loads((out / "benchmark.json").read_text())
  assert results["complete"] and results["skipped"] == [], results["skipped"]
  assert results["imported"] == [], results["imported"]
  assert results["device"] == {"platform": "cpu", "device_kind": "cpu", "count": 2}
  peak = results["peak"]
  assert peak["table_tflops"] is None and peak["used_tflops"] == peak["measured_tflops"] > 0
  # One device, then the 2-device meshes: data parallel and model parallel.
  meshes = [(r["devices"], r["mesh"]["data"], r["mesh"]["model"]) for r in results["train"]]
  assert meshes == [(1, 1, 1), (2, 2, 1), (2, 1, 2)], meshes
  for r in results["train"]:
    assert (r["model"], r["batch"], r["input_length"], r["target_length"]) == ("tiny", B, LI, LT)
    assert r["params"] == PARAMS and r["model_flops_per_step"] == TRAIN_FLOPS == 62_128_128
    assert abs(r["examples_per_s"] * r["step_s"] - B) < 1e-6
    tflops = TRAIN_FLOPS / r["step_s"] / 1e12
    assert abs(r["model_tflops_per_s"] / tflops - 1) < 1e-9
    assert 0 < r["mfu"] <= 1 and r["mfu"] == r["mfu_of_measured_peak"]
    assert abs(r["mfu"] * r["devices"] * peak["used_tflops"] / tflops - 1) < 1e-9
    assert r["compile_s"] > 0 and r["init_s"] > 0 and 0 < r["step_memory_gib"] < 1
  # XLA's count of the one-device step holds every model FLOP (and elementwise work besides).
  first = results["train"][0]
  assert TRAIN_FLOPS <= first["xla_flops_per_step"] < 2 * TRAIN_FLOPS, first
  assert [(r["method"], r["beams"]) for r in results["decode"]] == [("greedy", 1), ("beam4", 4)]
  for r in results["decode"]:
    assert abs(r["questions_per_s"] * r["batch_s"] - B) < 1e-6 and r["decode_length"] == LT
    assert B <= r["decoded_tokens"] <= B * LT
    assert abs(r["tokens_per_s"] * r["batch_s"] - r["decoded_tokens"]) < 1e-6
  table = (out / "benchmark.md").read_text()
  assert table == run["stdout"][run["stdout"].index("# scripts/benchmark.py"):].split("\n[")[0]
  rows = [line for line in table.splitlines() if line.startswith("| tiny |")]
  second = [row.split(" | ")[1] for row in rows]
  assert second == ["1 (1 x 1)", "2 (2 x 1)", "2 (1 x 2)", "greedy", "beam4"], table
  assert f"| {100 * first['mfu']:.1f}% |" in rows[0]
  assert f"| {results['decode'][1]['questions_per_s']:.4g} |" in rows[4]
