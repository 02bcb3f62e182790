"""Tests of mcwq_t5x.checkpointing.checkpoints (+ the deterministic data order): save/restore, keep-last-K,
corrupt-latest fallback, and kill-and-resume reproducing the uninterrupted loss trajectory."""

import functools
import shutil

import jax
import numpy as np
import pytest

from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import checkpoints
from mcwq_t5x.data import pipeline
from mcwq_t5x.engine import partitioning
from mcwq_t5x.engine import trainer as trainer_lib
import tiny_engine

VOCAB = tiny_engine.VOCAB


def tiny_model():
  """The shared tiny test model (tests/tiny_engine.py) with dropout 0.1."""
  return tiny_engine.tiny_model(0.1)


def synthetic_arrays(n=40, seed=0):
  """`n` feature-converter rows: 11 random tokens + EOS in, 7 random tokens + EOS out."""
  rng = np.random.default_rng(seed)
  enc = rng.integers(2, VOCAB, size=(n, 12)).astype(np.int32)
  tgt = rng.integers(2, VOCAB, size=(n, 10)).astype(np.int32)
  enc[:, -1] = 1
  tgt[:, 7] = 1
  return tiny_engine.feature_batch(enc, tgt[:, :8], 12, 10)


def make_trainer(partitioner):
  lr = trainer_lib.create_learning_rate_schedule(0.05, "constant", warmup_steps=2)
  return trainer_lib.Trainer(tiny_model(), partitioner, lr, seed=1)


def shapes(batch_size=8):
  return {k: (batch_size,) + v.shape[1:] for k, v in synthetic_arrays(1).items()}


@functools.cache
def shared_trainer():
  """One `make_trainer` over a 4x2 mesh for the module: its train step compiles once, not once per
  test (a test of a fresh trainer, as after a restart, makes its own)."""
  return make_trainer(partitioning.Partitioner(num_partitions=2))


@functools.cache
def _initial_host_state():
  return jax.device_get(shared_trainer().create_state(shapes()))


def initial_state():
  """`shared_trainer().create_state(shapes())`, initialised once and placed again with the state's
  shardings (the train step donates the state it is given)."""
  tr = shared_trainer()
  return jax.device_put(_initial_host_state(), tr.state_shardings(shapes()))


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
  a = pipeline.DeterministicBatches(arrays, batch_size=4, seed=3)
  b = pipeline.DeterministicBatches(arrays, batch_size=4, seed=3)
  # Batch s depends only on (seed, s), whatever was read before.
  np.testing.assert_array_equal(a.batch(7)["x"], b.batch(7)["x"])
  np.testing.assert_array_equal(a.batch(2)["x"], b.batch(2)["x"])
  # Each epoch is a permutation of all rows; epochs differ.
  stream = np.concatenate([a.batch(s)["x"][:, 0] for s in range(5)])  # 20 items = 2 epochs
  assert sorted(stream[:10]) == list(range(10)) and sorted(stream[10:]) == list(range(10))
  assert list(stream[:10]) != list(stream[10:])
  c = pipeline.DeterministicBatches(arrays, batch_size=4, seed=4)
  assert list(c.batch(0)["x"][:, 0]) != list(a.batch(0)["x"][:, 0])
  ordered = pipeline.DeterministicBatches(arrays, batch_size=4, shuffle=False)
  assert list(ordered.batch(2)["x"][:, 0]) == [8, 9, 0, 1]


