"""Tests of mcwq_t5x.data.training_data alone: a run's batches depend only on the data seed and the
step, each process gets its rows of every global batch, the periodic loss reads the first
EVAL_STEPS batches of its split, the data position saved with a checkpoint and the check of a
resumed one; once on the real 155 Hebrew gold questions."""
import logging

import numpy as np
import pytest

from mcwq_t5x.data import pipeline
from mcwq_t5x.data import training_data

TRAIN = pipeline.DatasetConfig("mcwq_gold_he", {"inputs": 40, "targets": 128}, "test", 8, seed=None)


class StandInLoader:
  """`pipeline.load_feature_arrays`: 20 rows whose "row" feature [20, 3] holds the row index;
  records each call's configuration, shard and `num_examples`."""

  def __init__(self):
    self.calls = []

  def __call__(self, cfg, shard_index=0, num_shards=1, num_examples=None):
    self.calls.append((cfg.split, shard_index, num_shards, num_examples))
    n = 20 if num_examples is None else num_examples
    return {"row": np.repeat(np.arange(n, dtype=np.int32)[:, None], 3, axis=1)}


def test_batches_follow_the_seed_and_each_process_gets_its_rows(caplog):
  loader = StandInLoader()
  with caplog.at_level(logging.INFO):
    data = training_data.load(
        TRAIN, local_rows=slice(4, 8), random_seed=7, process=(1, 2), load_arrays=loader)
  assert loader.calls == [("test", 0, 1, None)]  # every process reads the whole split
  assert data.data_seed == 7 and data.eval_arrays is None and data.eval_batch_size is None
  reference = pipeline.DeterministicBatches(loader(TRAIN), 8, seed=7, shuffle=True)
  for step in (0, 1, 2, 5):
    np.testing.assert_array_equal(data.local_batch(step)["row"], reference.batch(step)["row"][4:8])
  assert data.global_shapes() == {"row": (8, 3)}  # the global batch, not this process's 4 rows
  assert "20 rows" in caplog.text and "process 1 of 2 feeds rows 4:8 of each batch of 8" in caplog.text
  # the dataset's own seed wins over the run's
  seeded = training_data.load(
      pipeline.DatasetConfig("t", None, "train", 8, seed=3),
      local_rows=slice(0, 8),
      random_seed=7,
      load_arrays=StandInLoader())
  assert seeded.data_seed == 3
  by_3 = pipeline.DeterministicBatches(loader(TRAIN), 8, seed=3)
  np.testing.assert_array_equal(seeded.local_batch(0)["row"], by_3.batch(0)["row"])
  assert not np.array_equal(by_3.batch(0)["row"], reference.batch(0)["row"])


def test_the_periodic_loss_reads_the_first_eval_steps_batches():
  loader = StandInLoader()
  dev = pipeline.DatasetConfig("mcwq_gold_he", None, "validation", 6, shuffle=False)
  data = training_data.load(
      TRAIN,
      local_rows=slice(0, 8),
      eval_cfg=dev,
      eval_batch_size=8,
      eval_steps=2,
      load_arrays=loader)
  assert loader.calls[1] == ("validation", 0, 1, 16)
  assert data.eval_batch_size == 8
  np.testing.assert_array_equal(data.eval_arrays["row"][:, 0], np.arange(16))
  every_row = training_data.load(
      TRAIN,
      local_rows=slice(0, 8),
      eval_cfg=dev,
      eval_batch_size=8,
      eval_steps=None,
      load_arrays=loader)
  assert loader.calls[-1] == ("validation", 0, 1, None) and len(every_row.eval_arrays["row"]) == 20


def test_the_data_position_and_a_resumed_one(caplog):
  data = training_data.load(
      TRAIN, local_rows=slice(0, 8), random_seed=5, load_arrays=StandInLoader())
  assert data.data_state(12) == {
      "step": 12,
      "data_seed": 5,
      "global_batch_size": 8,
      "task": "mcwq_gold_he",
      "split": "test"
  }
  assert data.check_resumed(data.data_state(12)) and data.check_resumed({"step": 3})
  # why levels: load's INFO line is captured too when an earlier test set the root logger to INFO
  assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
  with caplog.at_level(logging.WARNING):
    assert not data.check_resumed({**data.data_state(12), "data_seed": 6})
    assert not data.check_resumed({**data.data_state(12), "global_batch_size": 16})
  assert caplog.text.count("the data order will differ from the interrupted run") == 2
  # Another task or split: not the same run at all (decoding it would report the other data's
  # model as this task's).
  for changed in ({"task": "mcwq_gold_en"}, {"split": "validation"}):
    saved = {**data.data_state(12), **changed}
    with pytest.raises(
        training_data.OtherTrainingDataError,
        match=(f"^MODEL_DIR runs/x holds a training on {saved['task']}/{saved['split']} \\(the "
               r"data position of checkpoint step 12\), this run asks for mcwq_gold_he/test: "
               r".*INITIAL_CHECKPOINT_PATH = 'runs/x'")):
      data.check_resumed(saved, "runs/x")


def test_an_empty_split_is_refused():
  with pytest.raises(ValueError, match="no rows"):
    training_data.load(
        TRAIN,
        local_rows=slice(0, 8),
        load_arrays=lambda *a, **k: {"row": np.zeros((0, 3), np.int32)})


def test_the_real_split():
  """The 155 gold questions, unpacked, through SeqIO: every row in the epoch's first 155 slots;
  the periodic loss's 16 rows are the split's first 16 in source order."""
  eval_cfg = pipeline.DatasetConfig(**{**TRAIN.__dict__, "shuffle": False, "seed": 42})
  data = training_data.load(
      TRAIN, local_rows=slice(0, 8), eval_cfg=eval_cfg, eval_batch_size=8, eval_steps=2)
  assert data.batches.num_rows == 155 and data.global_shapes()["encoder_input_tokens"] == (8, 40)
  epoch = np.concatenate([data.batches.indices(s) for s in range(20)])[:155]
  assert sorted(epoch.tolist()) == list(range(155))
  source = data.batches.arrays["decoder_target_tokens"]
  np.testing.assert_array_equal(data.eval_arrays["decoder_target_tokens"], source[:16])
