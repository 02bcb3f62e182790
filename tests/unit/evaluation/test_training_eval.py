"""Tests of mcwq_t5x.evaluation.training_eval alone, with the tiny model: the periodic loss covers
every row once; the selection metric is never on the reported split nor without evaluations; the
periodic evaluation writes what it records (the split tokenised once); the decoded checkpoint is
the kept one with the best metric, else the last; the final evaluation writes each split's
predictions and metrics with how its checkpoint was chosen."""
import json
import logging

import jax
import numpy as np
import optax
import pytest

from mcwq_t5x.checkpointing import checkpoints
from mcwq_t5x.checkpointing import run_folder
from mcwq_t5x.data import pipeline
from mcwq_t5x.engine import partitioning
from mcwq_t5x.engine import trainer as trainer_lib
from mcwq_t5x.evaluation import prediction
from mcwq_t5x.evaluation import training_eval
import tiny_engine

TEST = pipeline.DatasetConfig("mcwq_random_split_en", None, "test", 8)
DEV = pipeline.DatasetConfig("mcwq_random_split_en", None, "validation", 8)
# The 155 Hebrew gold questions, each split's longest example (decoding truncates nothing).
GOLD = pipeline.DatasetConfig("mcwq_gold_he", None, "test", 8, shuffle=False, module="tasks.mcwq")


def make_trainer(vocab_size=tiny_engine.VOCAB):
  # why 4 devices and set_to_zero: the state's initialisation of the 64-piece model is then
  # test_prediction.py's program, which the session's compilation cache holds once
  partitioner = partitioning.Partitioner(devices=jax.devices()[:4])
  return trainer_lib.Trainer(
      tiny_engine.tiny_model(0.0, vocab_size=vocab_size),
      partitioner,
      lambda step: 0.0,
      optimizer=optax.set_to_zero())


@pytest.fixture(scope="module")
def tiny():
  tr = make_trainer()
  return tr, tr.create_state(tiny_engine.SHAPES)


@pytest.fixture(scope="module")
def gold_model():
  """A trainer and state of the tiny network over the small vocabulary's 2,000 pieces."""
  tr = make_trainer(2000)
  return tr, tr.create_state(tiny_engine.SHAPES)


class RecordingWriter:
  """A `run_folder.ScalarWriter` stand-in: the scalars written, and the flushes."""

  def __init__(self):
    self.written, self.flushes = [], 0

  def write_scalars(self, step, scalars):
    self.written.append((step, dict(scalars)))

  def flush(self):
    self.flushes += 1


def test_loss_over_split_scores_every_row_once(tiny):
  tr, state = tiny
  rows = tiny_engine.synthetic_batch(0, batch=11)  # 11 rows: batches of 4, 4 and 3 (+1 padding)
  chunked = training_eval.loss_over_split(tr, state, rows, 4, tr.partitioner)
  assert sorted(chunked) == ["accuracy", "cross_ent_loss", "loss"]
  # Other groupings and paddings of the same rows (10 rows + 6 padding, 1 row + 3), in the two
  # batch shapes that are compiled anyway (4 and 16).
  whole = training_eval.loss_over_split(tr, state, {
      k: v[:10] for k, v in rows.items()
  }, 16, tr.partitioner)
  last = training_eval.loss_over_split(tr, state, {
      k: v[10:] for k, v in rows.items()
  }, 4, tr.partitioner)
  n_whole = float(rows["decoder_loss_weights"][:10].sum())
  n_last = float(rows["decoder_loss_weights"][10:].sum())
  expected = (whole["loss"] * n_whole + last["loss"] * n_last) / (n_whole + n_last)
  np.testing.assert_allclose(chunked["loss"], expected, rtol=1e-5)
  # A batch larger than the split still gives a loss (it is one padded batch).
  single = training_eval.loss_over_split(tr, state, rows, 16, tr.partitioner)
  np.testing.assert_allclose(single["loss"], chunked["loss"], rtol=1e-5)


def test_selection_is_never_on_the_reported_split_nor_without_evaluations(caplog):
  metric = "training_eval/loss"
  assert training_eval.selection_metric(metric, DEV, [TEST]) == metric
  assert training_eval.selection_metric(None, TEST, [TEST]) is None  # nothing to select by
  with caplog.at_level(logging.WARNING):
    assert training_eval.selection_metric(metric, TEST, [TEST]) is None
  assert "last checkpoint" in caplog.text and "monitoring only" in caplog.text
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    assert training_eval.selection_metric(metric, DEV, [TEST], evaluates=False) is None
    assert training_eval.selection_metric(metric, None, [TEST]) is None
  assert caplog.text.count("needs evaluations") == 2


def test_the_monitoring_note():
  note = " (monitoring on the reported split, selects nothing)"
  assert training_eval.monitoring_note([DEV, None], [TEST]) == ""
  assert training_eval.monitoring_note([DEV, TEST], [TEST]) == note
  assert training_eval.monitoring_note([None, None], [TEST]) == ""


def test_evaluation_config_checks_predict_kwargs(tiny):
  tr, state = tiny
  with pytest.raises(ValueError, match="PREDICT_KWARGS"):
    training_eval.EvaluationConfig(predict_kwargs={"alpha": 0.6}).check(tr.model)
  cfg = training_eval.EvaluationConfig(infer_batch_size=6, predict_kwargs={"num_decodes": 1})
  cfg.check(tr.model)
  rows = tiny_engine.synthetic_batch(3, batch=5)
  tokens = cfg.infer_fn(tr.model, tr.partitioner)(state.params, {
      k: rows[k] for k in prediction.DECODE_FEATURES
  })
  assert tokens.shape == (5, rows["decoder_input_tokens"].shape[1])


