"""scripts/benchmark.py --mode t5x, the user's command's training step (`python -m t5x.train
--gin_file=gin/mt5_small_mcd1_he.gin`, T5X's own model and ours): the README run of docs/
benchmarks.md's command (`--preset tiny` appended: 1 + 1 tiny layers over the 250,112-piece output
layer, memory at batch 4, 16/512 tokens, step time at batch 1, 16/128;
`readme_commands.BENCHMARK_T5X`), its JSON's figures against hand counts; the fit of the largest
batch; one error line where T5X cannot be imported (the GPU image has no TensorFlow or SeqIO). No
speed is asserted: the ratio is printed."""
import json
import sys
import types

import jax
import numpy as np
import pytest

from mcwq_t5x.engine import flops
import mains
import readme_commands as rc
import scenarios

pytestmark = pytest.mark.xdist_group(f"readme-{rc.chain(rc.BENCHMARK_T5X)}")  # reads its README run

benchmark = mains.load_script("benchmark")

# The tiny preset's network (T5X's T5Config field names): d_model 32, 2 heads of 16, d_ff 64 (gated
# GELU: 2 `wi`), 1 + 1 layers, vocabulary 250,112, untied output layer; 16 input tokens; memory at
# batch 4 of 512 target tokens (8 chunks of the fused loss), the step time at batch 1 of 128.
LI, D, A, F, V = 16, 32, 32, 64, 250112
MEMORY_B, MEMORY_LT, B, LT = 4, 512, 1, 128
TINY = types.SimpleNamespace(
    emb_dim=D,
    num_heads=2,
    head_dim=16,
    mlp_dim=F,
    mlp_activations=("gelu", "linear"),
    num_encoder_layers=1,
    num_decoder_layers=1,
    vocab_size=V)
# Embedding and output layer; per layer q, k, v, o, wi_0, wi_1, wo and an RMS norm scale per block
# (2 encoder, 3 decoder); a relative position bias table (32 buckets x 2 heads) and a final norm
# per stack: 16,032,096 float32 parameters, the same names in both models.
PARAMS = (
    V * D + D * V + (4 * D * A + 2 * D * F + F * D + 2 * D) +
    (8 * D * A + 2 * D * F + F * D + 3 * D) + 2 * (32 * 2 + D))
GIB = 2**30


def test_largest_batch_from_two_compiles_then_bracketed():
  compiled = []

  def affine(rows):
    compiled.append(rows)
    return 2.0 + 0.5 * rows

  fit = benchmark.largest_batch(affine, 12, affine(12), 24, affine(24), 80.0)
  assert (fit["per_row_gib"], fit["fixed_gib"]) == (0.5, 2.0)
  # 2 + 0.5 x 156 = 80: the line's prediction fits, and the next row (80.5) settles it.
  assert compiled == [12, 24, 156, 157] and (fit["largest"], fit["smallest_over"]) == (156, 157)
  assert fit["tries"][0] == {"batch": 156, "predicted_total_gib": 80.0, "compiled_total_gib": 80.0}

  def convex(rows):
    return 2.0 + 0.5 * rows + 0.001 * rows**2

  # The line through 12 and 24 (0.536 GiB a row) predicts 146 rows: 96.3 GiB when compiled, over;
  # the line through 24 and 146 predicts 121: 77.1 GiB, within; through 146 and 121, 124 (79.4);
  # the secant finds no more room, so 125 is compiled: 80.1, over.
  fit = benchmark.largest_batch(convex, 12, convex(12), 24, convex(24), 80.0)
  assert [t["batch"] for t in fit["tries"]] == [146, 121, 124, 125]
  assert (fit["largest"], fit["smallest_over"]) == (124, 125)
  assert [t["compiled_total_gib"] for t in fit["tries"]
         ] == pytest.approx([96.316, 77.141, 79.376, 80.125])

  # XLA:CPU's buffers of our rematerialised step hardly grow between the file's batch and twice it
  # (0.002 GiB a row), then 0.1 GiB a row: the first try is capped at 32 x 24 rows.
  def flat_start(rows):
    return 10.85 + 0.002 * rows if rows <= 24 else 10.898 + 0.1 * (rows - 24)

  fit = benchmark.largest_batch(flat_start, 12, flat_start(12), 24, flat_start(24), 80.0)
  assert [t["batch"] for t in fit["tries"]] == [768, 715, 716]
  assert (fit["largest"], fit["smallest_over"]) == (715, 716)
  # At most `tries` compiles, and a 2% bracket is enough.
  fit = benchmark.largest_batch(convex, 12, convex(12), 24, convex(24), 80.0, tries=2)
  assert [t["batch"] for t in fit["tries"]] == [146, 121] and fit["largest"] == 121
  fit = benchmark.largest_batch(convex, 12, convex(12), 24, convex(24), 80.0, tolerance=0.2)
  assert [t["batch"] for t in fit["tries"]] == [146, 121] and fit["smallest_over"] == 146
  # Over the limit at one row: nothing fits, nothing more is compiled.
  fit = benchmark.largest_batch(affine, 1, 90.0, 2, 95.0, 80.0)
  assert (fit["largest"], fit["smallest_over"], fit["tries"]) == (None, 1, [])


def test_a_timed_rows_peak_memory_is_its_own():
  """Each timed row's peak is measured from its start: the process's peak RSS is reset
  (/proc/self/clear_refs); a device peak that cannot be reset and did not rise is no figure."""
  device = jax.devices()[0]
  earlier = np.ones((512, 2**20), np.uint8)  # why: 512 MiB, touched (an earlier row's peak)
  high, source = benchmark.device_peak_memory_gib(device)
  del earlier
  start = benchmark.reset_peak_memory(device)
  own = np.ones((64, 2**20), np.uint8)
  peak, row_source = benchmark.row_peak_memory_gib(device, start)
  assert source == row_source == "process peak RSS" and start[1], (source, start)
  assert start[0] + 0.06 <= peak < high - 0.25, (start, peak, high)
  assert own.sum() == 64 * 2**20
  assert benchmark.row_peak_memory_gib(device, (1e6, False)) == (
      None, "process peak RSS: not above the 1e+06 GiB of an earlier row (it cannot be reset)")


