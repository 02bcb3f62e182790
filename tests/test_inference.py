"""Tests of mcwq_t5x.inference with a tiny model and inputs built here: decoding a dataset in
batches (sorted by length, last batch padded, batch sizes rounded to the data-parallel devices)
gives, row for row, what the model decodes for the whole array at once."""
import jax
import numpy as np
import optax
import pytest

from mcwq_t5x import inference
from mcwq_t5x import partitioning
from mcwq_t5x import trainer as trainer_lib
import tiny_engine


@pytest.fixture(scope="module")
def model_and_params():
  partitioner = partitioning.Partitioner(devices=jax.devices()[:4])
  model = tiny_engine.tiny_model(0.0)
  tr = trainer_lib.Trainer(model, partitioner, lambda step: 0.0, optimizer=optax.set_to_zero())
  state = tr.create_state(tiny_engine.SHAPES)
  return model, partitioner, state.params


def test_batch_size_rounded_up_to_the_devices(model_and_params):
  _, partitioner, _ = model_and_params
  assert inference.decoding_batch_size(6, partitioner) == 8
  assert inference.decoding_batch_size(8, partitioner) == 8
  with pytest.raises(ValueError, match="positive"):
    inference.decoding_batch_size(0, partitioner)


def test_infer_fn_matches_one_big_batch_in_row_order(model_and_params):
  model, partitioner, params = model_and_params
  rows = tiny_engine.synthetic_batch(3, batch=11)
  arrays = {k: rows[k] for k in inference.DECODE_FEATURES}
  # 11 rows in batches of 6 -> 8 (4 devices): two batches, the second padded with 5 empty rows.
  tokens = inference.get_infer_fn(model, partitioner, 6)(params, arrays)
  assert tokens.shape == (11, arrays["decoder_input_tokens"].shape[1])
  padded = {k: np.concatenate([v, np.zeros((1,) + v.shape[1:], v.dtype)]) for k, v in arrays.items()}
  reference = np.asarray(model.predict_batch(params, padded))[:11]
  np.testing.assert_array_equal(tokens, reference)


def test_infer_fn_empty_input(model_and_params):
  model, partitioner, params = model_and_params
  empty = {
      "encoder_input_tokens": np.zeros((0, 12), np.int32),
      "decoder_input_tokens": np.zeros((0, 10), np.int32)
  }
  assert inference.get_infer_fn(model, partitioner, 4)(params, empty).shape == (0, 10)
