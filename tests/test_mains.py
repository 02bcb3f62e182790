"""End-to-end tests of our engine's mains (train / infer), each run as users run it, in a fresh
process (`python -m mcwq_t5x.train ...`), on real MCWQ text from ../shared with a very small model;
configuration errors are checked through gin in this process.

Kill and resume are checked in test_checkpoints.py (in this process) and test_multiprocess.py (a
2-process run resumed by one process); `eval` decoding a checkpoint as the training run's final
evaluation did, by the README's commands (test_readme.py)."""
import json
import pathlib
import re

import numpy as np
import pytest

from mcwq_t5x.checkpointing import checkpoints
from mcwq_t5x.data import paths
from mcwq_t5x.data import readers
from mcwq_t5x.engine import flops
from mcwq_t5x.engine import network
from mcwq_t5x.engine import trainer as trainer_lib
from mcwq_t5x.evaluation import metrics
from mcwq_t5x import train as train_lib
import mains
import scenarios

TINY = "gin/mcwq_t5x/tiny_random_split_en.gin"
MODEL = "gin/mcwq_t5x/models/tiny.gin"
STEPS = scenarios.OUR_RUN_STEPS
RUN = mains.SMALL_MODEL + scenarios.OUR_RUN
# The 155 human-translated gold test questions (Hebrew) load in a second: real MCWQ text, small.
GOLD = [
    "MIXTURE_OR_TASK_NAME = 'mcwq_gold_he'", "TRAIN_SPLIT = 'test'", "EVAL_SPLIT = 'test'",
    "FINAL_EVAL_SPLIT = 'test'"
]


def train(model_dir, *extra, check=True):
  return mains.python_m(
      "mcwq_t5x.train",
      f"--gin_file={TINY}",
      *mains.gin_flags(RUN + GOLD + [f"MODEL_DIR = '{model_dir}'", *extra]),
      check=check)


def losses(model_dir):
  lines = (pathlib.Path(model_dir) / "train_metrics.jsonl").read_text().splitlines()
  return {r["step"]: r["loss"] for r in map(json.loads, lines)}


@pytest.fixture(scope="module")
def trained(our_run):
  """The session's run of our engine (conftest.our_run: OUR_RUN, STEPS steps)."""
  return our_run


# The training loss at steps 50 and 100 of this run (seed 0 of the tiny gin file), recorded on a
# 2-core AMD EPYC machine. XLA sums in another order on another CPU, and 100 AdamW steps amplify
# those last bits a little: 2% is far inside what a changed loss, mask, batch or data order moves.
RECORDED_LOSS = {50: 4.0922, 100: 1.3723}


def test_train_learns_and_writes_its_layout(trained):
  model_dir = trained
  assert checkpoints.finished_steps(model_dir)[-1] == STEPS
  assert list((model_dir / "train").glob("events.out.tfevents.*"))
  assert "mcwq_gold_he" in (model_dir / "config.gin").read_text()
  curve = losses(model_dir)
  assert sorted(curve) == list(range(50, STEPS + 1, 50)) and all(np.isfinite(list(curve.values())))
  for step, loss in RECORDED_LOSS.items():
    assert curve[step] == pytest.approx(loss, rel=0.02), (step, curve)
  # The 32 questions decoded at the end were trained on: a model that learns gets many right (the
  # 4-step model of a broken engine gets none).
  preds = (model_dir / "predictions/mcwq_gold_he_test.txt").read_text().splitlines()
  gold = readers.read_split("gold", "test", "he", paths.data_dir())[:32]
  assert len(preds) == 32
  scores = json.loads((model_dir / "metrics/mcwq_gold_he_test.json").read_text())
  assert scores["num_examples"] == 32 and scores["step"] == STEPS
  rescored = metrics.exact_match_metric([e.rir for e in gold], preds)["exact_match"]
  assert scores["exact_match"] == pytest.approx(rescored) and rescored >= 15.0, scores
  assert scores["bleu"] == pytest.approx(metrics.bleu_metric([e.rir for e in gold], preds)["bleu"])
  # T5X's names for the periodic evaluations; with EVAL_STEPS = None the loss covers all 155 rows
  # (batch 8: the last batch of 3 rows is padded, not dropped).
  evals = [json.loads(l) for l in (model_dir / "eval_metrics.jsonl").read_text().splitlines()]
  assert [e["step"] for e in evals] == [150, 300]
  assert {
      "training_eval/loss", "training_eval/accuracy", "inference_eval/exact_match",
      "inference_eval/bleu"
  } <= set(evals[0])
  assert evals[1]["training_eval/loss"] < evals[0]["training_eval/loss"]


