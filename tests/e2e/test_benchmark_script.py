"""scripts/benchmark.py, the accelerator benchmark, run at a tiny size on the CPU in a fresh process
with TensorFlow, SeqIO and PyTorch made unimportable (the GPU image has none of them)."""
import json
import sys

from tests import mains

_BLOCKED_RUN = """
import runpy, sys
class Blocker:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in ("tensorflow", "seqio", "torch"):
      raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Blocker())
sys.argv = ["scripts/benchmark.py"] + sys.argv[1:]
runpy.run_path("scripts/benchmark.py", run_name="__main__")
"""


def test_runs_without_tensorflow_seqio_or_torch(tmp_path):
  out = tmp_path / "bench.json"
  mains.run([
      sys.executable, "-c", _BLOCKED_RUN, "--model", "tiny", "--dtype", "float32", "--vocab_size",
      "64", "--batch_size", "2", "--input_length", "8", "--target_length", "8", "--steps", "1",
      "--beam", "2", "--json",
      str(out)
  ])
  results = json.loads(out.read_text())
  assert results["batch_size"] == 2 and results["train_step_s"] > 0
  assert results["greedy_examples_per_s"] > 0 and results["beam_beam"] == 2
  assert 0 < results["peak_memory_gib"] < 8
