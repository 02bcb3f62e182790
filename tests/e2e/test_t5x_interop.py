"""Our engine against the real T5X (installed from ../shared/wheels), on CPU with tiny shapes.

* the networks: `mcwq_t5x.engine.network.Transformer` and `t5x.examples.t5.network.Transformer` have the
  same parameter tree and, given T5X's initial parameters, the same logits (float32, 1e-5) and the
  same greedy decodes on real MCWQ batches with padding;
* checkpoints both ways: what `t5x.train` writes (its Orbax manager) and T5X's legacy
  `Checkpointer` (msgpack + zarr) restore in our engine; what our `CheckpointManager` writes
  restores in T5X, the way `t5x.eval` does it (`create_checkpoint_manager_and_restore`,
  `RestoreCheckpointConfig(mode='specific'/'latest')`) and the way `t5x.train` starts from a
  checkpoint with a fresh Adafactor state (`assignment_map` + `fallback_to_scratch`).
"""
import dataclasses
import functools
import logging

import flax.core
import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip(
    "t5x.train", reason="the real T5X is not installed (bash scripts/install_t5x.sh)")
# pylint: disable=g-import-not-at-top,wrong-import-position
from t5x import adafactor as t5x_adafactor
from t5x import checkpoints as t5x_checkpoints
from t5x import decoding as t5x_decoding
from t5x import models as t5x_models
from t5x import partitioning as t5x_partitioning
from t5x import trainer as t5x_trainer
from t5x import utils as t5x_utils
from t5x.examples.t5 import network as t5x_network

from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import checkpoints
from mcwq_t5x.data import vocab as vocab_lib
from mcwq_t5x.engine import model as model_lib
from mcwq_t5x.engine import network
from mcwq_t5x.engine import partitioning
from mcwq_t5x.engine import trainer as trainer_lib
from mcwq_t5x.t5x_bridge import models as bridge

import tiny_engine

NUM_EXAMPLES = 48


def tiny_config(vocab_size, **overrides):
  """The network of both engines here: 2+2 layers of width 32, 8 heads of 4, MLP 64, gated GELU,
  untied output layer, no dropout. 8 heads: on CPU T5X's PjitPartitioner puts all 8 test devices
  on its 'model' axis, which must divide the heads."""
  return tiny_engine.config(
      vocab_size, layers=2, emb_dim=32, num_heads=8, head_dim=4, mlp_dim=64, **overrides)


def t5x_config(config):
  """T5X's `T5Config` of our `config`: the fields T5X has (it hard-codes 32 relative-position
  buckets, max distance 128 and RMS-norm epsilon 1e-6, our defaults)."""
  assert (config.relative_attention_num_buckets, config.relative_attention_max_distance,
          config.layer_norm_epsilon) == (32, 128, 1e-6), config
  return t5x_network.T5Config(**{
      field.name: getattr(config, field.name) for field in dataclasses.fields(t5x_network.T5Config)
  })


def t5x_model(vocab_size, vocabulary=None, decode_fn=t5x_decoding.beam_search):
  vocabulary = vocabulary or seqio_passthrough(vocab_size)
  module = t5x_network.Transformer(t5x_config(tiny_config(vocab_size)))
  return t5x_models.EncoderDecoderModel(
      module,
      vocabulary,
      vocabulary,
      t5x_adafactor.Adafactor(decay_rate=0.8, step_offset=0),
      decode_fn=decode_fn)


def bridge_model(vocab_size, vocabulary=None, decode_fn=t5x_decoding.beam_search):
  """T5X's model on our engine (`mcwq_t5x.t5x_bridge.models`, what the gin files build) of the
  same network and optimizer as `t5x_model`."""
  vocabulary = vocabulary or seqio_passthrough(vocab_size)
  module = bridge.transformer(t5x_config(tiny_config(vocab_size)))
  return bridge.EncoderDecoderModel(
      module,
      vocabulary,
      vocabulary,
      t5x_adafactor.Adafactor(decay_rate=0.8, step_offset=0),
      decode_fn=decode_fn)


def seqio_passthrough(size):
  import seqio  # pylint: disable=g-import-not-at-top
  return seqio.PassThroughVocabulary(size, eos_id=1)


