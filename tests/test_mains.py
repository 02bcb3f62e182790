"""End-to-end tests of the mains (train / eval / infer) on real MCWQ text from ../shared, with a
very small model and a few steps, plus the bad-input cases."""
import json
import pathlib

import gin
import jax
import numpy as np
import pytest

from mcwq_t5x import checkpoints
from mcwq_t5x import eval as eval_lib
from mcwq_t5x import gin_utils
from mcwq_t5x import infer as infer_lib
from mcwq_t5x import train as train_lib
from mcwq_t5x import trainer as trainer_lib

SMALL = ["network.T5Config.emb_dim = 32", "network.T5Config.num_heads = 2",
         "network.T5Config.head_dim = 16", "network.T5Config.mlp_dim = 64",
         "network.T5Config.num_encoder_layers = 1", "network.T5Config.num_decoder_layers = 1",
         "TASK_FEATURE_LENGTHS = {'inputs': 40, 'targets': 128}", "BATCH_SIZE = 8",
         "LOG_EVERY_STEPS = 1", "CHECKPOINT_PERIOD = 2", "EVAL_PERIOD = 0",
         "INFER_BATCH_SIZE = 16", "FINAL_EVAL_NUM_EXAMPLES = 16", "WARMUP_STEPS = 2"]
# The 155 human-translated gold test questions (Hebrew) load in a second: real MCWQ text, small.
GOLD = ["MIXTURE_OR_TASK_NAME = 'mcwq_gold_he'", "TRAIN_SPLIT = 'test'", "EVAL_SPLIT = 'test'",
        "FINAL_EVAL_SPLIT = 'test'"]


@pytest.fixture(autouse=True)
def _clear_gin(mcwq_dir):
  del mcwq_dir  # the real data must be there
  yield
  gin.clear_config()


def run_train(model_dir, *extra):
  gin_utils.parse_gin(["gin/tiny_random_split_en.gin"],
                      SMALL + GOLD + [f"MODEL_DIR = '{model_dir}'", "TRAIN_STEPS = 4", *extra])
  return train_lib.train()  # pylint: disable=no-value-for-parameter


