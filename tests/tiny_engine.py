"""The tests' one factory of tiny networks: our network's config (`config`, `tiny_model`), the same
sizes as a random transformers T5/mT5 model (`hf_t5`), feature-converter batches (`feature_batch`,
`synthetic_batch`), and a checkpoint made unreadable for the tests of its faults.

Every test that builds a tiny network starts from `config` and names only the sizes it changes.
"""
import pathlib
from typing import Sequence

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


def config(vocab_size: int = VOCAB,
           *,
           layers: int = 1,
           dropout_rate: float = 0.0,
           **sizes) -> network.T5Config:
  """A tiny mT5-architecture config (gated GELU, untied output layer, float32): `layers` encoder
  and decoder blocks of width 16, 2 heads of 8, MLP 32, over a `vocab_size`-token vocabulary.

  Args:
    vocab_size: embedding rows.
    layers: encoder blocks and decoder blocks (each).
    dropout_rate: `T5Config.dropout_rate`.
    **sizes: other `network.T5Config` fields (`emb_dim=48`, `num_decoder_layers=3`...).

  Raises:
    TypeError: a name in `sizes` is not a `T5Config` field.
  """
  fields = dict(
      emb_dim=16,
      num_heads=2,
      head_dim=8,
      mlp_dim=32,
      num_encoder_layers=layers,
      num_decoder_layers=layers,
      dropout_rate=dropout_rate)
  fields.update(sizes)
  return network.get_config("tiny", vocab_size=vocab_size, **fields)


def tiny_model(dropout_rate: float,
               vocab_size: int = VOCAB,
               **sizes) -> model_lib.EncoderDecoderModel:
  """Our model over the network of `config(vocab_size, dropout_rate=dropout_rate, **sizes)` (no
  vocabularies)."""
  return model_lib.EncoderDecoderModel(
      network.Transformer(config(vocab_size, dropout_rate=dropout_rate, **sizes)))


def hf_t5(kind: str, vocab_size: int, **config_fields):
  """A random transformers model with the T5 layout of `kind`, 2+2 layers of width 32, 4 heads of 8,
  MLP 48, no dropout (the torch seed is the caller's):

  * "mt5": `MT5ForConditionalGeneration`, gated GELU, an output layer of its own (`lm_head`,
    N(0, 1), not tied to the embedding);
  * "t5_1_0": `T5ForConditionalGeneration`, ReLU, the output layer tied to the embedding.

  `config_fields` are further `MT5Config`/`T5Config` fields (token ids, relative attention...).

  Raises:
    ValueError: an unknown `kind`.
  """
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  common = dict(
      vocab_size=vocab_size,
      d_model=32,
      d_kv=8,
      d_ff=48,
      num_layers=2,
      num_decoder_layers=2,
      num_heads=4,
      dropout_rate=0.0,
      **config_fields)
  if kind == "mt5":
    hf = transformers.MT5ForConditionalGeneration(
        transformers.MT5Config(feed_forward_proj="gated-gelu", tie_word_embeddings=False, **common))
    # A separate output layer (transformers re-ties it at construction).
    hf.lm_head.weight = torch.nn.Parameter(torch.randn(vocab_size, common["d_model"]))
    return hf
  if kind == "t5_1_0":
    return transformers.T5ForConditionalGeneration(
        transformers.T5Config(feed_forward_proj="relu", tie_word_embeddings=True, **common))
  raise ValueError(f"unknown kind {kind!r}; expected 'mt5' or 't5_1_0'")


def feature_batch(inputs: Sequence[Sequence[int]],
                  targets: Sequence[Sequence[int]],
                  input_length: int | None = None,
                  target_length: int | None = None,
                  weights_dtype=np.int32) -> dict[str, np.ndarray]:
  """The feature-converter batch of token rows (each with its EOS): `encoder_input_tokens` and
  `decoder_target_tokens` zero-padded to `input_length`/`target_length` (default: the longest row),
  `decoder_input_tokens` the targets shifted right after BOS 0, `decoder_loss_weights` 1 on every
  target token (`weights_dtype`). All int32 but the weights, shapes [rows, length].

  Raises:
    ValueError: a row longer than its length.
  """

  def pad(rows, length):
    length = max(map(len, rows)) if length is None else length
    out = np.zeros((len(rows), length), np.int32)
    for i, row in enumerate(rows):
      if len(row) > length:
        raise ValueError(f"row {i} has {len(row)} tokens, more than the length {length}")
      out[i, :len(row)] = row
    return out

  enc, tgt = pad(inputs, input_length), pad(targets, target_length)
  return {
      "encoder_input_tokens": enc,
      "decoder_input_tokens": np.concatenate([np.zeros_like(tgt[:, :1]), tgt[:, :-1]], axis=1),
      "decoder_target_tokens": tgt,
      "decoder_loss_weights": (tgt > 0).astype(weights_dtype)
  }


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