def our_model(vocab_size, vocabulary=None):
  cfg = tiny_config(vocab_size)
  return model_lib.EncoderDecoderModel(network.Transformer(cfg), vocabulary, vocabulary)


def unfrozen(tree):
  return flax.core.unfreeze(tree)


def assert_trees_equal(a, b):
  fa = jax.tree_util.tree_flatten_with_path(jax.device_get(unfrozen(a)))[0]
  fb = jax.tree_util.tree_flatten_with_path(jax.device_get(unfrozen(b)))[0]
  assert [p for p, _ in fa] == [p for p, _ in fb]
  for (path, x), (_, y) in zip(fa, fb):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(path))


# ------------------------------------------------------------------------------------------------
# (a) The networks.
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mcwq_batch(mcwq_dir):
  """48 questions + RIR targets of MCD1 test (English), tokenised with the project's vocabulary,
  EOS-terminated and zero-padded to the longest row: a feature-converter batch."""
  folder = mcwq_dir / "translations" / "mcd1"
  questions = (folder / "test.en.txt").read_text(encoding="utf-8").splitlines()[:NUM_EXAMPLES]
  queries = (folder / "test.en.sparql").read_text(encoding="utf-8").splitlines()[:NUM_EXAMPLES]
  vocabulary = vocab_lib.get_vocabulary()
  return vocabulary, tiny_engine.feature_batch(
      [list(vocabulary.encode(q)) + [1] for q in questions],
      [list(vocabulary.encode(q)) + [1] for q in queries])


@pytest.mark.parametrize("vocab_size, overrides",
                         [(64, {}), (250112, dict(num_encoder_layers=8, num_decoder_layers=8))])
def test_parameter_trees_are_t5x_trees(vocab_size, overrides):
  """Same names, shapes and dtypes as T5X's example network for the same config (mT5 sizes too:
  vocabulary 250112, 8+8 layers, so that mT5 checkpoints map one to one)."""
  shapes = {"encoder_input_tokens": (2, 8), "decoder_input_tokens": (2, 6)}
  types = {k: jnp.int32 for k in shapes}
  config = tiny_config(vocab_size, **overrides)
  ours = network.Transformer(config)
  theirs = t5x_network.Transformer(t5x_config(config))
  ours_shapes = jax.eval_shape(
      lambda r: model_lib.unbox(
          model_lib.EncoderDecoderModel(ours).get_initial_variables(r, shapes, types)["params"]),
      jax.random.PRNGKey(0))
  t5x_shapes = jax.eval_shape(
      lambda r: unfrozen(
          t5x_models.EncoderDecoderModel(theirs, None, None, None).get_initial_variables(
              r, shapes, types)["params"]), jax.random.PRNGKey(0))
  flat = lambda t: {
      jax.tree_util.keystr(p): (x.shape, x.dtype)
      for p, x in jax.tree_util.tree_flatten_with_path(t)[0]
  }
  assert flat(ours_shapes) == flat(t5x_shapes)
  layers_enc = overrides.get("num_encoder_layers", 2)
  layers_dec = overrides.get("num_decoder_layers", 2)
  # embedding, 2 final norms, 2 relative-position tables, logits_dense; 9 per encoder layer
  # (q, k, v, out, wi_0, wi_1, wo, 2 norms), 14 per decoder layer (2 attentions, 3 norms).
  assert len(flat(ours_shapes)) == 6 + 9 * layers_enc + 14 * layers_dec
  assert "['decoder']['logits_dense']['kernel']" in flat(ours_shapes)