def test_save_restore_roundtrip_keeps_sharding(tmp_path):
  tr = shared_trainer()
  state = initial_state()
  mgr = checkpoints.CheckpointManager(tmp_path / "model", save_interval_steps=1, async_save=False)
  assert mgr.restore_latest(tr.state_shapes(shapes())) is None
  assert mgr.save(0, state, {"data_seed": 5})
  step, restored, data = mgr.restore_latest(tr.state_shapes(shapes()))
  assert step == 0 and data == {"data_seed": 5, "step": 0}
  wi = restored.params["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
  assert wi.sharding.spec == jax.sharding.PartitionSpec(None, "model")
  for a, b in zip(
      jax.tree_util.tree_leaves(jax.device_get(state)),
      jax.tree_util.tree_leaves(jax.device_get(restored))):
    np.testing.assert_array_equal(a, b)


def test_keep_last_k_and_interval(tmp_path):
  mgr = checkpoints.CheckpointManager(
      tmp_path, save_interval_steps=2, max_to_keep=2, async_save=False)
  tree = trainer_lib.TrainState(step=np.int32(0), params={"w": np.arange(6.0)}, opt_state={})
  saved = [mgr.save(s, tree) for s in range(1, 8)]
  # Only the steps on the interval: no save of the first step the manager sees (Orbax's default).
  assert saved == [False, True, False, True, False, True, False]
  assert mgr.save(7, tree, force=True)
  assert mgr.all_steps() == [6, 7]
  # Atomicity: only finished checkpoints are listed (no temporary folders left behind).
  assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_6", "checkpoint_7"]
  assert checkpoint_paths.resolve_checkpoint(tmp_path) == (tmp_path, 7)
  # Orbax keeps no checkpoint at all for 0 (`LatestN(0)`): refused, as a negative count.
  for keep in (0, -1):
    with pytest.raises(checkpoints.KeepCheckpointsError, match=f"KEEP_CHECKPOINTS = {keep}: "):
      checkpoints.CheckpointManager(tmp_path / "other", max_to_keep=keep)


def test_corrupt_latest_falls_back_to_previous(trained_copy):
  model_dir, _ = trained_copy  # 2 training steps, a checkpoint after each
  tr = shared_trainer()
  mgr = checkpoints.CheckpointManager(model_dir, save_interval_steps=1, async_save=False)
  assert mgr.all_steps() == [1, 2]
  state1 = jax.device_get(mgr.restore(1, tr.state_shapes(shapes()))[0])
  tiny_engine.corrupt_checkpoint(model_dir / "checkpoint_2")
  step, restored, data = mgr.restore_latest(tr.state_shapes(shapes()))
  assert step == 1 and data["step"] == 1 and int(restored.step) == 1
  for a, b in zip(
      jax.tree_util.tree_leaves(state1), jax.tree_util.tree_leaves(jax.device_get(restored))):
    np.testing.assert_array_equal(a, b)
  tiny_engine.corrupt_checkpoint(model_dir / "checkpoint_1")
  with pytest.raises(
      checkpoints.NoUsableCheckpointError, match="no checkpoint .* could be restored"):
    mgr.restore_latest(tr.state_shapes(shapes()))


def test_kill_and_resume_reproduces_losses(tmp_path):
  """6 steps straight == 3 steps, 'kill' (new trainer + manager), restore, 3 more (dropout on)."""
  batches = pipeline.DeterministicBatches(synthetic_arrays(), 8, seed=11)
  tr = shared_trainer()
  p = tr.partitioner
  _, straight = train_losses(tr, initial_state(), batches, 0, 6)

  mgr1 = checkpoints.CheckpointManager(tmp_path, save_interval_steps=3, async_save=True)
  _, first = train_losses(tr, initial_state(), batches, 0, 3, ckpt=mgr1)
  mgr1.close()
  del mgr1

  tr2 = make_trainer(p)
  mgr2 = checkpoints.CheckpointManager(tmp_path, save_interval_steps=3)
  step, state, data = mgr2.restore_latest(tr2.state_shapes(shapes()))
  assert step == 3 and data["step"] == 3
  fresh = pipeline.DeterministicBatches(synthetic_arrays(), 8, seed=data["data_seed"])
  _, second = train_losses(tr2, state, fresh, step, 6)
  np.testing.assert_allclose(first + second, straight, rtol=1e-6)


def test_initial_checkpoint_import_into_sharded_state(trained_run, tmp_path):
  """INITIAL_CHECKPOINT_PATH path of train(): T5X-native checkpoint -> load_params -> state."""
  from mcwq_t5x.checkpointing import checkpoint_loaders  # pylint: disable=g-import-not-at-top
  from mcwq_t5x.checkpointing import t5x_checkpoint_writer  # pylint: disable=g-import-not-at-top
  # why: trained params, not the trainer's own initialisation (a state that ignored them differs)
  _, params = trained_run
  t5x_checkpoint_writer.save_t5x_checkpoint(params, tmp_path / "checkpoint_1000000", step=1000000)
  tr = shared_trainer()
  loaded = checkpoint_loaders.load_params(tmp_path / "checkpoint_1000000",
                                          tr.model.module.config).params
  state = tr.create_state(shapes(), init_params=loaded)
  assert int(state.step) == 0
  emb = state.params["token_embedder"]["embedding"]
  assert emb.sharding.spec == jax.sharding.PartitionSpec("model", None)
  for a, b in zip(
      jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(jax.device_get(state.params))):
    np.testing.assert_array_equal(a, b)


# --- Params-only restores, optimizer changes, paths ----------------------------------------------
@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
  """(MODEL_DIR, final params) of an Adafactor run of 2 updates with a checkpoint after each,
  trained once for the module; read-only (`trained_copy` gives a test its own copy)."""
  tr = shared_trainer()
  batches = pipeline.DeterministicBatches(synthetic_arrays(), 8, seed=2)
  model_dir = tmp_path_factory.mktemp("trained_run") / "model"
  mgr = checkpoints.CheckpointManager(model_dir, save_interval_steps=1, async_save=False)
  state, _ = train_losses(tr, initial_state(), batches, 0, 2, ckpt=mgr)
  mgr.close()
  return model_dir, jax.device_get(state.params)


@pytest.fixture
def trained_copy(trained_run, tmp_path):
  """`trained_run` copied to the test's `tmp_path / "model"` (the test may change it)."""
  model_dir, params = trained_run
  shutil.copytree(model_dir, tmp_path / "model")
  return tmp_path / "model", params


def _assert_same(a, b):
  for x, y in zip(jax.tree_util.tree_leaves(jax.device_get(a)), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(x, y)


def test_optimizer_change_clear_error_then_params_only_restore(trained_copy):
  model_dir, params = trained_copy
  p = shared_trainer().partitioner
  lr = trainer_lib.create_learning_rate_schedule(0.05, "constant")
  adamw = trainer_lib.Trainer(
      tiny_model(), p, lr, seed=1, optimizer=trainer_lib.make_optimizer(lr, name="adamw"))
  abstract = adamw.state_shapes(shapes())
  mgr = checkpoints.CheckpointManager(model_dir, save_interval_steps=1, async_save=False)
  # A full restore names the cause (not "unreadable", not NoUsableCheckpointError).
  with pytest.raises(
      checkpoints.OptimizerStateMismatchError,
      match=r"checkpoint_2: the optimizer state differs \(checkpoint has "
      r"\(FactoredState\(count, v_row, v_col, v\).* the run uses "
      r"\(ScaleByAdamState\(count, mu, nu\).*params_only=True"):
    mgr.restore_latest(abstract)
  with pytest.raises(checkpoints.MissingOptimizerError, match="params_only=True"):
    mgr.restore_latest(abstract, params_only=True)
  step, state, data = mgr.restore_latest(abstract, params_only=True, optimizer=adamw.optimizer)
  assert step == 2 and int(state.step) == 2 and data == {"step": 2, "data_seed": 2}
  _assert_same(state.params, params)
  adam_state = state.opt_state[0]
  assert int(adam_state.count) == 0
  assert all(
      float(np.abs(x).max()) == 0.0
      for x in jax.tree_util.tree_leaves(jax.device_get((adam_state.mu, adam_state.nu))))
  emb = state.opt_state[0].mu["token_embedder"]["embedding"]
  assert emb.sharding.spec == jax.sharding.PartitionSpec("model", None)
  # Training goes on with the new optimizer.
  new_state, m = adamw.train_step(state, p.make_global_batch(synthetic_arrays(8, seed=3)))
  assert np.isfinite(float(m["loss"])) and int(new_state.step) == 3
  assert int(new_state.opt_state[0].count) == 1
  # The unchanged optimizer still restores everything, optimizer state included.
  ada = shared_trainer()
  step, full, _ = mgr.restore_latest(ada.state_shapes(shapes()))
  assert step == 2 and int(full.opt_state[0].count) == 2


def test_a_checkpoint_that_lost_its_optimizer_state_is_unreadable(trained_copy):
  """checkpoint_2, saved with an optimizer state, has lost its optimizer/ item: damaged (not
  another optimizer's), so the intact checkpoint_1 is resumed. A checkpoint saved without one (an
  optimizer with no state) is another optimizer's: the error names the training main's macro."""
  model_dir, _ = trained_copy
  shutil.rmtree(model_dir / "checkpoint_2" / checkpoint_paths.OPTIMIZER_ITEM)
  tr = shared_trainer()
  mgr = checkpoints.CheckpointManager(model_dir, save_interval_steps=1, async_save=False)
  step, state, data = mgr.restore_latest(tr.state_shapes(shapes()))
  assert step == 1 and data["step"] == 1 and int(state.opt_state[0].count) == 1
  assert len(list(model_dir.glob("checkpoint_2.corrupt-*"))) == 1
  mgr.save(3, state.replace(opt_state=()), force=True)
  assert not (model_dir / "checkpoint_3" / checkpoint_paths.OPTIMIZER_ITEM).exists()
  with pytest.raises(
      checkpoints.OptimizerStateMismatchError,
      match=r"checkpoint_3: the optimizer state differs \(checkpoint has none, .*restore with "
      r"params_only=True \(mcwq_t5x.train: --gin.RESUME_PARAMS_ONLY=True\)"):
    mgr.restore_latest(tr.state_shapes(shapes()))


def test_restore_params_from_any_path_with_fallback_and_mismatch(trained_copy):
  model_dir, params = trained_copy
  tr = shared_trainer()
  abstract = tr.state_shapes(shapes()).params
  for path in (model_dir, model_dir / "checkpoint_2", model_dir / "checkpoint_2" / "state",
               str(model_dir / "checkpoint_1")):
    restored = checkpoints.restore_params(path, abstract)
    wi = restored["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
    assert wi.sharding.spec == jax.sharding.PartitionSpec(None, "model")
    if str(path).endswith("checkpoint_1"):
      final_wi = params["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
      assert not np.array_equal(np.asarray(wi), final_wi)  # step 1, not step 2
    else:
      _assert_same(restored, params)
  # INITIAL_CHECKPOINT_PATH: params of our own run start a new state at step 0.
  state = tr.create_state(shapes(), init_params=checkpoints.restore_params(model_dir, abstract))
  assert int(state.step) == 0
  _assert_same(state.params, params)
  # A parameter the checkpoint lacks: an error naming it, or fallback_to_scratch semantics.
  extra = dict(abstract, extra={"kernel": jax.ShapeDtypeStruct((3,), np.float32)})
  with pytest.raises(
      checkpoint_paths.CheckpointMismatchError,
      match=r"checkpoint_2: 1 parameter\(s\) missing from the checkpoint: "
      r"extra/kernel \(shape \(3,\)\)"):
    checkpoints.restore_params(model_dir, extra)
  fallback = {"extra": {"kernel": np.array([1.0, 2.0, 3.0], np.float32)}}
  restored = checkpoints.restore_params(model_dir, extra, fallback_params=fallback)
  np.testing.assert_array_equal(np.asarray(restored["extra"]["kernel"]), [1.0, 2.0, 3.0])
  _assert_same({k: v for k, v in restored.items() if k != "extra"}, params)
  # Another model size: named at once by restore_latest (no fall back to older checkpoints).
  wider = trainer_lib.Trainer(
      tiny_engine.tiny_model(0.1, mlp_dim=48),
      partitioning.Partitioner(num_partitions=2),
      trainer_lib.create_learning_rate_schedule(0.05),
      seed=1)
  mgr = checkpoints.CheckpointManager(model_dir, async_save=False)
  with pytest.raises(
      checkpoint_paths.CheckpointMismatchError,
      match=r"checkpoint_2: \d+ parameter\(s\) differ from the model .*"
      r"decoder/layers_0/mlp/wi_0/kernel has shape \(16, 32\), the model "
      r"expects \(16, 48\)"):
    mgr.restore_latest(wider.state_shapes(shapes()), params_only=True, optimizer=wider.optimizer)


def test_resolve_checkpoint_rejects_what_is_not_a_checkpoint(tmp_path):
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / "config.json").write_text("{}")
  with pytest.raises(checkpoint_paths.NotACheckpointError, match=r"hf: no checkpoint: expected"):
    checkpoint_paths.resolve_checkpoint(tmp_path / "hf")
  # An unfinished folder (as left by a killed writer) is not a checkpoint.
  (tmp_path / "m" / "checkpoint_5").mkdir(parents=True)
  with pytest.raises(checkpoint_paths.NotACheckpointError, match="checkpoint_5: not a finished"):
    checkpoint_paths.resolve_checkpoint(tmp_path / "m" / "checkpoint_5")
  with pytest.raises(FileNotFoundError):
    checkpoint_paths.resolve_checkpoint(tmp_path / "m")
  (tmp_path / "old" / "checkpoints" / "100" / "state").mkdir(parents=True)
  with pytest.raises(checkpoint_paths.NotACheckpointError, match="not a checkpoint layout"):
    checkpoint_paths.resolve_checkpoint(tmp_path / "old")


def test_the_checkpoint_layout_in_an_object_store(local_gcs):
  """A MODEL_DIR in a bucket (the stand-in on 127.0.0.1): its finished steps, its newest, the format
  of a step, what a folder without checkpoint files holds, and `..` kept inside the bucket. Before,
  `pathlib.Path("gs://runs/model")` was "gs:/runs/model", a local path that did not exist."""
  model_dir = local_gcs.root / "runs" / "model"
  for step in (3, 5):
    (model_dir / f"checkpoint_{step}").mkdir(parents=True)
    (model_dir / f"checkpoint_{step}" / checkpoint_paths.T5X_MSGPACK_FILE).write_bytes(b"\x80")
  (model_dir / "checkpoint_7").mkdir()  # a killed writer's folder: no checkpoint file
  (model_dir / "checkpoint_7" / "notes.txt").write_text("")
  url = "gs://runs/model"
  path = checkpoint_paths.as_path(url)
  assert isinstance(path, checkpoint_paths.StorePath) and str(path) == url
  assert str(path / "checkpoint_5" / "checkpoint") == f"{url}/checkpoint_5/checkpoint"
  assert checkpoint_paths.finished_steps(url) == [3, 5]
  assert checkpoint_paths.resolve_checkpoint(url) == (path, 5)
  assert checkpoint_paths.locate(f"{url}/checkpoint_3/checkpoint") == (checkpoint_paths.FORMAT_T5X,
                                                                       path / "checkpoint_3")
  with pytest.raises(checkpoint_paths.NotACheckpointError) as e:
    checkpoint_paths.locate(f"{url}/checkpoint_7")
  assert str(e.value) == (
      f"{url}/checkpoint_7: not a checkpoint: the folder holds no checkpoint files (it has: "
      "notes.txt); expected its 'state/' Orbax item (mcwq_t5x.train, t5x.train) or a "
      "'checkpoint' msgpack file (T5X)")
  with pytest.raises(
      checkpoint_paths.NotACheckpointError,
      match=r"^gs://runs/mode: not a checkpoint: no such file or folder; "):
    checkpoint_paths.locate("gs://runs/mode")
  assert checkpoint_paths.inside_folder(path, "a/../b") == path / "b"
  for outside in ("../x", "/runs/x", "../../other/model"):
    with pytest.raises(checkpoint_paths.CheckpointOutsideFolderError, match="outside"):
      checkpoint_paths.inside_folder(path, outside)
  assert all(p.startswith("/storage/v1/b/runs/o") for p in local_gcs.seen), local_gcs.seen
  assert checkpoint_paths.kvstore_spec(checkpoint_paths.as_path("s3://b/k/")) == {
      "driver": "s3",
      "bucket": "b",
      "path": "k"
  }
  with pytest.raises(checkpoint_paths.NotACheckpointError, match="^hf://x/y: not a local path"):
    checkpoint_paths.as_path("hf://x/y")


# --- Faults: corrupt checkpoints, failed saves --------------------------------------------------
def test_params_of_a_model_dir_skip_a_corrupt_newest_checkpoint(trained_copy, caplog):
  """eval/infer on a MODEL_DIR whose newest checkpoint is corrupt: the newest readable one, with a
  warning naming the corrupt one; a corrupt checkpoint named by its folder: a clear error."""
  from mcwq_t5x.evaluation import prediction  # pylint: disable=g-import-not-at-top
  model_dir, _ = trained_copy
  tr = shared_trainer()
  p = tr.partitioner
  abstract = tr.state_shapes(shapes()).params
  step1 = jax.device_get(checkpoints.restore_params(model_dir / "checkpoint_1", abstract))
  tiny_engine.corrupt_checkpoint(model_dir / "checkpoint_2")
  with caplog.at_level("WARNING"):
    params, step, folder = prediction.load_params(tr.model, p, str(model_dir))
  assert (step, folder) == (1, model_dir.absolute())
  _assert_same(params, step1)
  assert any("checkpoint_2 is unreadable" in r.getMessage() for r in caplog.records)
  for named in (model_dir / "checkpoint_2", model_dir / "checkpoint_2" / "state"):
    with pytest.raises(
        checkpoints.UnreadableCheckpointError,
        match=r"checkpoint .*checkpoint_2 is unreadable \(.*\); name another checkpoint_<step> "
        r"folder, or the MODEL_DIR"):
      checkpoints.restore_params(named, abstract)
  tiny_engine.corrupt_checkpoint(model_dir / "checkpoint_1")
  with pytest.raises(checkpoints.NoUsableCheckpointError, match="checkpoint_1 is unreadable"):
    checkpoints.restore_params(model_dir, abstract)


def test_resume_past_a_corrupt_checkpoint_moves_it_aside(trained_copy):
  """Resuming from checkpoint_1 past a corrupt checkpoint_2 renames checkpoint_2 aside, so the run
  writes step 2 again and retention (keep 2) keeps the readable checkpoints, not the corrupt one."""
  model_dir, _ = trained_copy
  tiny_engine.corrupt_checkpoint(model_dir / "checkpoint_2")
  tr = shared_trainer()
  mgr = checkpoints.CheckpointManager(
      model_dir, save_interval_steps=1, max_to_keep=2, async_save=False)
  step, state, _ = mgr.restore_latest(tr.state_shapes(shapes()))
  assert step == 1 and mgr.all_steps() == [1]
  aside = [c.name for c in model_dir.iterdir() if c.name.startswith("checkpoint_2.corrupt-")]
  assert len(aside) == 1, sorted(c.name for c in model_dir.iterdir())
  batches = pipeline.DeterministicBatches(synthetic_arrays(), 8, seed=2)
  train_losses(tr, state, batches, 1, 3, ckpt=mgr)
  mgr.close()
  assert mgr.all_steps() == [2, 3]
  assert checkpoint_paths.resolve_checkpoint(model_dir) == (model_dir.absolute(), 3)
  # Both are readable: the rewritten step 2 is not the corrupt one.
  for s in (2, 3):
    checkpoints.restore_params(model_dir / f"checkpoint_{s}", tr.state_shapes(shapes()).params)


def _fail_json_writes(monkeypatch, error=None):
  """Makes the writer of the `data/` item fail as on a full disk (in the asynchronous commit), or
  with `error`."""
  import errno  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

  async def disk_full(self, x, directory):
    del self, x, directory
    raise error or OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(ocp.JsonCheckpointHandler, "_save_fn", disk_full)


def test_failed_async_save_is_one_clear_error(tmp_path, monkeypatch):
  """A failed asynchronous save surfaces, at the next save or wait, as one CheckpointSaveError
  naming the checkpoint, the cause and the last good checkpoint; that one is kept and the manager
  closes cleanly."""
  tree = trainer_lib.TrainState(step=np.int32(0), params={"w": np.arange(6.0)}, opt_state={})
  mgr = checkpoints.CheckpointManager(tmp_path, save_interval_steps=1, max_to_keep=1)
  assert mgr.save(1, tree)
  mgr.wait()
  _fail_json_writes(monkeypatch)
  assert mgr.save(2, tree)  # written in the background: fails there
  expected = (
      r"writing checkpoint .*checkpoint_2 failed: no space left on device \(OSError: "
      r"\[Errno 28\] No space left on device\); the last good checkpoint is .*checkpoint_1; "
      r"free disk space, then rerun the same command to resume$")
  with pytest.raises(checkpoints.CheckpointSaveError, match=expected):
    mgr.save(3, tree)
  assert mgr.all_steps() == [1]  # retention did not delete the last good checkpoint
  mgr.wait()  # reported once
  assert mgr.save(3, tree)
  with pytest.raises(checkpoints.CheckpointSaveError, match="checkpoint_3 failed"):
    mgr.close()  # the pending save's failure, and the manager is released all the same
  mgr.close()
  assert mgr.all_steps() == [1]


# TensorStore's error for an array write on a full disk (ENOSPC as os_error_code), on two lines as
# it can be, and its error for memory, which is no disk's.
TENSORSTORE_DISK_FULL = ValueError(
    'RESOURCE_EXHAUSTED: Error writing local file "/m/checkpoint_2.orbax-checkpoint-tmp/state/'
    '_sharding":\nFailed to write 14729 bytes to file 9: No space left on device '
    "[os_error_code='28']")
TENSORSTORE_NO_MEMORY = ValueError(
    "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8 GiB")


@pytest.mark.parametrize("error, hint",
                         [(TENSORSTORE_DISK_FULL, "ValueError: RESOURCE_EXHAUSTED: "),
                          (OSError(28, "No space left on device"), "OSError: "),
                          (TENSORSTORE_NO_MEMORY, None)])
def test_a_save_failing_in_tensorstore_on_a_full_disk_says_free_disk_space(
    tmp_path, monkeypatch, error, hint):
  """TensorStore reports a full disk as ValueError(RESOURCE_EXHAUSTED ... os_error_code='28'), Python
  as OSError(ENOSPC): one line with the hint; TensorStore's out-of-memory error (also
  RESOURCE_EXHAUSTED) gets none. Orbax's error
  records of the failed writes (each with a traceback) are dropped for the full disk alone."""
  import logging  # pylint: disable=g-import-not-at-top
  tree = trainer_lib.TrainState(step=np.int32(0), params={"w": np.arange(6.0)}, opt_state={})
  mgr = checkpoints.CheckpointManager(tmp_path, save_interval_steps=1, max_to_keep=1)
  assert mgr.save(1, tree)
  mgr.wait()
  records = []
  handler = logging.Handler(logging.ERROR)
  handler.emit = records.append
  for name in ("absl", "asyncio"):
    logging.getLogger(name).addHandler(handler)
  try:
    _fail_json_writes(monkeypatch, error)
    assert mgr.save(2, tree)
    with pytest.raises(checkpoints.CheckpointSaveError) as e:
      mgr.wait()
  finally:
    for name in ("absl", "asyncio"):
      logging.getLogger(name).removeHandler(handler)
  message = str(e.value)
  assert "\n" not in message and f"{tmp_path}/checkpoint_1" in message
  if hint:
    assert message.startswith(f"writing checkpoint {tmp_path}/checkpoint_2 failed: no space left "
                              f"on device ({hint}")
    assert message.endswith("; free disk space, then rerun the same command to resume")
    assert records == []
  else:
    assert message.startswith(f"writing checkpoint {tmp_path}/checkpoint_2 failed (ValueError: "
                              "RESOURCE_EXHAUSTED: Out of memory")
    assert "free disk space" not in message and records  # Orbax's own records are kept
  mgr.close()
  assert mgr.all_steps() == [1]