def losses(model_dir):
  lines = (pathlib.Path(model_dir) / "train_metrics.jsonl").read_text().splitlines()
  return {r["step"]: r["loss"] for r in map(json.loads, lines)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """One uninterrupted 4-step run (module-scoped: reused by the eval/infer tests)."""
  model_dir = tmp_path_factory.mktemp("tiny_run")
  result = run_train(model_dir)
  gin.clear_config()
  return model_dir, result


def test_train_output_layout(trained):
  model_dir, result = trained
  assert result["step"] == 4
  assert checkpoints.CheckpointManager(model_dir / "checkpoints").all_steps() == [2, 4]
  assert list((model_dir / "train").glob("events.out.tfevents.*"))
  assert "mcwq_gold_he" in (model_dir / "config.gin").read_text()
  curve = losses(model_dir)
  assert sorted(curve) == [1, 2, 3, 4] and all(np.isfinite(list(curve.values())))
  preds = (model_dir / "predictions/mcwq_gold_he_test.txt").read_text().splitlines()
  assert len(preds) == 16
  metrics = json.loads((model_dir / "metrics/mcwq_gold_he_test.json").read_text())
  assert metrics["num_examples"] == 16 and metrics["step"] == 4
  assert 0.0 <= metrics["exact_match"] <= 100.0 and "bleu" in metrics
  assert result["final_eval"]["mcwq_gold_he_test"]["exact_match"] == metrics["exact_match"]


def test_kill_and_resume_reproduces_losses(trained, tmp_path):
  """Stop after step 2 (as if killed), rerun: steps 3-4 repeat the uninterrupted run's losses."""
  straight = losses(trained[0])
  first = run_train(tmp_path, "train.stop_after_steps = 2", "FINAL_EVAL_NUM_EXAMPLES = 1")
  assert first["step"] == 2 and first["final_eval"] == {}
  gin.clear_config()
  run_train(tmp_path, "FINAL_EVAL_NUM_EXAMPLES = 1")
  resumed = losses(tmp_path)
  assert sorted(resumed) == [1, 2, 3, 4]
  np.testing.assert_allclose([resumed[s] for s in (1, 2, 3, 4)],
                             [straight[s] for s in (1, 2, 3, 4)], rtol=1e-5)


def test_eval_main_writes_predictions_in_source_order(trained, tmp_path, mcwq_dir):
  model_dir, _ = trained
  gin_utils.parse_gin(["gin/models/tiny.gin", "gin/runs/eval.gin"],
                      SMALL[:6] + ["MIXTURE_OR_TASK_NAME = 'mcwq_gold_he'",
                                   f"CHECKPOINT_PATH = '{model_dir}'", "NUM_EXAMPLES = 16",
                                   f"EVAL_OUTPUT_DIR = '{tmp_path}'", "BATCH_SIZE = 8"])
  result = eval_lib.evaluate()  # pylint: disable=no-value-for-parameter
  preds = pathlib.Path(result["predictions_path"]).read_text().splitlines()
  assert len(preds) == 16
  # Same checkpoint, same examples: the same predictions as the training run's final evaluation.
  assert preds == (model_dir / "predictions/mcwq_gold_he_test.txt").read_text().splitlines()
  metrics = json.loads(pathlib.Path(result["metrics_path"]).read_text())
  assert metrics["step"] == 4 and metrics["num_examples"] == 16
  assert set(metrics) >= {"exact_match", "bleu", "task", "split"}


def test_infer_main(trained, tmp_path, capsys):
  model_dir, _ = trained
  questions = tmp_path / "q.txt"
  questions.write_text("Did M0 direct M1\nWho edited M0\n")
  out = tmp_path / "out.txt"
  preds = infer_lib.main(["--gin_file=gin/models/tiny.gin", "--gin_file=gin/runs/infer.gin",
                          f"--gin.CHECKPOINT_PATH='{model_dir}'", "--gin.MAX_DECODE_LENGTH=32",
                          f"--input={questions}", f"--output={out}", "--sparql"]
                         + [f"--gin_bindings={b}" for b in SMALL[:6]])
  lines = out.read_text().splitlines()
  assert len(lines) == 2 == len(preds)
  for line in lines:  # an untrained model: valid SPARQL or an explicit error, line by line
    assert line.startswith(("ASK", "SELECT", "ERROR: ")), line


def test_unknown_task(tmp_path):
  with pytest.raises(ValueError, match="unknown task or mixture 'mcwq_mcd9_en'.*mcwq_mcd1_en"):
    run_train(tmp_path, "MIXTURE_OR_TASK_NAME = 'mcwq_mcd9_en'")


def test_missing_data_dir(tmp_path, monkeypatch):
  from mcwq_t5x import paths  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("MCWQ_DATA_DIR", str(tmp_path / "no_such_dir"))
  with pytest.raises(paths.DataNotFoundError, match="no_such_dir"):
    run_train(tmp_path / "run")


def test_vocab_model_size_mismatch(tmp_path):
  with pytest.raises(ValueError, match="vocabulary/model mismatch.*2000 pieces.*vocab_size is 1000"):
    run_train(tmp_path, "network.T5Config.vocab_size = 1000")


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
  """An absurd learning rate blows the weights up: the loss of step 2 is not finite."""
  with pytest.raises(trainer_lib.NonFiniteLossError, match="non-finite loss"):
    run_train(tmp_path, "OPTIMIZER = 'adamw'", "LEARNING_RATE = 1e30", "WARMUP_STEPS = 0",
              "CHECKPOINT_PERIOD = 1", "LR_SCHEDULE = 'constant'")
  mgr = checkpoints.CheckpointManager(tmp_path / "checkpoints")
  steps = mgr.all_steps()
  assert steps and steps[-1] < 4
  curve = losses(tmp_path) if (tmp_path / "train_metrics.jsonl").exists() else {}
  assert all(np.isfinite(v) for v in curve.values())
  # The newest checkpoint is the state after the last finite step, and it is readable.
  folder, step = checkpoints.resolve_checkpoint(tmp_path)
  assert step == steps[-1]
