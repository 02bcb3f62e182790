"""A tiny model and synthetic feature-converter batches shared by the engine tests, and a checkpoint
made unreadable for the tests of its faults."""
import pathlib

import numpy as np

from mcwq_t5x.engine import model as model_lib
from mcwq_t5x.engine import network

VOCAB = 64
SHAPES = {
    "encoder_input_tokens": (8, 12),
    "decoder_input_tokens": (8, 10),
    "decoder_target_tokens": (8, 10),
    "decoder_loss_weights": (8, 10)
}


def tiny_model(dropout_rate: float, vocab_size: int = VOCAB) -> model_lib.EncoderDecoderModel:
  """A 1+1-layer, width-16 mT5-architecture model over a 64-token (or `vocab_size`) vocabulary."""
  cfg = network.get_config(
      "tiny",
      vocab_size=vocab_size,
      emb_dim=16,
      num_heads=2,
      head_dim=8,
      mlp_dim=32,
      num_encoder_layers=1,
      num_decoder_layers=1,
      dropout_rate=dropout_rate)
  return model_lib.EncoderDecoderModel(network.Transformer(cfg))


def synthetic_batch(seed: int, batch: int = 8, min_target_length: int = 3) -> dict:
  """A feature-converter-shaped batch (shapes `SHAPES`, int32): random tokens, EOS=1, rows padded
  with 0 after EOS at random lengths (so microbatches hold different token counts), decoder
  inputs shifted right with BOS=0."""
  rng = np.random.default_rng(seed)
  enc = rng.integers(2, VOCAB, size=(batch, 12)).astype(np.int32)
  tgt = rng.integers(2, VOCAB, size=(batch, 10)).astype(np.int32)
  for i in range(batch):
    li, lt = rng.integers(3, 12), rng.integers(min_target_length, 10)
    enc[i, li] = 1
    enc[i, li + 1:] = 0
    tgt[i, lt] = 1
    tgt[i, lt + 1:] = 0
  dec_in = np.concatenate([np.zeros((batch, 1), np.int32), tgt[:, :-1]], axis=1)
  return {
      "encoder_input_tokens": enc,
      "decoder_input_tokens": dec_in,
      "decoder_target_tokens": tgt,
      "decoder_loss_weights": (tgt > 0).astype(np.int32)
  }


def corrupt_checkpoint(step_dir: pathlib.Path) -> None:
  """Overwrites every array data file of the Orbax checkpoint `step_dir` (`checkpoint_<step>`) with
  garbage of at least its size: the checkpoint is listed but cannot be restored.

  Raises:
    AssertionError: `step_dir` holds no array data files.
  """
  data_files = [f for f in step_dir.rglob("*") if f.is_file() and "/d/" in str(f)]
  assert data_files, f"no array data files found under {step_dir}"
  for f in data_files:
    f.write_bytes(b"\x00garbage" * (f.stat().st_size // 8 + 1))
