"""Packing of encoder-decoder examples into fixed-length rows, on numpy arrays.

`pack()` takes the UNPACKED `EncDecFeatureConverter(pack=False)` arrays and returns rows with
exactly the features and conventions of SeqIO's packed converter (segment ids 1, 2, ... and 0 on
padding, positions restarting per example, `decoder_input_tokens` shifted within each example).
"greedy" is SeqIO's stream-order rule and gives its rows exactly; "first_fit" (default) is
first-fit decreasing bin packing in two dimensions (Johnson, 1973), deterministic. On MCWQ
(English random-split dev, 2,000-piece vocabulary) greedy 64/128-token rows hold 2.1 examples
where the targets leave room for 2.7: a third of each step padding. Rows are training rows, their
order meaningless (the trainer shuffles them). No TensorFlow.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

METHODS = ("first_fit", "greedy")
UNPACKED_FEATURES = ("encoder_input_tokens", "decoder_target_tokens", "decoder_input_tokens",
                     "decoder_loss_weights")


def sequence_lengths(tokens: np.ndarray) -> np.ndarray:
  """int64 [N]: last non-zero token's index + 1 of right-padded int `tokens` [N, L] (0 if empty)."""
  nonzero = tokens != 0
  last = tokens.shape[1] - np.argmax(nonzero[:, ::-1], axis=1)
  return np.where(nonzero.any(axis=1), last, 0).astype(np.int64)


def assign_rows(input_lengths: np.ndarray,
                target_lengths: np.ndarray,
                input_capacity: int,
                target_capacity: int,
                method: str = "first_fit") -> list[list[int]]:
  """Lists of example indices (source order within a row) placing int [N] `input_lengths` /
  `target_lengths` (EOS included) into rows of `input_capacity` / `target_capacity` tokens.

  `method`: "first_fit" or "greedy". ValueError: unknown method, an example longer than the row.
  """
  if method not in METHODS:
    raise ValueError(f"unknown packing method {method!r}; expected one of {METHODS}")
  li = np.asarray(input_lengths, np.int64)
  lt = np.asarray(target_lengths, np.int64)
  too_long = np.flatnonzero((li > input_capacity) | (lt > target_capacity))
  if too_long.size:
    i = int(too_long[0])
    raise ValueError(f"example {i} ({li[i]} input / {lt[i]} target tokens) is longer than a packed "
                     f"row ({input_capacity} / {target_capacity}); trim it first")
  rows: list[list[int]] = []
  if method == "greedy":
    # SeqIO packs each window of max(lengths) consecutive examples on its own.
    window = max(input_capacity, target_capacity)
    used_i = used_t = 0
    for k in range(len(li)):
      if k % window == 0 or used_i + li[k] > input_capacity or used_t + lt[k] > target_capacity:
        rows.append([])
        used_i = used_t = 0
      rows[-1].append(k)
      used_i += int(li[k])
      used_t += int(lt[k])
    return rows
  order = np.lexsort((np.arange(len(li)), -li, -lt))  # longest target first, then input, then index
  # First fit: each example into the first open row where both its input and target fit.
  free_i = np.empty(len(li), np.int64)  # room left in each row opened so far
  free_t = np.empty(len(li), np.int64)
  n_rows = 0
  for k in order:
    fits = np.flatnonzero((free_i[:n_rows] >= li[k]) & (free_t[:n_rows] >= lt[k]))
    if fits.size:
      r = int(fits[0])
    else:
      r = n_rows
      n_rows += 1
      free_i[r], free_t[r] = input_capacity, target_capacity
      rows.append([])
    rows[r].append(int(k))
    free_i[r] -= li[k]
    free_t[r] -= lt[k]
  return [sorted(r) for r in rows]


def pack(arrays: Mapping[str, np.ndarray],
         input_length: int,
         target_length: int,
         method: str = "first_fit") -> dict[str, np.ndarray]:
  """SeqIO's packed `EncDecFeatureConverter` features, int32 [rows, input_length] or [rows,
  target_length], of unpacked `arrays` [N, Li] / [N, Lt] (`UNPACKED_FEATURES`; others dropped).

  Features: encoder_input_tokens, encoder_segment_ids, encoder_positions, decoder_target_tokens,
  decoder_input_tokens, decoder_loss_weights, decoder_segment_ids, decoder_positions. Raises
  KeyError (a feature missing), ValueError (unknown method; an example longer than a row).
  """
  missing = [k for k in UNPACKED_FEATURES if k not in arrays]
  if missing:
    raise KeyError(f"packing needs the unpacked features {UNPACKED_FEATURES}; missing {missing}")
  enc = np.asarray(arrays["encoder_input_tokens"])
  tgt = np.asarray(arrays["decoder_target_tokens"])
  li, lt = sequence_lengths(enc), sequence_lengths(tgt)
  rows = assign_rows(li, lt, input_length, target_length, method)
  n = len(rows)
  out = {
      "encoder_input_tokens": np.zeros((n, input_length), np.int32),
      "encoder_segment_ids": np.zeros((n, input_length), np.int32),
      "encoder_positions": np.zeros((n, input_length), np.int32),
      "decoder_target_tokens": np.zeros((n, target_length), np.int32),
      "decoder_input_tokens": np.zeros((n, target_length), np.int32),
      "decoder_loss_weights": np.zeros((n, target_length), np.int32),
      "decoder_segment_ids": np.zeros((n, target_length), np.int32),
      "decoder_positions": np.zeros((n, target_length), np.int32),
  }
  for r, members in enumerate(rows):
    pos_i = pos_t = 0
    for seg, k in enumerate(members, start=1):
      a, b = int(li[k]), int(lt[k])
      out["encoder_input_tokens"][r, pos_i:pos_i + a] = enc[k, :a]
      out["encoder_segment_ids"][r, pos_i:pos_i + a] = seg
      out["encoder_positions"][r, pos_i:pos_i + a] = np.arange(a)
      out["decoder_target_tokens"][r, pos_t:pos_t + b] = tgt[k, :b]
      # Shifted right within the example: 0 (BOS) first, then its own targets.
      if b > 1:
        out["decoder_input_tokens"][r, pos_t + 1:pos_t + b] = tgt[k, :b - 1]
      out["decoder_loss_weights"][r, pos_t:pos_t + b] = 1
      out["decoder_segment_ids"][r, pos_t:pos_t + b] = seg
      out["decoder_positions"][r, pos_t:pos_t + b] = np.arange(b)
      pos_i += a
      pos_t += b
  return out
