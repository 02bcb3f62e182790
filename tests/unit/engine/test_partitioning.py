"""Tests of mcwq_t5x.engine.partitioning: T5X axis rules, meshes, sharded params, mesh-invariant losses.

Runs on 8 fake CPU devices (tests/conftest.py sets XLA_FLAGS before JAX is imported).
"""
import subprocess
import sys

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec as P
import numpy as np
import pytest

from mcwq_t5x.engine import partitioning
from mcwq_t5x.engine import trainer as trainer_lib
import tiny_engine
from tiny_engine import SHAPES, VOCAB, synthetic_batch


def tiny_model(dropout_rate=0.1):
  return tiny_engine.tiny_model(dropout_rate)


def run_steps(partitioner, num_steps=4, num_microbatches=1, optimizer="adafactor", **sizes):
  model = tiny_engine.tiny_model(0.1, **sizes)
  lr = trainer_lib.create_learning_rate_schedule(0.1, "constant")
  tx = trainer_lib.make_optimizer(lr, name=optimizer)
  tr = trainer_lib.Trainer(
      model, partitioner, lr, optimizer=tx, num_microbatches=num_microbatches, seed=3)
  state = tr.create_state(SHAPES)
  losses = []
  for s in range(num_steps):
    batch = partitioner.make_global_batch(synthetic_batch(s % 2))
    state, m = tr.train_step(state, batch)
    losses.append(float(m["loss"]) / float(m["num_tokens"]))
  return state, np.array(losses)


def test_standard_rules_match_t5x():
  rules = dict(partitioning.standard_logical_axis_rules())
  assert rules["batch"] == "data"
  for name in ("vocab", "mlp", "heads", "joined_kv"):
    assert rules[name] == "model", name
  for name in ("embed", "kv", "length", "relpos_buckets"):
    assert rules[name] is None, name
  assert dict(
      partitioning.standard_logical_axis_rules(parameter_partitioning_dims=2))["embed"] == "data"
  with pytest.raises(ValueError, match="must be 1 or 2"):
    partitioning.standard_logical_axis_rules(3)


@pytest.mark.parametrize("num_partitions,shape", [(1, (8, 1)), (2, (4, 2)), (4, (2, 4))])
def test_mesh_shapes(num_partitions, shape):
  p = partitioning.Partitioner(num_partitions=num_partitions)
  assert tuple(p.mesh.shape.values()) == shape
  assert p.mesh.axis_names == ("data", "model")
  assert p.data_parallel_size == shape[0]


def test_bad_num_partitions_and_batch():
  with pytest.raises(ValueError, match="divisor"):
    partitioning.Partitioner(num_partitions=3)
  p = partitioning.Partitioner(num_partitions=2)  # 4 data replicas
  with pytest.raises(ValueError, match="multiple of the data-parallel size 4"):
    p.check_batch_size(6)
  assert p.check_batch_size(8) == 8
  info = p.get_data_shard_info()
  assert (info.index, info.num_shards) == (0, 1)


