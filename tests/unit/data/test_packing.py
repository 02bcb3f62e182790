"""Tests of mcwq_t5x.data.packing: SeqIO's rows exactly (greedy), and first-fit decreasing rows that
hold every example once, within the row lengths, in fewer rows (real MCWQ data)."""
import numpy as np
import pytest

from mcwq_t5x.data import packing
from mcwq_t5x.data import pipeline

LENGTHS = {"inputs": 64, "targets": 128}


def _unpacked(tokens_in, tokens_out, li=8, lt=8):
  """Unpacked converter features for examples given as token lists (EOS included)."""
  n = len(tokens_in)
  arrays = {
      k: np.zeros((n, li if k == "encoder_input_tokens" else lt), np.int32)
      for k in packing.UNPACKED_FEATURES
  }
  for r, (a, b) in enumerate(zip(tokens_in, tokens_out)):
    arrays["encoder_input_tokens"][r, :len(a)] = a
    arrays["decoder_target_tokens"][r, :len(b)] = b
    arrays["decoder_input_tokens"][r, 1:len(b)] = b[:-1]
    arrays["decoder_loss_weights"][r, :len(b)] = 1
  return arrays


def _examples_of(rows):
  """The (input, target) token tuples held by packed rows, read back through the segment ids."""
  out = []
  for r in range(len(rows["encoder_input_tokens"])):
    for seg in range(1, int(rows["decoder_segment_ids"][r].max()) + 1):
      i = rows["encoder_input_tokens"][r][rows["encoder_segment_ids"][r] == seg]
      t = rows["decoder_target_tokens"][r][rows["decoder_segment_ids"][r] == seg]
      out.append((tuple(i.tolist()), tuple(t.tolist())))
  return out


def test_first_fit_decreasing_on_a_small_example():
  # Target lengths 5, 4, 3, 2, 2 into rows of 7: FFD gives [5, 2], [4, 3], [2].
  targets = [[7] * 4 + [1], [8] * 3 + [1], [9] * 2 + [1], [6, 1], [5, 1]]
  arrays = _unpacked([[3, 1]] * 5, targets, li=8, lt=8)
  assert packing.assign_rows([2] * 5, [5, 4, 3, 2, 2], 8, 7) == [[0, 3], [1, 2], [4]]
  assert packing.assign_rows([2] * 5, [5, 4, 3, 2, 2], 8, 7, "greedy") == [[0], [1, 2], [3, 4]]
  # SeqIO packs windows of max(lengths) = 8 examples on their own.
  assert packing.assign_rows([1] * 10, [1] * 10, 8, 8, "greedy") == [list(range(8)), [8, 9]]
  rows = packing.pack(arrays, 8, 7)
  np.testing.assert_array_equal(rows["decoder_target_tokens"][0], [7, 7, 7, 7, 1, 6, 1])
  np.testing.assert_array_equal(rows["decoder_input_tokens"][0], [0, 7, 7, 7, 7, 0, 6])
  np.testing.assert_array_equal(rows["decoder_segment_ids"][0], [1, 1, 1, 1, 1, 2, 2])
  np.testing.assert_array_equal(rows["decoder_positions"][0], [0, 1, 2, 3, 4, 0, 1])
  np.testing.assert_array_equal(rows["decoder_loss_weights"][2], [1, 1, 0, 0, 0, 0, 0])
  np.testing.assert_array_equal(rows["encoder_input_tokens"][0], [3, 1, 3, 1, 0, 0, 0, 0])
  np.testing.assert_array_equal(rows["encoder_segment_ids"][0], [1, 1, 2, 2, 0, 0, 0, 0])
  np.testing.assert_array_equal(rows["encoder_positions"][0], [0, 1, 0, 1, 0, 0, 0, 0])


def test_input_length_also_limits_a_row():
  # Targets would all fit one row; inputs of 5 tokens do not (row of 8 input tokens).
  assert packing.assign_rows([5, 5, 3], [1, 1, 1], 8, 100) == [[0, 2], [1]]


def test_bad_input_is_named():
  with pytest.raises(ValueError, match=r"example 1 \(9 input / 2 target tokens\) is longer"):
    packing.assign_rows([2, 9], [2, 2], 8, 8)
  with pytest.raises(ValueError, match="unknown packing method 'best'"):
    packing.assign_rows([2], [2], 8, 8, "best")
  with pytest.raises(KeyError, match="decoder_loss_weights"):
    packing.pack({"encoder_input_tokens": np.ones((1, 2), np.int32)}, 8, 8)


@pytest.fixture(scope="module")
def dev_unpacked():
  """English random_split dev set (6,163 questions), unpacked, 64/128 tokens."""
  cfg = pipeline.DatasetConfig(
      "mcwq_random_split_en", LENGTHS, "validation", 32, pack=False, module="tasks.mcwq")
  return pipeline.load_feature_arrays(cfg)


