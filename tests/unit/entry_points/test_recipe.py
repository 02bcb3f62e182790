"""The paper's training recipe (the recipe card, docs/recipe.md) in the generated experiment files of both
engines, value by value, for every experiment (32 mT5 files, 8 T5-base files, and the zero-shot,
gold and test evaluation files); the T5X-habit alternative; best-by-dev-loss checkpoint keeping; and
a tiny run of each engine with the recipe (sizes and steps overridden; the real T5X's is the
README's run of the paper file) that keeps the checkpoint of the lowest dev loss and decodes it.

Recipe (Cui et al., TACL 2022, Sec. 5; coastalcph/seq2sparql hf/run_mt5.sh, hf/run_t5.sh,
hf/pred_eval_mt5_zero_shot.sh with the Hugging Face Seq2SeqTrainer's defaults): AdamW (0.9, 0.999,
1e-8, weight decay 0), gradient norm clipped at 1.0, learning rate 5e-4 decaying linearly to 0 over
50K steps without warm-up, batch 12 (mT5-base) / 24 (mT5-small) / 36 (T5-base), inputs
`translate {Language} to Sparql: ` + question (up to 256 tokens), targets up to 512, dev loss every
500 steps, the checkpoint with the lowest dev loss decoded greedily, seed 16 (mT5) / 8 (T5-base,
second seed 16).

T5X's files are parsed in a fresh process (its model files bind short selectors that clash with
ours once those are registered), ours in this one.
"""
import json
import pathlib

import gin
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mcwq_t5x.checkpointing import best_checkpoint
from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import checkpoints
from mcwq_t5x.data import pipeline
from mcwq_t5x.engine import network
from mcwq_t5x.engine import trainer as trainer_lib
from mcwq_t5x import gin_utils
import readme_commands as rc
import scenarios

REPO = pathlib.Path(__file__).resolve().parents[3]
SPLITS = ("mcd1", "mcd2", "mcd3", "random_split")
LANGUAGE_NAMES = {"en": "English", "he": "Hebrew", "kn": "Kannada", "zh": "Chinese"}
DEV_ROWS = {"mcd1": 5408, "mcd2": 5929, "mcd3": 6034, "random_split": 6163}
# model -> (batch size, seed, languages)
PAPER = {
    "mt5_small": (24, 16, ("en", "he", "kn", "zh")),
    "mt5_base": (12, 16, ("en", "he", "kn", "zh")),
    "t5_base": (36, 8, ("en",)),
}
LR, STEPS, CLIP, EVAL_PERIOD = 5e-4, 50_000, 1.0, 500
LENGTHS = {"inputs": 256, "targets": 512}


def _experiments():
  """(file stem, model, split, lang, batch, seed) of every paper fine-tuning experiment."""
  out = []
  for model, (batch, seed, langs) in PAPER.items():
    for split in SPLITS:
      for lang in langs:
        out.append((f"{model}_{split}_{lang}", model, split, lang, batch, seed))
        if model == "t5_base":
          out.append((f"{model}_{split}_{lang}_seed16", model, split, lang, batch, 16))
  return out


EXPERIMENTS = _experiments()


def _evals():
  """(relative path, trained model stem, task, model) of every evaluation file."""
  out = []
  for model, (_, _, langs) in PAPER.items():
    for split in SPLITS:
      for lang in langs:
        out.append((f"test/{model}_{split}_{lang}.gin", f"{model}_{split}_{lang}",
                    f"mcwq_{split}_{lang}_prefixed", model))
      if model == "t5_base":
        continue
      for lang in ("he", "kn", "zh"):
        out.append((f"zeroshot/{model}_{split}_{lang}.gin", f"{model}_{split}_en",
                    f"mcwq_{split}_zeroshot_{lang}_prefixed", model))
        out.append((f"gold/{model}_{split}_{lang}.gin", f"{model}_{split}_{lang}",
                    f"mcwq_gold_{lang}_prefixed", model))
  return out


EVALS = _evals()


def test_the_experiment_tables_are_complete():
  assert len([e for e in EXPERIMENTS if e[1].startswith("mt5_")]) == 32
  assert len([e for e in EXPERIMENTS if e[1] == "t5_base"]) == 8  # 4 splits x 2 seeds
  for stem, *_ in EXPERIMENTS:
    assert (REPO / f"gin/{stem}.gin").is_file() and (REPO / f"gin/mcwq_t5x/{stem}.gin").is_file()
  for path, *_ in EVALS:
    assert (REPO / f"gin/{path}").is_file() and (REPO / f"gin/mcwq_t5x/{path}").is_file()
  # That the files are what scripts/make_gin_configs.py writes: test_gin.py.


