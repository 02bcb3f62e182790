"""`scripts/profile_train_step.py`: the compiled step's instructions read from XLA's text, each put
in its kind, and the script run as users run it (a fresh process) on a tiny network and real MCWQ
questions, once for its reports on 1 and 2 devices (`--host_devices 1,2`): the kinds' shares of the
cores' time add up, and the step's FLOPs are those of `flops.train_step_flops`. No speed is
asserted."""
import re
import sys

import jax
import jax.numpy as jnp
import pytest

from mcwq_t5x.engine import flops
import mains

profile = mains.load_script("profile_train_step")


def test_instructions_and_their_kinds_from_the_compiled_text():

  def step(x, w):
    with jax.named_scope("Transformer/encoder/layers_0/mlp"):
      h = jnp.tanh(x @ w)
    return h, w - 0.1 * jnp.sum(h)  # outside the forward pass: the optimizer's kind

  x = jnp.ones((64, 32), jnp.float32)
  w = jnp.ones((32, 48), jnp.float32)
  text = jax.jit(step).lower(x, w).compile().as_text()
  instructions, computations = profile.parse_hlo(text)
  dots = [
      n for n, i in instructions.items()
      if profile.kind_of(n, instructions, computations) == "matmuls"
  ]
  assert dots, text
  # The matmul is a dot, or a fusion whose computation holds one.
  for name in dots:
    inst = instructions[name]
    assert inst["opcode"] == "dot" or "dot" in computations[inst["calls"]], inst
  kinds = {profile.kind_of(n, instructions, computations) for n in instructions}
  assert kinds <= set(profile.KINDS), kinds


@pytest.fixture(scope="module")
def reports():
  """The script's reports for 1 and 2 devices, from one run (`--host_devices 1,2`): count ->
  its lines, from its "N devices" line to the next report's."""
  args = [
      "--task", "mcwq_gold_he", "--split", "test", "--batch_size", "8", "--emb_dim", "32",
      "--num_heads", "2", "--head_dim", "16", "--mlp_dim", "64", "--num_layers", "1", "--steps",
      "2", "--warmup_steps", "1", "--top", "2", "--host_devices", "1,2"
  ]
  out = mains.run([sys.executable, "scripts/profile_train_step.py", *args], timeout=900).stdout
  parts = re.split(r"^(?=\d+ devices, XLA_FLAGS=)", out, flags=re.M)
  assert [p.split(" ", 1)[0] for p in parts[1:]] == ["1", "2"], out
  return dict(zip(["1", "2"], parts[1:]))


@pytest.mark.parametrize("devices", ["1", "2"])
def test_the_report_on_a_tiny_network(reports, devices):
  out = reports[devices]
  assert out.startswith(f"{devices} devices"), out
  config = profile.argparse.Namespace(
      emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64, num_layers=1, vocab_size=2048)
  step_flops = flops.train_step_flops(
      mains.load_script("benchmark_vs_hf")._flop_config(config), 8, 40, 72)  # pylint: disable=protected-access
  assert f"({step_flops / 1e9:.2f} GFLOP a step)" in out, out
  shares = re.findall(r"^  (\S.*?)\s+([\d.]+) s/step\s+([\d.]+)%$", out, re.M)
  kinds = {k for k, _, _ in shares}
  assert "matmuls" in kinds and "host (Python: batches, dispatch)" in kinds, out
  assert sum(float(p) for _, _, p in shares) == pytest.approx(100.0, abs=0.6), shares
  waits = float(re.search(r"rendezvous waits of the all-reduces: ([\d.]+) s/step", out).group(1))
  assert (waits == 0.0) == (devices == "1"), out
  assert ("gradient all-reduce" in kinds) == (devices == "2"), out
  assert re.search(r"compiling the step: [\d.]+ s wall, [\d.]+ CPU-seconds", out), out