def seqio_arrays(name: str, pack: bool) -> dict:
  """`seqio.get_dataset`'s validation rows of task `name` (AutoGraph on, as SeqIO runs it)."""
  import seqio  # pylint: disable=g-import-not-at-top
  ds = seqio.get_dataset(
      name,
      task_feature_lengths=LENGTHS,
      dataset_split="validation",
      shuffle=False,
      num_epochs=1,
      feature_converter=seqio.EncDecFeatureConverter(pack=pack))
  return pipeline.dataset_to_arrays(ds.batch(1024).as_numpy_iterator())


def test_greedy_gives_seqios_packed_rows_exactly(dev_unpacked):
  expected = seqio_arrays("mcwq_random_split_en", pack=True)
  ours = packing.pack(dev_unpacked, 64, 128, "greedy")
  assert sorted(ours) == sorted(expected)
  assert len(ours["decoder_target_tokens"]) == len(expected["decoder_target_tokens"]) == 1317
  for k in expected:
    np.testing.assert_array_equal(ours[k], expected[k], err_msg=k)


def test_first_fit_holds_every_dev_example_once_in_fewer_rows(dev_unpacked):
  rows = packing.pack(dev_unpacked, 64, 128)
  n = len(dev_unpacked["encoder_input_tokens"])
  assert n == 6163
  assert len(rows["decoder_target_tokens"]) == 1195  # greedy (SeqIO): 1,317
  li = packing.sequence_lengths(dev_unpacked["encoder_input_tokens"])
  lt = packing.sequence_lengths(dev_unpacked["decoder_target_tokens"])
  source = [(tuple(dev_unpacked["encoder_input_tokens"][k, :li[k]].tolist()),
             tuple(dev_unpacked["decoder_target_tokens"][k, :lt[k]].tolist())) for k in range(n)]
  assert sorted(_examples_of(rows)) == sorted(source)
  assert rows["decoder_loss_weights"].sum() == lt.sum()
  # Teacher forcing never crosses an example boundary.
  starts = rows["decoder_positions"] == 0
  assert (rows["decoder_input_tokens"][starts] == 0).all()


def test_load_feature_arrays_packs_with_the_configured_method():

  def load(**kw):
    cfg = pipeline.DatasetConfig(
        "mcwq_random_split_en", LENGTHS, "validation", 32, module="tasks.mcwq", **kw)
    return pipeline.load_feature_arrays(cfg, num_examples=300)

  unpacked = load()
  assert len(unpacked["encoder_input_tokens"]) == 300
  for method in packing.METHODS:
    rows = load(pack=True, packing_method=method)
    expected = packing.pack(unpacked, 64, 128, method)
    assert sorted(rows) == sorted(expected)
    for k in expected:
      np.testing.assert_array_equal(rows[k], expected[k], err_msg=f"{method} {k}")


def test_a_preprocessor_that_needs_autograph_is_built_with_it(caplog):
  """`pipeline.without_autograph`: a task whose preprocessor has a Python `if` on a tensor (which only
  AutoGraph can trace) loads as `seqio.get_dataset` gives it, and the log says why."""
  import seqio  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tasks.mcwq  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import

  def source(split, shuffle_files, seed=None):
    del split, shuffle_files, seed
    return tf.data.Dataset.from_tensor_slices({
        "inputs": ["Did M0 direct M1", "Who"],
        "targets": ["SELECT count(*) WHERE { M0 wdt:P57 M1 }", "SELECT ?x0"]
    })

  def exclaim_long_questions(ds):

    def fn(ex):
      inputs = ex["inputs"]
      if tf.strings.length(inputs) > 3:  # a Python `if` on a tensor: AutoGraph makes it a tf.cond
        inputs = tf.strings.join([inputs, " !"])
      return {**ex, "inputs": inputs}

    return ds.map(fn)

  name = "test_packing_needs_autograph"
  seqio.TaskRegistry.add(
      name,
      source=seqio.FunctionDataSource(source, splits=["validation"]),
      preprocessors=[
          exclaim_long_questions, seqio.preprocessors.tokenize,
          seqio.preprocessors.append_eos_after_trim
      ],
      output_features=seqio.get_mixture_or_task("mcwq_gold_he").output_features)
  try:
    with caplog.at_level("INFO"):
      ours = pipeline.load_feature_arrays(pipeline.DatasetConfig(name, LENGTHS, "validation", 2))
    expected = seqio_arrays(name, pack=False)
  finally:
    seqio.TaskRegistry.remove(name)
  assert sorted(ours) == sorted(expected)
  for k in expected:
    np.testing.assert_array_equal(ours[k], expected[k], err_msg=k)
  vocabulary = seqio.get_mixture_or_task("mcwq_gold_he").output_features["inputs"].vocabulary
  assert vocabulary.decode(ours["encoder_input_tokens"][1].tolist()) == "Who"
  assert vocabulary.decode(ours["encoder_input_tokens"][0].tolist()) == "Did M0 direct M1 !"
  assert "load_feature_arrays: a preprocessor needs AutoGraph" in caplog.text