# --- the real T5X's files -------------------------------------------------------------------


@pytest.fixture(scope="module")
def t5x_values(tmp_path_factory):
  """{file: values} of the recipe's T5X files, from one fresh process (t5x_gin_values.RECIPE_SCRIPT,
  shared with test_gin.py)."""
  pytest.importorskip(
      "t5x.train", reason="the real T5X is not installed (bash scripts/install_t5x.sh)")
  import t5x_gin_values  # pylint: disable=g-import-not-at-top
  values = t5x_gin_values.t5x_values(tmp_path_factory)["recipe"]
  # why: a file missing from the shared list is named here rather than by a KeyError
  expected = {f"gin/{stem}.gin" for stem, *_ in EXPERIMENTS} | {f"gin/{p}" for p, *_ in EVALS}
  assert expected <= set(values), sorted(expected - set(values))
  return values


def _reference_updates(tx, n=3):
  """The parameters after `n` updates of `tx` on a fixed toy problem (gradient norm > 1)."""
  params = {"w": jnp.ones((4, 3)), "b": jnp.zeros((3,))}
  state = tx.init(params)
  for i in range(n):
    grads = {"w": jnp.full((4, 3), 3.0 * (i + 1)), "b": jnp.full((3,), -2.0)}
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
  return [float(x) for x in np.concatenate([np.ravel(params["w"]), np.ravel(params["b"])])]


def _paper_optimizer(lr=LR, steps=STEPS):
  """The Hugging Face Trainer's default optimizer as optax spells it (the recipe's reference)."""
  return optax.chain(
      optax.clip_by_global_norm(CLIP),
      optax.adamw(
          optax.linear_schedule(lr, 0.0, steps), b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0))


PAPER_UPDATES = _reference_updates(_paper_optimizer())


@pytest.mark.parametrize("exp", EXPERIMENTS, ids=[e[0] for e in EXPERIMENTS])
def test_t5x_experiment_file_follows_the_recipe(exp, t5x_values):
  stem, _, split, lang, batch, seed = exp
  v = t5x_values[f"gin/{stem}.gin"]
  task = f"mcwq_{split}_{lang}_prefixed"
  # optimizer: T5X's OptaxWrapper (optimizers.chain) of clip_by_global_norm(1.0) + AdamW
  assert v["optimizer"] == "@optimizers.chain()"
  np.testing.assert_allclose(v["updates"], PAPER_UPDATES, rtol=1e-6)
  # schedule: linear decay to 0 over the 50K fine-tuning steps, no warm-up; T5X's logged rate
  # counts from the checkpoint's step 1,000,000
  np.testing.assert_allclose(v["optax_lr"], [LR, LR / 2, 0.0, 0.0], rtol=1e-6)
  np.testing.assert_allclose(v["logged_lr"], [LR, LR / 2, 0.0], rtol=1e-6)
  assert v["lr_fn"] == "@logged_lr/optax.linear_schedule()" and v["LEARNING_RATE"] == LR
  assert v["TRAIN_STEPS"] - 1_000_000 == STEPS
  assert v["restore"][1:] == ["specific", [["state/param_states.*", None]], True]
  assert v["restore"][0] == t5x_values["pretrained"]  # a readable checkpoint passes unchanged
  # batch, seed, prefix (the task), lengths, dropout
  assert v["BATCH_SIZE"] == batch and v["RANDOM_SEED"] == seed and v["DROPOUT_RATE"] == 0.1
  assert v["MIXTURE_OR_TASK_NAME"] == task and v["TASK_FEATURE_LENGTHS"] == LENGTHS
  assert v["train"] == [task, "train", False, seed, batch]
  # dev loss every 500 steps over the whole dev set; keep the best by it (plus the newest)
  assert v["EVAL_PERIOD"] == EVAL_PERIOD and v["train_eval"][:2] == [task, "validation"]
  assert (v["EVAL_STEPS"] - 1) * batch < DEV_ROWS[split] <= v["EVAL_STEPS"] * batch
  assert v["save"] == [
      EVAL_PERIOD, 1, "SaveBestCheckpointer", {
          "metric_name_to_monitor": f"training_eval/{task}/loss",
          "metric_mode": "min",
          "keep_checkpoints_without_metrics": True
      }
  ]
  # greedy decoding: T5X's beam search with one beam, in both T5X models (the one of the file,
  # mcwq_t5x.t5x_bridge's, and T5X's own of gin/recipes/t5x_own_model.gin)
  assert v["num_decodes"] == 1 and "beam_search" in v["decode_fn"]
  assert v["bridge_decoding"] == ["@decoding.beam_search", "@models.DecoderParams()"]