def test_same_logits_and_greedy_decodes_as_t5x(mcwq_batch):
  """T5X initialises, both apply: logits within 1e-5, identical greedy decodes and scores."""
  vocabulary, batch = mcwq_batch
  vocab_size = vocabulary.vocab_size
  assert (batch["encoder_input_tokens"] == 0).any() and (batch["decoder_target_tokens"] == 0).any()
  greedy = functools.partial(
      t5x_decoding.temperature_sample, temperature=0.0, topk=1,
      rescale_log_probs=False)  # raw log-probs as scores, as ours
  theirs = t5x_model(vocab_size, vocabulary, decode_fn=greedy)
  ours = our_model(vocab_size, vocabulary)
  shapes = {k: v.shape for k, v in batch.items()}
  # Jitted (op by op, every primitive compiled apart: twice the time).
  params = unfrozen(
      jax.jit(lambda rng: theirs.get_initial_variables(rng, shapes, {k: jnp.int32 for k in shapes}))
      (jax.random.PRNGKey(7))["params"])

  args = (batch["encoder_input_tokens"], batch["decoder_input_tokens"],
          batch["decoder_target_tokens"])

  def logits(model):
    return np.asarray(
        jax.jit(functools.partial(model.module.apply, enable_dropout=False))({
            "params": params
        }, *args))

  t5x_logits, our_logits = logits(theirs), logits(ours)
  assert our_logits.shape == t5x_logits.shape == args[2].shape + (vocab_size,)
  assert np.std(t5x_logits) > 0.1  # a real forward pass, not zeros
  max_diff = float(np.max(np.abs(our_logits - t5x_logits)))
  logging.info("max |logit difference| ours vs T5X: %.3g", max_diff)
  print(f"max |logit difference| ours vs T5X: {max_diff:.3g}")
  assert max_diff <= 1e-5

  t5x_tokens, t5x_aux = jax.jit(
      lambda p, b: theirs.predict_batch_with_aux(p, b, rng=jax.random.PRNGKey(0)))(params, batch)
  our_tokens, our_aux = jax.jit(ours.predict_batch_with_aux)(params, batch)
  t5x_tokens, our_tokens = np.asarray(t5x_tokens), np.asarray(our_tokens)
  assert t5x_tokens.shape == our_tokens.shape == args[2].shape
  assert len({tuple(r) for r in t5x_tokens}) > 1  # rows decode differently
  np.testing.assert_array_equal(our_tokens, t5x_tokens)
  np.testing.assert_allclose(
      np.asarray(our_aux["scores"]), np.asarray(t5x_aux["scores"]), rtol=1e-5, atol=1e-4)


# ------------------------------------------------------------------------------------------------
# (b) T5X's checkpoints in our engine.
# ------------------------------------------------------------------------------------------------
VOCAB = tiny_engine.VOCAB
SHAPES = tiny_engine.SHAPES
TYPES = {k: jnp.int32 for k in SHAPES}


@functools.cache
def t5x_initializer(optimizer_def):
  """(model, partitioner, `TrainStateInitializer`) of the tiny config, as `t5x.train`
  (`optimizer_def`) or `t5x.eval` (None) builds them: one of each per module, as one T5X process
  uses one for every checkpoint it restores (its jitted initialisation compiled once)."""
  partitioner = t5x_partitioning.PjitPartitioner(num_partitions=1)
  model = t5x_model(VOCAB)
  init = t5x_utils.TrainStateInitializer(model.optimizer_def if optimizer_def else None,
                                         model.get_initial_variables, SHAPES, partitioner, TYPES)
  return model, partitioner, init


def t5x_trained_state():
  """A real T5X `FlaxOptimTrainState` (Adafactor) of the tiny config after one update."""
  model, _, init = t5x_initializer(True)
  state = init.from_scratch(jax.random.PRNGKey(3))
  batch = {k: jnp.asarray(v) for k, v in tiny_engine.synthetic_batch(5).items()}
  # Jitted: op by op, the gradient and the update would compile every primitive apart (slow).
  grads = jax.jit(jax.grad(lambda p: model.loss_fn(p, batch, None)[0]))(state.params)
  return jax.jit(lambda s, g: s.apply_gradient(g, learning_rate=0.05))(state, grads)


@functools.cache
def our_trainer():
  """Our engine's Trainer of the tiny config (2 model partitions), one per module: its train step
  compiles once for the tests that restore into it and the fixture that trains with it."""
  p = partitioning.Partitioner(num_partitions=2)
  lr = trainer_lib.create_learning_rate_schedule(0.01, "constant")
  return trainer_lib.Trainer(our_model(VOCAB), p, lr, seed=0)


@pytest.fixture(scope="module")
def t5x_written(tmp_path_factory):
  """MODEL_DIRs written by T5X: its Orbax manager (as `t5x.train` by default) and its legacy
  msgpack+zarr `Checkpointer`."""
  root = tmp_path_factory.mktemp("t5x_written")
  _, partitioner, init = t5x_initializer(True)
  state = t5x_trained_state()
  assert int(state.step) == 1
  orbax_dir, legacy_dir = root / "orbax", root / "legacy"
  orbax_dir.mkdir()
  mgr = t5x_checkpoints.OrbaxCheckpointManagerInterface(
      str(orbax_dir), init.global_train_state_shape, partitioner, keep=2, period=1)
  assert mgr.save(state)
  mgr.wait_until_finished()
  mgr.close()
  t5x_checkpoints.Checkpointer(init.global_train_state_shape, partitioner,
                               str(legacy_dir)).save(state)
  return orbax_dir, legacy_dir, jax.device_get(unfrozen(state.params))


