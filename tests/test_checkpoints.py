"""Tests of mcwq_t5x.checkpoints (+ the deterministic data order): save/restore, keep-last-K,
corrupt-latest fallback, and kill-and-resume reproducing the uninterrupted loss trajectory."""
import pathlib

import jax
import numpy as np
import pytest

from mcwq_t5x import checkpoints
from mcwq_t5x import model as model_lib
from mcwq_t5x import network
from mcwq_t5x import partitioning
from mcwq_t5x import trainer as trainer_lib
from mcwq_t5x import utils

VOCAB = 64


def tiny_model():
  cfg = network.get_config("tiny", vocab_size=VOCAB, emb_dim=16, num_heads=2, head_dim=8,
                           mlp_dim=32, num_encoder_layers=1, num_decoder_layers=1,
                           dropout_rate=0.1)
  return model_lib.EncoderDecoderModel(network.Transformer(cfg))


def synthetic_arrays(n=40, seed=0):
  rng = np.random.default_rng(seed)
  enc = rng.integers(2, VOCAB, size=(n, 12)).astype(np.int32)
  tgt = rng.integers(2, VOCAB, size=(n, 10)).astype(np.int32)
  enc[:, -1] = 1
  tgt[:, 7] = 1
  tgt[:, 8:] = 0
  dec_in = np.concatenate([np.zeros((n, 1), np.int32), tgt[:, :-1]], axis=1)
  return {"encoder_input_tokens": enc, "decoder_input_tokens": dec_in,
          "decoder_target_tokens": tgt, "decoder_loss_weights": (tgt > 0).astype(np.int32)}


def make_trainer(partitioner):
  lr = trainer_lib.create_learning_rate_schedule(0.05, "constant", warmup_steps=2)
  return trainer_lib.Trainer(tiny_model(), partitioner, lr, seed=1)


def shapes(batch_size=8):
  return {k: (batch_size,) + v.shape[1:] for k, v in synthetic_arrays(1).items()}


def train_losses(tr, state, batches, start, stop, ckpt=None):
  losses = []
  for step in range(start, stop):
    state, m = tr.train_step(state, tr.partitioner.make_global_batch(batches.batch(step)))
    losses.append(float(m["loss"]) / float(m["num_tokens"]))
    if ckpt is not None:
      ckpt.save(step + 1, state, {"step": step + 1, "data_seed": batches.seed})
  return state, losses


def test_deterministic_batches():
  arrays = {"x": np.arange(10)[:, None]}
  a = utils.DeterministicBatches(arrays, batch_size=4, seed=3)
  b = utils.DeterministicBatches(arrays, batch_size=4, seed=3)
  # Batch s depends only on (seed, s), whatever was read before.
  np.testing.assert_array_equal(a.batch(7)["x"], b.batch(7)["x"])
  np.testing.assert_array_equal(a.batch(2)["x"], next(b.iterate(2))["x"])
  # Each epoch is a permutation of all rows; epochs differ.
  stream = np.concatenate([a.batch(s)["x"][:, 0] for s in range(5)])  # 20 items = 2 epochs
  assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:]) == list(range(10))
  assert list(stream[:10]) != list(stream[10:])
  c = utils.DeterministicBatches(arrays, batch_size=4, seed=4)
  assert list(c.batch(0)["x"][:, 0]) != list(a.batch(0)["x"][:, 0])
  ordered = utils.DeterministicBatches(arrays, batch_size=4, shuffle=False)
  assert list(ordered.batch(2)["x"][:, 0]) == [8, 9, 0, 1]