@pytest.mark.parametrize("ev", EVALS, ids=[e[0] for e in EVALS])
def test_t5x_eval_file_decodes_the_best_checkpoint_greedily(ev, t5x_values):
  path, trained, task, _ = ev
  v = t5x_values[f"gin/{path}"]
  train_task = "mcwq_" + trained.split("_", 2)[2] + "_prefixed"
  assert v["MIXTURE_OR_TASK_NAME"] == task and v["dataset"] == [task, "test", LENGTHS]
  assert v["CHECKPOINT_PATH"] == f"runs/t5x/{trained}"
  assert v["restore_path"] == "@best_checkpoint.checkpoint_path()"
  assert v["restore_mode"] == "specific" and v["best_path"] == "%CHECKPOINT_PATH"
  assert v["METRIC_NAME_TO_MONITOR"] == f"training_eval/{train_task}/loss"
  assert v["METRIC_MODE"] == "min" and v["num_decodes"] == 1
  assert v["bridge_decoding"] == ["@decoding.beam_search", "@models.DecoderParams()"]


def test_t5x_run_stops_on_an_unreadable_initial_checkpoint(t5x_values):
  """`fallback_to_scratch` fills what T5X cannot read from a fresh initialisation: a run file whose
  INITIAL_CHECKPOINT_PATH is not a readable checkpoint stops when T5X builds its restore config
  (before training) with an error naming the path, rather than training mT5 from scratch; a tiny
  T5X checkpoint passes unchanged, None (a from-scratch run) too."""
  got = t5x_values["restore_of"]
  assert got["pretrained"] == t5x_values["pretrained"] and got["none"] is None
  error, message = got["missing"]
  assert error == "NotACheckpointError"
  assert message.startswith("INITIAL_CHECKPOINT_PATH is not a readable T5X checkpoint: "
                            f"{t5x_values['missing']}: no checkpoint")
  assert "a local copy" in message and "INITIAL_CHECKPOINT_PATH = None" in message


def test_t5x_initial_checkpoint_refuses_a_hugging_face_folder(tmp_path):
  """A Hugging Face folder is a checkpoint our engine reads but T5X does not: refused, named."""
  (tmp_path / "model.safetensors").write_bytes(b"")
  with pytest.raises(
      checkpoint_paths.NotACheckpointError,
      match=f"^INITIAL_CHECKPOINT_PATH {tmp_path}: a Hugging Face directory.*"
      "which T5X does not read"):
    best_checkpoint.t5x_initial_checkpoint(str(tmp_path))


def test_t5x_adafactor_alternative(t5x_values):
  for path in ("gin/mt5_small_mcd1_en.gin", "gin/t5_base_mcd2_en.gin"):
    v = t5x_values["alt:" + path]
    assert v["optimizer"] == "@adafactor.Adafactor()"
    assert v["lr_fn"] == "@utils.create_learning_rate_scheduler()"
    assert v["t5x_lr"] == pytest.approx([LR, LR, LR])  # constant
    # everything else stays the paper's
    assert v["save"][2] == "SaveBestCheckpointer" and v["EVAL_PERIOD"] == EVAL_PERIOD


# --- our engine's files ---------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _parse(files, bindings=()):
  gin_utils.parse_gin(files, bindings, finalize=True, skip_unknown=False)