def test_periodic_loss_is_written_where_it_is_recorded(tiny, tmp_path):
  tr, state = tiny
  rows = tiny_engine.synthetic_batch(1, batch=8)
  writer = RecordingWriter()
  evaluate = training_eval.PeriodicEvaluator(tr, tmp_path, rows, 4, note=" (note)")
  record = evaluate(40, state, writer)
  expected = training_eval.loss_over_split(tr, state, rows, 4, tr.partitioner)
  assert record == {"step": 40, **{f"training_eval/{k}": v for k, v in expected.items()}}
  assert writer.written == [(40, {k: v for k, v in record.items() if k != "step"})]
  assert writer.flushes == 1
  rows_written = [
      json.loads(line) for line in (tmp_path / run_folder.EVAL_METRICS).read_text().splitlines()
  ]
  assert rows_written == [pytest.approx(record)]
  # nothing to evaluate: nothing written
  assert training_eval.PeriodicEvaluator(tr, tmp_path)(50, state, writer) == {"step": 50}
  assert len(writer.written) == 1


def test_periodic_decoding_tokenises_its_split_once(gold_model, tmp_path, monkeypatch):
  tr, state = gold_model
  made = []
  make = prediction.make_evaluator
  monkeypatch.setattr(prediction, "make_evaluator", lambda *a: made.append(a) or make(*a))
  infer_fn = training_eval.EvaluationConfig(infer_batch_size=4).infer_fn(tr.model, tr.partitioner)
  evaluate = training_eval.PeriodicEvaluator(
      tr, tmp_path, infer_eval_dataset_cfg=GOLD, infer_fn=infer_fn, infer_eval_num_examples=4)
  writer = RecordingWriter()
  first, second = evaluate(1, state, writer), evaluate(2, state, writer)
  assert made == [(GOLD, 4)]
  assert set(first) == {
      "step", "inference_eval/exact_match", "inference_eval/bleu", "inference_eval/time_s"
  }
  # the same parameters decode the same questions: the same figures
  assert first["inference_eval/bleu"] == second["inference_eval/bleu"]
  assert 0.0 <= first["inference_eval/exact_match"] <= 100.0
  assert [step for step, _ in writer.written] == [1, 2]


def params_plus(params, shift):
  return jax.device_get(jax.tree_util.tree_map(lambda p: p + shift, params))


def test_the_decoded_checkpoint_is_the_best_kept_one_else_the_last(tiny, tmp_path, caplog):
  tr, state = tiny
  manager = checkpoints.CheckpointManager(
      tmp_path,
      save_interval_steps=1,
      async_save=False,
      metric_name_to_monitor="training_eval/loss")
  for step, loss in ((1, 0.5), (2, 0.2), (3, 0.4)):
    manager.save(
        step,
        state.replace(params=params_plus(state.params, step)), {},
        metrics={"training_eval/loss": loss})
  abstract = tr.state_shapes(tiny_engine.SHAPES).params
  last = params_plus(state.params, 3)
  with caplog.at_level(logging.INFO):
    choice = training_eval.choose_checkpoint(manager, 3, last, abstract)
  assert (choice.step, choice.selection) == (2, {
      "selected_by": "training_eval/loss",
      "metric_mode": "min",
      "training_eval/loss": 0.2
  })
  for a, b in zip(
      jax.tree_util.tree_leaves(jax.device_get(choice.params)),
      jax.tree_util.tree_leaves(params_plus(state.params, 2))):
    np.testing.assert_array_equal(a, b)
  assert "decodes checkpoint_2: the lowest training_eval/loss (0.2) of the kept checkpoints [1, 2, 3]" in caplog.text
  manager.close()
  # the best is the last step: its parameters in memory, nothing read
  best_last = checkpoints.CheckpointManager(
      tmp_path / "b", async_save=False, metric_name_to_monitor="training_eval/loss")
  best_last.save(1, state, {}, force=True, metrics={"training_eval/loss": 0.1})
  assert training_eval.choose_checkpoint(best_last, 1, last, abstract).params is last
  best_last.close()
  plain = checkpoints.CheckpointManager(tmp_path / "c", async_save=False)
  caplog.clear()
  with caplog.at_level(logging.INFO):
    choice = training_eval.choose_checkpoint(plain, 3, last, abstract, note=" (note)")
  assert (choice.step, choice.params, choice.selection) == (3, last, {
      "selected_by": "last checkpoint"
  })
  assert ("decodes the last checkpoint (checkpoint_3): no held-out dev split, no checkpoint "
          "selection") in caplog.text
  plain.close()


def test_final_evaluation_writes_each_split(gold_model, tmp_path):
  tr, state = gold_model
  infer_fn = training_eval.EvaluationConfig(infer_batch_size=4).infer_fn(tr.model, tr.partitioner)
  choice = training_eval.Choice(300, state.params, {"selected_by": "last checkpoint"})
  results = training_eval.final_evaluation([GOLD], infer_fn, choice, tmp_path, num_examples=4)
  assert list(results) == ["mcwq_gold_he_test"] and set(
      results["mcwq_gold_he_test"]) == {"exact_match", "bleu"}
  lines = run_folder.predictions_file(tmp_path, "mcwq_gold_he", "test").read_text().splitlines()
  assert len(lines) == 4
  record = json.loads(run_folder.metrics_file(tmp_path, "mcwq_gold_he", "test").read_text())
  assert (record["step"], record["checkpoint"], record["selected_by"],
          record["num_examples"]) == (300, str(tmp_path / "checkpoint_300"), "last checkpoint", 4)
  assert record["bleu"] == results["mcwq_gold_he_test"]["bleu"] and record["decode_time_s"] > 0
