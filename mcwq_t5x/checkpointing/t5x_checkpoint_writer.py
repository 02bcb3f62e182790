"""Writer of T5X-native checkpoints (msgpack + TensorStore zarr), the format
`checkpoint_import.load_t5x_checkpoint` reads.

Used by tests and tools that need a checkpoint as T5X's legacy `Checkpointer` (or the published
pre-trained checkpoints under gs://t5-data/pretrained_models/t5x/) lays it out; training writes
Orbax checkpoints (`mcwq_t5x.checkpointing.checkpoints`). Imports only the leaf `checkpoint_paths` of the
project.
"""
from __future__ import annotations

import pathlib
from typing import Any, Mapping, Optional

from flax import serialization
from flax import traverse_util
import flax.linen as nn
import numpy as np

from mcwq_t5x.checkpointing import checkpoint_paths

PathLike = checkpoint_paths.PathLike


def save_t5x_checkpoint(params: Mapping[str, Any],
                        path: PathLike,
                        *,
                        step: int = 0,
                        reference: str = "placeholder",
                        optimizer_state: Optional[Mapping[str, Any]] = None) -> pathlib.Path:
  """The directory `path`, a T5X-native checkpoint of `params` (msgpack + TensorStore zarr).

  Each parameter is the zarr array `path/target.<dotted name>`; `path/checkpoint` holds
  {"version": 3, "target": refs, "state": {"step", "param_states"}}. `reference` "placeholder"
  (`PLACEHOLDER://` strings) or "spec" (T5X's own writer); ValueError for another.
  """
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  if reference not in ("placeholder", "spec"):
    raise ValueError(f"reference must be 'placeholder' or 'spec', got "
                     f"{reference!r}")
  directory = pathlib.Path(path)
  directory.mkdir(parents=True, exist_ok=True)
  flat = traverse_util.flatten_dict(nn.unbox(dict(params)))
  refs = {}
  for key, value in flat.items():
    value = np.asarray(value, dtype=np.float32)
    rel = "target." + ".".join(key)
    spec = {
        "driver": "zarr",
        "kvstore": {
            "driver": "file",
            "path": str(directory / rel)
        },
        "metadata": {
            "shape": list(value.shape),
            "dtype": "<f4",
            "chunks": list(value.shape) or [1],
            "compressor": {
                "id": "gzip"
            }
        },
        "create": True,
        "delete_existing": True
    }
    ts.open(spec).result().write(value).result()
    if reference == "placeholder":
      refs[key] = checkpoint_paths.T5X_PLACEHOLDER + rel
    else:
      refs[key] = {
          "driver": "zarr",
          "kvstore": {
              "driver": "file",
              "path": rel
          },
          "metadata": {
              "shape": list(value.shape),
              "dtype": "<f4"
          }
      }
  tree = {
      "version": 3,
      "target": traverse_util.unflatten_dict(refs),
      "state": {
          "step": np.asarray(step, np.int64),
          "param_states": dict(optimizer_state or {})
      }
  }
  (directory / checkpoint_paths.T5X_MSGPACK_FILE).write_bytes(serialization.msgpack_serialize(tree))
  return directory