def test_train_log_is_short_and_says_what_it_decodes(trained):
  """The log: a config summary (the full config is config.gin), the truncation count, and, with
  no held-out dev (EVAL_SPLIT = FINAL_EVAL_SPLIT = 'test'), the last checkpoint decoded."""
  log = (trained.parent / f"{trained.name}.log").read_text()
  assert "Parameters for" not in log and "gin: files" in log
  assert "Parameters for" in (trained / "config.gin").read_text()
  assert "TRUNCATED" in log or "no example exceeds TASK_FEATURE_LENGTHS" in log
  assert "monitoring on the reported split" in log
  assert f"final evaluation decodes the last checkpoint (checkpoint_{STEPS})" in log
  assert "'logger_cls' is empty" not in log
  metrics_file = json.loads((trained / "metrics/mcwq_gold_he_test.json").read_text())
  assert metrics_file["selected_by"] == "last checkpoint" and metrics_file["step"] == STEPS


def test_train_logs_model_flops_as_a_share_of_the_matmul_peak(trained):
  """Each step line gives the model FLOPs per second of its steps and their share of the matmul
  peak timed at start-up; the FLOPs per step are those of the run's network on its batch shape
  (packed rows of TASK_FEATURE_LENGTHS: `flops.train_step_flops`)."""
  log = (trained.parent / f"{trained.name}.log").read_text()
  peak = re.search(r"matmul peak: ([\d.]+) GFLOP/s, (numpy|XLA) 2048x2048 float32 matmul \(", log)
  assert peak, log[-3000:]
  steps = re.findall(
      r"step (\d+)/\d+ .* ([\d.]+)s/step .* ([\d.]+) GFLOP/s = ([\d.]+)% of the "
      rf"{peak.group(2)} matmul's {peak.group(1)}\n", log)
  assert [int(s[0]) for s in steps] == list(range(50, STEPS + 1, 50)), log[-3000:]
  top = float(peak.group(1))
  for _, _, gflops, share in steps:  # each figure printed to 0.05
    rounding = 0.05 + 100 * 0.05 / top * (1 + float(gflops) / top)
    assert float(share) == pytest.approx(100 * float(gflops) / top, abs=rounding + 1e-9)
  run = json.loads((trained / "run.json").read_text())
  lengths = run["feature_lengths"]
  per_step = flops.train_step_flops(
      network.T5Config(**run["network"]), run["batch_size"], lengths["inputs"], lengths["targets"])
  for row in map(json.loads, (trained / "train_metrics.jsonl").read_text().splitlines()):
    assert row["model_gflops_per_s"] * 1e9 * row["step_time_s"] == pytest.approx(per_step)
    assert row["matmul_peak_share"] == pytest.approx(
        row["model_gflops_per_s"] / top, abs=0.05 / top)