def test_save_restore_roundtrip_keeps_sharding(tmp_path):
  p = partitioning.Partitioner(num_partitions=2)
  tr = make_trainer(p)
  state = tr.create_state(shapes())
  mgr = checkpoints.CheckpointManager(tmp_path / "ckpt", save_interval_steps=1, async_save=False)
  assert mgr.restore_latest(tr.state_shapes(shapes())) is None
  assert mgr.save(0, state, {"data_seed": 5})
  step, restored, data = mgr.restore_latest(tr.state_shapes(shapes()))
  assert step == 0 and data == {"data_seed": 5, "step": 0}
  wi = restored.params["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
  assert wi.sharding.spec == jax.sharding.PartitionSpec(None, "model")
  for a, b in zip(jax.tree_util.tree_leaves(jax.device_get(state)),
                  jax.tree_util.tree_leaves(jax.device_get(restored))):
    np.testing.assert_array_equal(a, b)


def test_keep_last_k_and_interval(tmp_path):
  mgr = checkpoints.CheckpointManager(tmp_path, save_interval_steps=2, max_to_keep=2,
                                      async_save=False)
  tree = {"w": np.arange(6.0)}
  saved = [mgr.save(s, tree) for s in range(1, 8)]
  assert saved == [True, True, False, True, False, True, False]  # the first save always happens
  assert mgr.save(7, tree, force=True)
  assert mgr.all_steps() == [6, 7]
  # Atomicity: only finished checkpoints are listed (no temporary folders left behind).
  assert sorted(p.name for p in tmp_path.iterdir()) == ["6", "7"]


def _corrupt(step_dir: pathlib.Path):
  data_files = [f for f in step_dir.rglob("*") if f.is_file() and "/d/" in str(f)]
  assert data_files, f"no array data files found under {step_dir}"
  for f in data_files:
    f.write_bytes(b"\x00garbage" * (f.stat().st_size // 8 + 1))


def test_corrupt_latest_falls_back_to_previous(tmp_path):
  p = partitioning.Partitioner(num_partitions=1)
  tr = make_trainer(p)
  batches = utils.DeterministicBatches(synthetic_arrays(), 8, seed=0)
  mgr = checkpoints.CheckpointManager(tmp_path, save_interval_steps=1, async_save=False)
  state = tr.create_state(shapes())
  state, _ = train_losses(tr, state, batches, 0, 2, ckpt=mgr)
  assert mgr.all_steps() == [1, 2]
  state1 = jax.device_get(mgr.restore(1, tr.state_shapes(shapes()))[0])
  _corrupt(tmp_path / "2")
  step, restored, data = mgr.restore_latest(tr.state_shapes(shapes()))
  assert step == 1 and data["step"] == 1 and int(restored.step) == 1
  for a, b in zip(jax.tree_util.tree_leaves(state1),
                  jax.tree_util.tree_leaves(jax.device_get(restored))):
    np.testing.assert_array_equal(a, b)
  _corrupt(tmp_path / "1")
  with pytest.raises(checkpoints.NoUsableCheckpointError, match="no checkpoint .* could be restored"):
    mgr.restore_latest(tr.state_shapes(shapes()))


def test_kill_and_resume_reproduces_losses(tmp_path):
  """6 steps straight == 3 steps, 'kill' (new trainer + manager), restore, 3 more (dropout on)."""
  p = partitioning.Partitioner(num_partitions=2)
  batches = utils.DeterministicBatches(synthetic_arrays(), 8, seed=11)
  tr = make_trainer(p)
  _, straight = train_losses(tr, tr.create_state(shapes()), batches, 0, 6)

  tr1 = make_trainer(p)
  mgr1 = checkpoints.CheckpointManager(tmp_path, save_interval_steps=3, async_save=True)
  _, first = train_losses(tr1, tr1.create_state(shapes()), batches, 0, 3, ckpt=mgr1)
  mgr1.close()
  del tr1, mgr1

  tr2 = make_trainer(p)
  mgr2 = checkpoints.CheckpointManager(tmp_path, save_interval_steps=3)
  step, state, data = mgr2.restore_latest(tr2.state_shapes(shapes()))
  assert step == 3 and data["step"] == 3
  fresh = utils.DeterministicBatches(synthetic_arrays(), 8, seed=data["data_seed"])
  _, second = train_losses(tr2, state, fresh, step, 6)
  np.testing.assert_allclose(first + second, straight, rtol=1e-6)


def test_initial_checkpoint_import_into_sharded_state(tmp_path):
  """INITIAL_CHECKPOINT_PATH path of train(): T5X-native checkpoint -> load_pretrained -> state."""
  from mcwq_t5x import checkpoint_import  # pylint: disable=g-import-not-at-top
  p = partitioning.Partitioner(num_partitions=2)
  source = make_trainer(p)
  source.seed = 123
  params = jax.device_get(source.create_state(shapes()).params)
  checkpoint_import.save_t5x_checkpoint(params, tmp_path / "checkpoint_1000000", step=1000000)
  tr = make_trainer(p)
  loaded = checkpoint_import.load_pretrained(tmp_path / "checkpoint_1000000",
                                             tr.model.module.config)
  state = tr.create_state(shapes(), init_params=loaded)
  assert int(state.step) == 0
  emb = state.params["token_embedder"]["embedding"]
  assert emb.sharding.spec == jax.sharding.PartitionSpec("model", None)
  for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(
      jax.device_get(state.params))):
    np.testing.assert_array_equal(a, b)