def test_without_t5x_one_error_line(tmp_path):
  """Where T5X's imports fail (the GPU image: no TensorFlow, no SeqIO), one line says why."""
  env = mains.without_packages(tmp_path / "site", "tensorflow", "seqio")
  out = mains.run([
      sys.executable, "scripts/benchmark.py", "--mode", "t5x", "--preset", "tiny", "--out",
      str(tmp_path / "out")
  ],
                  env=env,
                  check=False)
  assert out.returncode == 1
  lines = [l for l in out.stderr.splitlines() if l.startswith("ModuleNotFoundError: ")]
  assert len(lines) == 1 and "t5x/models.py lines 38 and 43" in lines[0], out.stderr
  assert "is not installed" in lines[0] and "Traceback" not in out.stderr
  assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def tiny_run(readme):
  run = scenarios.check(readme.result(rc.BENCHMARK_T5X))
  assert "--mode t5x" in run["command"] and run["command"].endswith("--preset tiny")
  out = readme.repo / "runs/benchmark_t5x"
  return run, json.loads(
      (out / "benchmark_t5x.json").read_text()), (out / "benchmark_t5x.md").read_text()


def test_memory_of_the_whole_step_of_both_models(tiny_run):
  _, results, _ = tiny_run
  assert results["complete"] and results["skipped"] == [], results["skipped"]
  assert results["device"] == {"platform": "cpu", "device_kind": "cpu", "count": 1}
  rows = {r["model"]: r for r in results["memory"]}
  assert sorted(rows) == ["ours", "t5x_own"]
  own, ours = rows["t5x_own"], rows["ours"]
  assert own["gin_files"] == ["gin/mt5_small_mcd1_he.gin", "gin/recipes/t5x_own_model.gin"]
  assert (own["model_class"], own["network_class"]) == ("t5x.models.EncoderDecoderModel",
                                                        "t5x.examples.t5.network.Transformer")
  assert ours["gin_files"] == ["gin/mt5_small_mcd1_he.gin"]
  assert ours["model_class"] == "mcwq_t5x.t5x_bridge.models.EncoderDecoderModel"
  assert ours["network_class"] == "mcwq_t5x.engine.network.Transformer"
  assert ours["remat_policy"] in benchmark.REMAT_POLICIES and own["remat_policy"] is None
  for r in (own, ours):
    assert (r["batch"], r["input_length"], r["target_length"]) == (MEMORY_B, LI, MEMORY_LT)
    step, grad = r["step"], r["loss_and_gradient"]
    for m in (step, grad):
      assert m["total"] == pytest.approx(m["arguments"] + m["outputs"] + m["temporaries"] -
                                         m["aliased"])
    # The whole step's arguments: the params and AdamW's two moments (float32), the step counts
    # and the batch; the new state is written over the donated one.
    assert 12 * PARAMS <= step["arguments"] * GIB < 12 * PARAMS + 2**16, step
    assert 12 * PARAMS <= step["aliased"] * GIB <= step["outputs"] * GIB, step
    # The loss and gradient: the gradient of every parameter out, float32.
    assert 4 * PARAMS <= grad["outputs"] * GIB < 4 * PARAMS + 2**16, grad
    assert r["largest_batch"] is None  # the tiny preset fits nothing
  # T5X's own loss holds the float32 logits [4, 512, 250112] (2.05 GB), the one-hot targets and
  # their gradients (measured: 10.35 GB of temporaries); ours' fused loss holds a few 256-token
  # chunks of them at a time (0.81 GB).
  logits = MEMORY_B * MEMORY_LT * V * 4
  assert own["loss_and_gradient"]["temporaries"] * GIB >= 4 * logits, own
  assert ours["loss_and_gradient"]["temporaries"] * GIB < logits / 2, ours
  assert ours["step"]["total"] < own["step"]["total"] / 5


def test_step_time_of_both_models_and_their_ratio(tiny_run):
  run, results, table = tiny_run
  rows = {r["model"]: r for r in results["timed"]}
  assert sorted(rows) == ["ours", "t5x_own"]
  for r in rows.values():
    assert (r["shape"], r["batch"], r["input_length"], r["target_length"]) == ("tiny", B, LI, LT)
    assert r["steps"] == 3 and r["warmup_steps"] == 1 and r["step_s_min"] <= r["step_s"]
    assert r["model_flops_per_step"] == flops.train_step_flops(TINY, B, LI, LT)
    assert abs(r["examples_per_s"] * r["step_s"] - B) < 1e-9 and 0 < r["mfu"] < 1
    assert r["cpu_s_per_step"] > 0 and r["compile_s"] > 0 and r["init_s"] > 0
    assert r["step_memory_gib"]["arguments"] * GIB >= 12 * PARAMS
  ratio = results["ratios"]["tiny batch 1"]
  assert ratio["step_s"] == pytest.approx(rows["ours"]["step_s"] / rows["t5x_own"]["step_s"])
  assert f"ours / T5X's own, tiny batch 1: {ratio['step_s']:.3f} (s/step)" in table
  assert table in run["stdout"]
  memory_lines = [l for l in table.splitlines() if l.startswith("| tiny |")]
  assert [l.split(" | ")[1] for l in memory_lines] == ["t5x_own", "ours", "t5x_own", "ours"]
