"""The SeqIO -> numpy pipeline (mcwq_t5x.data.pipeline): examples longer than the task's feature
lengths are counted and logged, on the 155 Hebrew gold questions (real MCWQ text, loaded in a
second). Packing and batches: test_packing.py."""
import dataclasses
import logging

from mcwq_t5x.data import pipeline


def test_truncation_is_counted_and_logged(mcwq_dir, caplog):
  del mcwq_dir
  cfg = pipeline.DatasetConfig(
      "mcwq_gold_he_prefixed", {
          "inputs": 16,
          "targets": 512
      },
      "test",
      8,
      shuffle=False,
      module="tasks.mcwq")
  counts = pipeline.count_truncated(cfg)
  assert counts["inputs"]["examples"] == 155 and counts["inputs"]["truncated"] == 155
  assert counts["targets"]["truncated"] == 0 and counts["inputs"]["longest"] > 16
  # At the boundary: an example exactly as long as the limit fits; counted against the lengths of
  # the task's own examples, read one by one.
  import seqio  # pylint: disable=g-import-not-at-top
  lengths = [
      len(ex["inputs"]) for ex in seqio.get_mixture_or_task("mcwq_gold_he_prefixed").get_dataset(
          None, split="test", shuffle=False).as_numpy_iterator()
  ]
  longest = counts["inputs"]["longest"]
  assert longest == max(lengths) and sum(l == longest for l in lengths) >= 1
  for limit in (longest - 1, longest):
    at = pipeline.count_truncated(
        dataclasses.replace(cfg, task_feature_lengths={
            "inputs": limit,
            "targets": 512
        }))
    assert at["inputs"]["truncated"] == sum(l > limit for l in lengths), limit
  with caplog.at_level(logging.WARNING):
    arrays = pipeline.load_feature_arrays(cfg)
  assert arrays["encoder_input_tokens"].shape == (155, 16)
  (line,) = [r.getMessage() for r in caplog.records if "TRUNCATED" in r.getMessage()]
  assert "155 of 155 inputs" in line and "mcwq_gold_he_prefixed/test" in line
  assert pipeline.count_truncated(
      pipeline.DatasetConfig("mcwq_gold_he", None, "test", 8, module="tasks.mcwq")) == {}