def test_params_and_optimizer_state_are_sharded():
  p = partitioning.Partitioner(num_partitions=2)
  model = tiny_model()
  lr = trainer_lib.create_learning_rate_schedule(1e-2)
  tr = trainer_lib.Trainer(model, p, lr, optimizer=trainer_lib.make_optimizer(lr, "adamw"))
  state = tr.create_state(SHAPES)
  wi = state.params["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]  # logical (embed, mlp)
  assert wi.shape == (16, 32)
  assert wi.sharding.spec == P(None, "model")
  assert {s.data.shape for s in wi.addressable_shards} == {(16, 16)}
  emb = state.params["token_embedder"]["embedding"]  # logical (vocab, embed)
  assert emb.sharding.spec == P("model", None)
  assert {s.data.shape for s in emb.addressable_shards} == {(VOCAB // 2, 16)}
  # Adam moments follow their parameters' shardings.
  mu_wi = state.opt_state[0].mu["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
  assert mu_wi.sharding.spec == P(None, "model")


def test_adafactor_factored_state_specs():
  params = {"k": jax.ShapeDtypeStruct((256, 512), np.float32)}
  specs = {"k": P(None, "model")}
  tx = trainer_lib.make_optimizer(trainer_lib.create_learning_rate_schedule(1e-3))
  opt_shapes = jax.eval_shape(tx.init, params)
  opt_specs = trainer_lib.optimizer_state_specs(opt_shapes, params, specs)
  flat = {
      jax.tree_util.keystr(k): (v, s) for (k, v), s in zip(
          jax.tree_util.tree_flatten_with_path(opt_shapes)[0],
          jax.tree_util.tree_leaves(opt_specs, is_leaf=lambda x: isinstance(x, P)))
  }
  by_shape = {v.shape: s for v, s in flat.values()}
  # v_row drops dim 1 (shape (256,)), v_col drops dim 0 (shape (512,)) and keeps "model".
  assert by_shape[(256,)] == P(None)
  assert by_shape[(512,)] == P("model")


def test_losses_are_mesh_invariant():
  """A few Adafactor steps (dropout on) give the same losses on 1 device and on 4x2, data and model
  parallel in one mesh: the 2 heads and the MLP sharded over the 2 `model` devices, the odd
  vocabulary (65 rows) replicated (`fit_spec_to_mesh`)."""
  _, ref = run_steps(partitioning.Partitioner(devices=jax.devices()[:1]), vocab_size=VOCAB + 1)
  assert np.all(np.isfinite(ref)) and ref[2] < ref[0] and ref[3] < ref[1]
  state, losses = run_steps(partitioning.Partitioner(num_partitions=2), vocab_size=VOCAB + 1)
  layer = state.params["encoder"]["layers_0"]
  assert layer["attention"]["query"]["kernel"].sharding.spec == P(None, "model")
  assert layer["mlp"]["wi_0"]["kernel"].sharding.spec == P(None, "model")
  assert state.params["token_embedder"]["embedding"].sharding.spec == P(None, None)
  np.testing.assert_allclose(losses, ref, rtol=2e-5, atol=0)


def test_logical_to_mesh_sharding():
  p = partitioning.Partitioner(num_partitions=2)
  shardings = p.logical_to_mesh_sharding({
      "a": P("batch", "length", "embed"),
      "b": None,
      "c": P("embed", "mlp")
  })
  assert shardings["a"].spec == P("data", None, None)
  assert shardings["b"].spec == P()
  assert shardings["c"].spec == P(None, "model")
  # nn.logical_axis_rules is active inside the partitioned function's context.
  with p.context():
    assert dict(nn.get_logical_axis_rules())["mlp"] == "model"


_PAGE_FAULT_PROBE = r"""
import ctypes, resource, sys
from mcwq_t5x.engine import cpu_settings
applied = cpu_settings.set_host_malloc_options() if sys.argv[1] == "1" else None
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
faults = []
for _ in range(4):  # malloc, touch and free 64 MiB, as XLA does with a step's temporaries
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  block = libc.malloc(64 * 2**20)
  ctypes.memset(block, 1, 64 * 2**20)
  libc.free(block)
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(applied, faults[-1])
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc mallopt")
def test_host_malloc_options_reuse_freed_memory_without_page_faults():
  """A freed 64 MiB block comes back without touching new pages (16,384 faults by default)."""
  results = {}
  for flag in ("0", "1"):
    out = subprocess.run([sys.executable, "-c", _PAGE_FAULT_PROBE, flag],
                         capture_output=True,
                         text=True,
                         check=True).stdout.split()
    results[flag] = (out[0], int(out[1]))
  assert results["0"][1] >= 16_000  # glibc's default: a fresh mmap per large block
  assert results["1"] == ("True", results["1"][1]) and results["1"][1] < 100


_RELEASE_PROBE = r"""
import ctypes
from mcwq_t5x.engine import cpu_settings
cpu_settings.set_host_malloc_options()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20  # MiB
blocks = [libc.malloc(64 * 2**20) for _ in range(4)]
for block in blocks:
  ctypes.memset(block, 1, 64 * 2**20)
guard = libc.malloc(4096)  # why: a live block above them, as the train state above its init's
before = rss()
for block in blocks:
  libc.free(block)
kept = rss()
released = cpu_settings.release_free_host_memory()
print(released, round(before - kept), round(kept - rss()))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc malloc_trim")
def test_release_free_host_memory_gives_back_what_the_malloc_options_keep():
  """256 MiB freed under the malloc options stay resident until `release_free_host_memory`."""
  out = subprocess.run([sys.executable, "-c", _RELEASE_PROBE],
                       capture_output=True,
                       text=True,
                       check=True).stdout.split()
  released, dropped_at_free, dropped_at_release = out[0], int(out[1]), int(out[2])
  assert released == "True" and dropped_at_free < 16 and dropped_at_release > 240, out