@pytest.mark.parametrize("exp", EXPERIMENTS, ids=[e[0] for e in EXPERIMENTS])
def test_our_experiment_file_follows_the_recipe(exp):
  stem, model, split, lang, batch, seed = exp
  _parse([f"gin/mcwq_t5x/{stem}.gin"])
  q = gin.query_parameter
  task = f"mcwq_{split}_{lang}_prefixed"
  with gin.unlock_config():
    lr_fn = gin.get_configurable(trainer_lib.create_learning_rate_schedule)()
    tx = gin.get_configurable(trainer_lib.make_optimizer)()
    with gin.config_scope("train"):
      train_ds = gin.get_configurable(pipeline.DatasetConfig)()
    with gin.config_scope("train_eval"):
      dev_ds = gin.get_configurable(pipeline.DatasetConfig)()
    with gin.config_scope("final_eval"):
      final_ds = gin.get_configurable(pipeline.DatasetConfig)()
    cfg = gin.get_configurable(network.get_config)()
  # optimizer, clipping, schedule, rate: the same updates as the reference
  assert q("%OPTIMIZER") == "adamw" and q("%GRAD_CLIP_NORM") == CLIP
  assert (q("%ADAM_B1"), q("%ADAM_B2"), q("%ADAM_EPS"), q("%WEIGHT_DECAY")) == (0.9, 0.999, 1e-8,
                                                                                0.0)
  assert q("%LR_SCHEDULE") == "linear" and q("%WARMUP_STEPS") == 0 and q("%LEARNING_RATE") == LR
  np.testing.assert_allclose([float(lr_fn(s)) for s in (0, 25_000, 50_000)], [LR, LR / 2, 0.0],
                             rtol=1e-6)
  np.testing.assert_allclose(_reference_updates(tx), PAPER_UPDATES, rtol=1e-6)
  # steps, batch, seed, prefix (the task), lengths, dropout, model
  assert q("%TRAIN_STEPS") == STEPS and q("%BATCH_SIZE") == batch and q("%RANDOM_SEED") == seed
  assert q("%MIXTURE_OR_TASK_NAME") == task and q("%TASK_FEATURE_LENGTHS") == LENGTHS
  assert (train_ds.mixture_or_task_name, train_ds.split, train_ds.pack,
          train_ds.batch_size) == (task, "train", False, batch)
  assert cfg.dropout_rate == 0.1
  if model == "t5_base":
    assert (cfg.vocab_size, cfg.emb_dim, cfg.mlp_dim, cfg.mlp_activations,
            cfg.logits_via_embedding) == (32128, 768, 2048, ("gelu", "linear"), False)
  # dev loss every 500 steps over the whole dev set; keep and decode the best by it
  assert q("%EVAL_PERIOD") == EVAL_PERIOD and q("%CHECKPOINT_PERIOD") == EVAL_PERIOD
  assert (dev_ds.mixture_or_task_name, dev_ds.split) == (task, "validation")
  assert q("%EVAL_STEPS") is None  # every dev row
  assert repr(q("train_state_init.SaveCheckpointConfig.metric_name_to_monitor")) == (
      "%METRIC_NAME_TO_MONITOR")
  assert q("%METRIC_NAME_TO_MONITOR") == "training_eval/loss" and q("%METRIC_MODE") == "min"
  assert q("%KEEP_CHECKPOINTS") == 1
  # greedy decoding of the test set, up to 512 target tokens
  assert q("%NUM_DECODES") == 1 and q("%FINAL_EVAL_SPLIT") == "test"
  assert final_ds.task_feature_lengths == LENGTHS and final_ds.mixture_or_task_name == task


@pytest.mark.parametrize("ev", EVALS, ids=[e[0] for e in EVALS])
def test_our_eval_file_decodes_the_best_checkpoint_greedily(ev):
  path, trained, task, _ = ev
  _parse([f"gin/mcwq_t5x/{path}"])
  q = gin.query_parameter
  assert q("%MIXTURE_OR_TASK_NAME") == task and q("%SPLIT") == "test"
  assert q("%TASK_FEATURE_LENGTHS") == LENGTHS
  assert q("%CHECKPOINT_PATH") == f"runs/{trained}"
  assert repr(q("eval_script.evaluate.checkpoint_path")) == "@best_checkpoint.checkpoint_path()"
  assert q("%METRIC_NAME_TO_MONITOR") == "training_eval/loss" and q("%METRIC_MODE") == "min"
  assert q("%PREDICT_KWARGS") == {"num_decodes": 1}


def test_our_adafactor_alternative():
  _parse(["gin/mcwq_t5x/mt5_small_mcd1_en.gin", "gin/mcwq_t5x/recipes/t5x_adafactor.gin"])
  with gin.unlock_config():
    lr_fn = gin.get_configurable(trainer_lib.create_learning_rate_schedule)()
  assert gin.query_parameter("%OPTIMIZER") == "adafactor"
  assert gin.query_parameter("%GRAD_CLIP_NORM") is None
  assert [float(lr_fn(s)) for s in (0, 50_000)] == pytest.approx([LR, LR])
  assert gin.query_parameter("%METRIC_NAME_TO_MONITOR") == "training_eval/loss"