def test_infer_main_one_line_per_input_line(trained, tmp_path):
  # A form feed and a Unicode line separator inside questions do not split them; CRLF is fine.
  questions = "Did M0 direct M1\r\nWho edited\x0c M0\nWas M2 \u2028 a film\n"
  out = mains.python_m(
      "mcwq_t5x.infer",
      f"--gin_file={MODEL}",
      "--gin_file=gin/mcwq_t5x/runs/infer.gin",
      f"--gin.CHECKPOINT_PATH='{trained}'",
      "--gin.MAX_DECODE_LENGTH=32",
      "--gin.HOST_DEVICE_COUNT=3",
      "--sparql",
      *mains.gin_flags(mains.SMALL_MODEL),
      input=questions)
  assert len(out.stdout.split("\n")) == 4 and out.stdout.endswith("\n")
  for line in out.stdout.split("\n")[:-1]:  # untrained: valid SPARQL or an explicit error
    assert line.startswith(("ASK", "SELECT", "ERROR: ")), line


# --- configuration errors, through gin in this process (no training needed) -------------------
def configured_train(model_dir, *extra):
  return mains.configured(train_lib, "train", [TINY],
                          RUN + GOLD + [f"MODEL_DIR = '{model_dir}'", *extra])


def test_unknown_task_names_the_closest(tmp_path):
  with pytest.raises(
      ValueError, match="unknown task or mixture 'mcwq_mcd9_en'.*closest.*mcwq_mcd1_en"):
    configured_train(tmp_path, "MIXTURE_OR_TASK_NAME = 'mcwq_mcd9_en'")()


def test_missing_data_dir(tmp_path, monkeypatch):
  monkeypatch.setenv("MCWQ_DATA_DIR", str(tmp_path / "no_such_dir"))
  with pytest.raises(paths.DataNotFoundError, match="no_such_dir"):
    configured_train(tmp_path / "run")()


def test_vocab_model_size_mismatch(tmp_path):
  with pytest.raises(
      ValueError, match="vocabulary/model mismatch.*2000 pieces.*vocab_size is 1000"):
    configured_train(tmp_path, "network.get_config.vocab_size = 1000")()


def test_early_stop_closes_the_metric_writers(tmp_path, monkeypatch):
  """`stop_after_steps`: the run returns after its checkpoint, without the final evaluation, and
  its TensorBoard writers are closed (their events, the evaluation's too, are on disk)."""
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  writers = []
  create = train_lib.create_metric_writer
  monkeypatch.setattr(train_lib, "create_metric_writer",
                      lambda logdir: writers.append(create(logdir)) or writers[-1])
  run = configured_train(tmp_path, "EVAL_PERIOD = 2", "LOG_EVERY_STEPS = 2",
                         "INFER_EVAL_NUM_EXAMPLES = 2")
  result = run(stop_after_steps=2)
  assert result["step"] == 2 and result["final_eval"] == {}
  assert checkpoints.finished_steps(tmp_path)[-1] == 2
  assert len(writers) == 2 and all(w._writer is None for w in writers)  # pylint: disable=protected-access
  for run, tag in (("train", "loss"), ("eval", "training_eval/loss")):
    acc = event_accumulator.EventAccumulator(str(tmp_path / run))
    acc.Reload()
    assert [e.step for e in acc.Scalars(tag)] == [2], run


def test_nan_loss_stops_and_says_which_checkpoint_is_good(tmp_path, caplog):
  """An absurd learning rate blows the weights up: the loss of step 2 is not finite."""
  with pytest.raises(trainer_lib.NonFiniteLossError, match="non-finite loss"):
    configured_train(tmp_path, "OPTIMIZER = 'adamw'", "LEARNING_RATE = 1e30", "WARMUP_STEPS = 0",
                     "CHECKPOINT_PERIOD = 1", "LR_SCHEDULE = 'constant'", "EVAL_PERIOD = 0")()
  steps = checkpoints.finished_steps(tmp_path)
  assert steps and steps[-1] < 4
  assert f"the last good checkpoint is step {steps[-1]}" in caplog.text
  curve = losses(tmp_path) if (tmp_path / "train_metrics.jsonl").exists() else {}
  assert all(np.isfinite(v) for v in curve.values())
  _, step = checkpoints.resolve_checkpoint(tmp_path)
  assert step == steps[-1]