@pytest.mark.parametrize("layout", ["orbax", "legacy"])
def test_restore_checkpoint_written_by_t5x(t5x_written, layout, caplog):
  orbax_dir, legacy_dir, t5x_params = t5x_written
  model_dir = orbax_dir if layout == "orbax" else legacy_dir
  assert sorted(
      p.name for p in model_dir.iterdir() if p.name.startswith("checkpoint")) == ["checkpoint_1"]
  assert checkpoint_paths.checkpoint_format(model_dir / "checkpoint_1") == (
      checkpoint_paths.ITEM_FORMAT_T5X_ORBAX
      if layout == "orbax" else checkpoint_paths.ITEM_FORMAT_T5X_MSGPACK)
  tr = our_trainer()
  abstract = tr.state_shapes(SHAPES)
  mgr = checkpoints.CheckpointManager(model_dir, save_interval_steps=1, async_save=False)
  with pytest.raises(checkpoints.MissingOptimizerError, match="written by T5X"):
    mgr.restore_latest(abstract)
  with caplog.at_level(logging.WARNING):
    step, state, data = mgr.restore_latest(abstract, optimizer=tr.optimizer)
  assert "the optimizer state is created fresh" in caplog.text
  assert "Adafactor state is not optax's" in caplog.text
  assert step == 1 and int(state.step) == 1 and data == {"step": 1}
  assert_trees_equal(state.params, t5x_params)
  wi = state.params["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
  assert wi.sharding.spec == jax.sharding.PartitionSpec(None, "model")
  assert_trees_equal(state.opt_state, tr.optimizer.init(jax.device_get(state.params)))
  # A restored T5X state trains in our engine.
  _, metrics = tr.train_step(state,
                             tr.partitioner.make_global_batch(tiny_engine.synthetic_batch(6)))
  assert np.isfinite(float(metrics["loss"]))
  # Params-only restore through every way of naming the checkpoint.
  for path in (model_dir, model_dir / "checkpoint_1",
               model_dir / "checkpoint_1" / ("state" if layout == "orbax" else "checkpoint")):
    assert checkpoint_paths.resolve_checkpoint(path) == (model_dir, 1)
    assert_trees_equal(checkpoints.restore_params(path, abstract.params), t5x_params)


def test_t5x_checkpoint_continues_in_t5x_with_our_engines_model(t5x_written):
  """A checkpoint `t5x.train` wrote with T5X's own model (before the gin files switched to
  `mcwq_t5x.t5x_bridge`) restores unchanged, Adafactor state included, in T5X with the model of
  the gin files, and T5X's trainer continues it as with T5X's own model: the same loss and the
  same parameters after the next step."""
  orbax_dir, _, t5x_params = t5x_written
  partitioner = t5x_partitioning.PjitPartitioner(num_partitions=1)
  batch = {k: jnp.asarray(v) for k, v in tiny_engine.synthetic_batch(8).items()}
  continued = {}
  for name, model in (("ours", bridge_model(VOCAB)), ("t5x", t5x_model(VOCAB))):
    init = t5x_utils.TrainStateInitializer(model.optimizer_def, model.get_initial_variables, SHAPES,
                                           partitioner, TYPES)
    restore_cfg, paths = t5x_utils.get_first_valid_restore_config_and_paths(
        [t5x_utils.RestoreCheckpointConfig(path=str(orbax_dir), mode="latest")])
    state, _ = t5x_utils.create_checkpoint_manager_and_restore(
        init, partitioner, restore_cfg, paths[0], jax.random.PRNGKey(0), use_orbax=True)
    assert int(state.step) == 1
    assert_trees_equal(state.params, t5x_params)
    restored_states = jax.device_get(unfrozen(state.param_states))  # why: the step donates them
    trainer = t5x_trainer.Trainer(
        model,
        state,
        partitioner,
        eval_names=[],
        summary_dir=None,
        train_state_axes=init.train_state_axes,
        rng=jax.random.PRNGKey(0),
        learning_rate_fn=lambda step: 0.05,
        num_microbatches=None)
    metrics = trainer.train(iter([batch]), 1).result()
    continued[name] = (metrics, jax.device_get(unfrozen(trainer.train_state.params)),
                       restored_states)
    assert int(trainer.train_state.step) == 2
  (o_metrics, o_params, o_states), (t_metrics, t_params,
                                    t_states) = continued["ours"], continued["t5x"]
  assert_trees_equal(o_states, t_states)  # the restored Adafactor statistics
  # T5X's summaries of the step (clu `Scalar`s).
  np.testing.assert_allclose(o_metrics["loss"].value, t_metrics["loss"].value, rtol=1e-6)
  np.testing.assert_allclose(o_metrics["accuracy"].value, t_metrics["accuracy"].value, rtol=1e-6)
  assert o_metrics["loss"].value > 0
  moved = 0
  for o, t, before in zip(
      jax.tree_util.tree_leaves(o_params), jax.tree_util.tree_leaves(t_params),
      jax.tree_util.tree_leaves(jax.device_get(unfrozen(t5x_params)))):
    np.testing.assert_allclose(o, t, rtol=1e-5, atol=1e-6)
    moved += int(not np.array_equal(t, before))
  assert moved == len(jax.tree_util.tree_leaves(t_params))  # a real step, of every parameter


# ------------------------------------------------------------------------------------------------
# (c) Our checkpoints in T5X.
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ours_written(tmp_path_factory):
  """A MODEL_DIR written by our CheckpointManager after two Adafactor updates."""
  model_dir = tmp_path_factory.mktemp("ours_written")
  tr = our_trainer()
  state = tr.create_state(SHAPES)
  mgr = checkpoints.CheckpointManager(model_dir, save_interval_steps=1, async_save=True)
  for step in range(2):
    state, _ = tr.train_step(state,
                             tr.partitioner.make_global_batch(tiny_engine.synthetic_batch(step)))
    mgr.save(step + 1, state, {"data_seed": 4, "global_batch_size": 8})
  mgr.close()
  return model_dir, jax.device_get(state.params)


def t5x_restore(path, mode, optimizer_def, **cfg):
  """T5X's restore as `t5x.eval.evaluate` (optimizer_def=None) / `t5x.train.train` run it."""
  _, partitioner, init = t5x_initializer(bool(optimizer_def))
  restore_cfg = t5x_utils.RestoreCheckpointConfig(path=str(path), mode=mode, **cfg)
  restore_cfg.strict = False  # t5x.eval: "we are dropping the optimizer state"
  restore_cfg, paths = t5x_utils.get_first_valid_restore_config_and_paths([restore_cfg])
  assert len(paths) == 1
  state, _ = t5x_utils.create_checkpoint_manager_and_restore(
      init, partitioner, restore_cfg, paths[0], jax.random.PRNGKey(0), use_orbax=True)
  return init, state, paths[0]


@pytest.mark.parametrize("mode", ["specific", "latest"])
def test_t5x_eval_restores_our_checkpoint(ours_written, mode):
  model_dir, params = ours_written
  path = model_dir / "checkpoint_2" if mode == "specific" else model_dir
  _, state, restored_path = t5x_restore(path, mode, optimizer_def=False)
  assert restored_path == str(model_dir / "checkpoint_2")
  assert type(state).__name__ == "InferenceState" and int(state.step) == 2
  assert_trees_equal(state.params, params)


def test_t5x_train_starts_from_our_checkpoint_with_fresh_adafactor(ours_written):
  """T5X's supported way to start from a checkpoint with foreign optimizer state: leave
  `state/param_states` unassigned and fill it from scratch."""
  model_dir, params = ours_written
  init, state, _ = t5x_restore(
      model_dir / "checkpoint_2",
      "specific",
      optimizer_def=True,
      assignment_map=((r"state/param_states.*", None),),
      fallback_to_scratch=True)
  assert type(state).__name__ == "FlaxOptimTrainState" and int(state.step) == 2
  assert_trees_equal(state.params, params)
  assert_trees_equal(state.param_states, init.from_scratch(jax.random.PRNGKey(0)).param_states)