# --- best-checkpoint keeping, unit level ----------------------------------------------------
def test_checkpoint_manager_keeps_the_best_and_the_newest(tmp_path):
  """Dev losses 3, 1, 2, 4 at steps 1..4: checkpoint 2 (lowest) and 4 (newest) are kept."""
  # why: which checkpoints are kept depends on the steps and metrics only, not on the state's size
  state = trainer_lib.TrainState(step=np.int32(0), params={"w": np.arange(6.0)}, opt_state={})
  mgr = checkpoints.CheckpointManager(
      tmp_path,
      save_interval_steps=1,
      max_to_keep=1,
      metric_name_to_monitor="training_eval/loss",
      metric_mode="min")
  for step, loss in zip((1, 2, 3, 4), (3.0, 1.0, 2.0, 4.0)):
    mgr.save(step, state, {"step": step}, metrics={"training_eval/loss": loss})
  mgr.wait()
  assert mgr.all_steps() == [2, 4] and mgr.best_step() == 2 and mgr.metric(2) == 1.0
  mgr.close()
  # a new manager (a resumed run) reads the saved values back
  again = checkpoints.CheckpointManager(
      tmp_path, metric_name_to_monitor="training_eval/loss", max_to_keep=1)
  assert again.best_step() == 2
  again.close()
  # and the eval side finds the same checkpoint from eval_metrics.jsonl
  (tmp_path / "eval_metrics.jsonl").write_text("".join(
      json.dumps({
          "step": s,
          "training_eval/loss": l
      }) + "\n" for s, l in zip((1, 2, 3, 4), (3.0, 1.0, 2.0, 4.0))))
  assert best_checkpoint.checkpoint_path(str(tmp_path),
                                         "training_eval/loss") == str(tmp_path / "checkpoint_2")
  assert best_checkpoint.checkpoint_path(str(tmp_path / "checkpoint_4"),
                                         "training_eval/loss") == str(tmp_path / "checkpoint_4")
  assert best_checkpoint.checkpoint_path(str(tmp_path)) == str(tmp_path / "checkpoint_4")
  # A run whose periodic evaluation read the test split (the tiny job): no selection on it.
  (tmp_path / "config.gin").write_text("EVAL_SPLIT = 'test'\nFINAL_EVAL_SPLIT = 'test'\n")
  assert best_checkpoint.monitored_split(tmp_path) == "test"
  assert best_checkpoint.checkpoint_path(str(tmp_path),
                                         "training_eval/loss") == str(tmp_path / "checkpoint_4")
  (tmp_path / "config.gin").unlink()
  with pytest.raises(ValueError, match="metric_mode"):
    checkpoints.CheckpointManager(tmp_path, metric_name_to_monitor="x", metric_mode="lowest")


def test_best_checkpoint_reads_t5x_event_files(tmp_path):
  """T5X logs the dev loss only to TensorBoard: `{run}/{tag}` = training_eval/<task>/loss."""
  tf = pytest.importorskip("tensorflow")
  run = tmp_path / "training_eval" / "mcwq_gold_he_prefixed"
  writer = tf.summary.create_file_writer(str(run))
  with writer.as_default():
    for step, loss in ((5, 9.0), (10, 4.0), (15, 6.0)):
      tf.summary.scalar("loss", loss, step=step)
  writer.flush()
  for step in (5, 10, 15):
    (tmp_path / f"checkpoint_{step}" / "state").mkdir(parents=True)
  name = "training_eval/mcwq_gold_he_prefixed/loss"
  assert best_checkpoint.read_metric(tmp_path, name) == {5: 9.0, 10: 4.0, 15: 6.0}
  assert best_checkpoint.checkpoint_path(str(tmp_path), name) == str(tmp_path / "checkpoint_10")
  assert best_checkpoint.checkpoint_path(str(tmp_path), name,
                                         "max") == str(tmp_path / "checkpoint_5")


# --- tiny runs with the recipe ----------------------------------------------------------------
# The README's runs of the paper files, sizes and steps overridden (readme_commands.OUR_PAPER_*,
# T5X_*): a very small network, 40 (ours) or 20 (T5X) steps of 8 questions, dev loss and a
# checkpoint every 10 steps.


def _argmin(values):
  return best_checkpoint.best_of(values, "min")


