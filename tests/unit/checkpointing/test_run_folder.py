"""The run folder's names and writers (`mcwq_t5x.checkpointing.run_folder`)."""
import json

import pytest

from mcwq_t5x.checkpointing import best_checkpoint
from mcwq_t5x.checkpointing import run_folder


def test_run_folder_and_its_name(tmp_path):
  """A MODEL_DIR is known by run.json, config.gin or a checkpoint; predictions in its
  `eval_<step>/predictions/` are the run's; a CHECKPOINT_PATH names its MODEL_DIR."""
  run = tmp_path / "zs_he"
  (run / "checkpoint_40").mkdir(parents=True)
  assert run_folder.is_run_folder(run) and not run_folder.is_run_folder(tmp_path)
  inner = run_folder.predictions_file(run_folder.eval_dir(run, 40), "mcwq_mcd1_he", "test")
  assert inner == run / "eval_40/predictions/mcwq_mcd1_he_test.txt"
  assert run_folder.run_folder_of(inner.parent) == run.absolute()
  assert run_folder.run_name(inner.parent) == "zs_he"
  assert run_folder.run_name_of_checkpoint("runs/zs_he/checkpoint_40/") == "zs_he"
  assert run_folder.run_name_of_checkpoint(r"C:\runs\en") == "en"
  assert run_folder.run_name_of_checkpoint("checkpoint_40") is None
  assert run_folder.metrics_file(run, "t", "test") == run / "metrics/t_test.json"


def test_an_eval_never_replaces_a_trainings_results(tmp_path):
  """An EVAL_OUTPUT_DIR that is a run folder holding the training's final evaluation of the split
  (its metrics record no "predict_kwargs", or cannot be read) is refused; an earlier eval's files,
  another split, or a folder that is no run's are not."""
  run = tmp_path / "run"
  (run / "checkpoint_4").mkdir(parents=True)
  met = run_folder.metrics_file(run, "mcwq_gold_he", "test")
  met.parent.mkdir()
  check = lambda folder=run, split="test": run_folder.check_keeps_training_results(
      folder, "mcwq_gold_he", split)
  check()  # nothing to replace yet
  for record in ('{"step": 4, "selected_by": "last checkpoint"}', "{not json"):
    met.write_text(record)
    with pytest.raises(
        run_folder.TrainingResultsError,
        match=(f"^EVAL_OUTPUT_DIR {run} is a training run's MODEL_DIR, and "
               f"{run}/predictions/mcwq_gold_he_test.txt with {met} are its final "
               "evaluation of mcwq_gold_he/test: this eval would replace them")):
      check()
    check(split="validation")
  met.write_text('{"step": 4, "predict_kwargs": {}}')  # an eval's: replaced as in eval_<step>/
  check()
  (tmp_path / "out" / "metrics").mkdir(parents=True)
  (tmp_path / "out" / "metrics" / "mcwq_gold_he_test.json").write_text('{"step": 4}')
  check(tmp_path / "out")  # no run folder: an eval's output folder of the user's


def test_resume_drops_metric_rows_after_the_resumed_step(tmp_path):
  """A run killed at step 40 after checkpoint 20 resumes from 20: the rows of steps 25-40 are
  dropped (they are written again), so no step appears twice; a line cut off by the kill too."""
  train_rows = [{"step": s, "loss": 1.0} for s in range(5, 45, 5)]
  (tmp_path / "train_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train_rows) +
                                                '{"step": 4')
  (tmp_path / "eval_metrics.jsonl").write_text("".join(
      json.dumps({"step": s}) + "\n" for s in (20, 40)))
  dropped = run_folder.drop_metric_rows_after(tmp_path, 20)
  assert dropped == {"train_metrics.jsonl": 5, "eval_metrics.jsonl": 1}
  rows = [json.loads(l) for l in (tmp_path / "train_metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [5, 10, 15, 20]
  assert (tmp_path / "eval_metrics.jsonl").read_text() == '{"step": 20}\n'
  assert run_folder.drop_metric_rows_after(tmp_path, 20) == {}  # nothing more to drop
  assert run_folder.drop_metric_rows_after(tmp_path / "missing", 0) == {}


def test_tensorboard_metrics_are_plain_scalars(tmp_path):
  from tensorboard.backend.event_processing import event_accumulator  # pylint: disable=g-import-not-at-top
  writer = run_folder.create_metric_writer(str(tmp_path / "train"))
  writer.write_scalars(1, {"loss": 2.5, "accuracy": 0.25})
  writer.write_scalars(2, {"loss": 1.5, "accuracy": 0.5})
  writer.close()
  acc = event_accumulator.EventAccumulator(str(tmp_path / "train"))
  acc.Reload()
  assert sorted(acc.Tags()["scalars"]) == ["accuracy", "loss"]
  assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 2.5), (2, 1.5)]
  # best_checkpoint reads them too (T5X's {run}/{tag} form).
  assert best_checkpoint.read_metric(tmp_path, "train/loss") == {1: 2.5, 2: 1.5}


def test_a_failed_start_is_undone(tmp_path):
  """`FolderBefore.undo_failed_start`: a MODEL_DIR the start made is removed; one that existed
  loses what the start added and gets its rewritten config.gin and run.json back; one with a new
  metrics row or finished checkpoint is left alone."""
  new = tmp_path / "new"
  before = run_folder.FolderBefore.take(new)
  new.mkdir()
  (new / "train.lock").write_text("{}")
  (new / "config.gin").write_text("# The operative gin config\n")
  assert before.undo_failed_start() == ["."] and not new.exists()

  old = tmp_path / "old"
  (old / "notes").mkdir(parents=True)
  (old / "notes" / "mine.txt").write_text("the user's")
  (old / "config.gin").write_text("resumed run's config")
  (old / "run.json").write_text('{"format": 1}')
  before = run_folder.FolderBefore.take(old)
  (old / "train.lock").write_text("{}")
  (old / "config.gin").write_text("the failed start's config")
  (old / "vocab").mkdir()
  (old / "vocab" / "spm.model").write_bytes(b"x")
  (old / "notes" / "new.txt").write_text("added")
  assert before.undo_failed_start() == [
      "config.gin", "notes/new.txt", "train.lock", "vocab", "vocab/spm.model"
  ]
  assert sorted(str(p.relative_to(old)) for p in old.rglob("*")) == [
      "config.gin", "notes", "notes/mine.txt", "run.json"
  ]
  assert (old / "config.gin").read_text() == "resumed run's config"

  # A start that wrote a metrics row or finished a checkpoint trained: nothing is undone.
  before = run_folder.FolderBefore.take(old)
  (old / "train.lock").write_text("{}")
  (old / run_folder.TRAIN_METRICS).write_text('{"step": 1}\n')
  assert before.undo_failed_start() == [] and (old / "train.lock").exists()
  (old / run_folder.TRAIN_METRICS).unlink()
  (old / "checkpoint_5" / "state").mkdir(parents=True)
  assert before.undo_failed_start() == [] and (old / "train.lock").exists()