@pytest.mark.xdist_group(f"readme-{rc.chain(rc.OUR_PAPER_TRAIN)}")  # reads the README's run
def test_tiny_run_of_our_engine_decodes_the_lowest_dev_loss_checkpoint(readme):
  """The README's `mcwq_t5x.train --gin_file=gin/mcwq_t5x/mt5_small_mcd1_en.gin`: trained and
  selected on the mcd1 dev split, the kept best checkpoint decoded on the test split (the engine
  never selects a checkpoint on the split it reports: train.selection_metric)."""
  model_dir = readme.repo / "runs/mt5_small_mcd1_en"
  scenarios.check(readme.result(rc.OUR_PAPER_TRAIN))
  steps, period, task = rc.OUR_PAPER_STEPS, rc.OUR_PAPER_PERIOD, rc.OUR_PAPER_TASK
  dev = best_checkpoint.read_metric(model_dir, "training_eval/loss")
  assert sorted(dev) == list(range(period, steps + 1, period))
  best = _argmin(dev)
  # kept: the best and the newest only
  assert checkpoint_paths.finished_steps(model_dir) == sorted({best, steps})
  result = json.loads((model_dir / f"metrics/{task}_test.json").read_text())
  assert result["step"] == best and result["checkpoint"] == str(model_dir / f"checkpoint_{best}")
  assert result["training_eval/loss"] == pytest.approx(dev[best])
  assert result["num_examples"] == 8 and 0.0 <= result["exact_match"] <= 100.0
  # the logged learning rate decays linearly from LEARNING_RATE to 0, without warm-up
  lrs = {
      r["step"]: r["learning_rate"]
      for r in map(json.loads, (model_dir / "train_metrics.jsonl").read_text().splitlines())
  }
  lr = rc.OUR_PAPER_LR
  assert lrs[period] == pytest.approx(lr * (1 - (period - 1) / steps), rel=1e-5)
  assert lrs[steps] == pytest.approx(lr / steps, rel=1e-5)
  print(f"ours: dev losses {dev}; kept and decoded checkpoint_{best}")


@pytest.mark.xdist_group(f"readme-{rc.chain(rc.T5X_TRAIN)}")  # reads the README's T5X runs
def test_tiny_run_of_t5x_decodes_the_lowest_dev_loss_checkpoint(readme):
  """The README's `t5x.train --gin_file=gin/mt5_small_mcd1_en.gin` (20 steps of the recipe, dev
  loss and a checkpoint every 10; readme_commands.T5X_TRAIN) and its `t5x.eval`, which decodes
  the run folder's best checkpoint."""
  pytest.importorskip(
      "t5x.train", reason="the real T5X is not installed (bash scripts/install_t5x.sh)")
  scenarios.check(readme.result(rc.T5X_EVAL))  # after the training run (readme_commands.DEPENDS)
  model_dir = readme.repo / "runs/t5x/mt5_small_mcd1_en"
  steps, period = rc.T5X_STEPS, rc.T5X_PERIOD
  dev = best_checkpoint.read_metric(model_dir, rc.T5X_DEV_LOSS)
  assert sorted(dev) == list(range(period, steps + 1, period))
  best = _argmin(dev)
  kept = checkpoint_paths.finished_steps(model_dir)
  # T5X's Orbax manager: the newest, the best among those with a logged dev loss when it last
  # collected, and those without one (step 0); nothing else
  assert best in kept and steps in kept
  assert set(kept) <= {0, best, steps, _argmin({s: dev[s] for s in dev if s < steps})}
  assert len([s for s in kept if s not in (0, steps)]) <= 1
  # the logged learning rate (T5X: the mean over the `period` steps before each log) decays
  # linearly from the file's LEARNING_RATE to 0 over the fine-tuning steps
  assert "\nLEARNING_RATE = 0.0005\n" in (model_dir / "config.gin").read_text()  # LR: the paper's
  lrs = best_checkpoint.read_metric(model_dir, "train/learning_rate")
  for step in range(period, steps + 1, period):
    expected = np.mean([LR * (1.0 - s / steps) for s in range(step - period, step)])
    assert lrs[step] == pytest.approx(expected, rel=1e-4), step
  # the README's zero-shot evaluation file decodes the best checkpoint
  lines = (model_dir / "zeroshot_he/inference_eval/"
           "mcwq_mcd1_zeroshot_he_prefixed-metrics.jsonl").read_text().splitlines()
  metrics = json.loads(lines[-1])
  assert metrics["step"] == best and {"exact_match", "bleu"} <= set(metrics)
  print(f"t5x: dev losses {dev}; kept {kept}; decoded checkpoint_{best}")
