"""Loading parameters from a checkpoint of any format: one registry, format -> loader.

Every parameter load of the project from a path goes through `load_params` (`prediction.load_params`
for eval, infer and INITIAL_CHECKPOINT_PATH; `export_hf`): `checkpoint_paths.locate` names the
format, `LOADERS` maps it to the function that reads it:

| format (`checkpoint_paths`) | loader | reads with |
| --- | --- | --- |
| `FORMAT_ORBAX` ("orbax") | `load_model_dir` | `checkpoints.restore_params_and_step` |
| `FORMAT_T5X` ("t5x") | `load_t5x` | in a MODEL_DIR layout: `load_model_dir`; a standalone folder: `checkpoint_import.load_t5x_checkpoint` |
| `FORMAT_HF` ("hf") | `load_hf` | `checkpoint_import.load_hf_checkpoint` |

A new format is one more `checkpoint_paths` format and one more `LOADERS` entry.
"""
from __future__ import annotations

import pathlib
from typing import Any, Callable, NamedTuple, Optional

from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from mcwq_t5x.checkpointing import checkpoint_import
from mcwq_t5x.checkpointing import checkpoint_paths
from mcwq_t5x.checkpointing import checkpoints
from mcwq_t5x.engine import network

PyTree = Any


class LoadedParams(NamedTuple):
  """What a loader returns: `params` (T5X names; jax arrays of `abstract_params`' dtypes and
  shardings, else float32 numpy), `step` (None for Hugging Face or standalone T5X-native), and
  `directory` (MODEL_DIR for T5X's layout, else the path loaded)."""
  params: PyTree
  step: Optional[int]
  directory: pathlib.Path


# (path, model config, abstract params or None) -> LoadedParams.
Loader = Callable[[pathlib.Path, network.T5Config, Optional[PyTree]], LoadedParams]


def _float32_abstract(config: network.T5Config) -> PyTree:
  """Unsharded float32 `jax.ShapeDtypeStruct`s of `network.Transformer(config)`'s parameters."""
  return traverse_util.unflatten_dict(
      {
          k: jax.ShapeDtypeStruct(shape, jnp.float32)
          for k, shape in checkpoint_import.expected_param_shapes(config).items()
      },
      sep="/")


def _place_tree(params: PyTree, abstract_params: Optional[PyTree]) -> PyTree:
  """Numpy `params` as `abstract_params` describes them (dtype, sharding); unchanged without."""
  if abstract_params is None:
    return params
  return jax.tree_util.tree_map(checkpoints.place, params, abstract_params)  # why: one placement


def load_model_dir(path: pathlib.Path, config: network.T5Config,
                   abstract_params: Optional[PyTree]) -> LoadedParams:
  """T5X's MODEL_DIR layout (Orbax or msgpack steps) via `checkpoints.restore_params_and_step`;
  parameters the model lacks are ignored with a warning."""
  target = abstract_params if abstract_params is not None else _float32_abstract(config)
  params, directory, step = checkpoints.restore_params_and_step(path, target)
  if abstract_params is None:
    params = jax.tree_util.tree_map(lambda x: np.asarray(x, np.float32), params)
  return LoadedParams(params, step, directory)


def load_t5x(path: pathlib.Path, config: network.T5Config,
             abstract_params: Optional[PyTree]) -> LoadedParams:
  """A T5X-native checkpoint: in a MODEL_DIR layout as `load_model_dir`, else a standalone folder
  via `checkpoint_import.load_t5x_checkpoint`, checked strictly against `config`."""
  try:
    checkpoint_paths.resolve_checkpoint(path)
  except checkpoint_paths.NotACheckpointError:
    params = checkpoint_import.load_t5x_checkpoint(path, config)
    return LoadedParams(_place_tree(params, abstract_params), None, path)
  return load_model_dir(path, config, abstract_params)


def load_hf(path: pathlib.Path, config: network.T5Config,
            abstract_params: Optional[PyTree]) -> LoadedParams:
  """A Hugging Face T5/mT5 folder (`checkpoint_import.load_hf_checkpoint`), checked strictly
  against `config`; each parameter is placed as it is read (one host copy at a time)."""
  flat = traverse_util.flatten_dict(abstract_params, sep="/") if abstract_params is not None else {}

  def place(name: str, value: np.ndarray) -> jax.Array:
    return checkpoints.place(value, flat[name], may_alias=True)  # why: the loader's own array

  params = checkpoint_import.load_hf_checkpoint(path, config, place if flat else None)
  return LoadedParams(params, None, path)


LOADERS: dict[str, Loader] = {
    checkpoint_paths.FORMAT_ORBAX: load_model_dir,
    checkpoint_paths.FORMAT_T5X: load_t5x,
    checkpoint_paths.FORMAT_HF: load_hf,
}


def load_params(path: checkpoint_paths.PathLike,
                config: network.T5Config,
                abstract_params: Optional[PyTree] = None) -> LoadedParams:
  """`LoadedParams` (no optimizer state) of the checkpoint at `path`, whatever its format.

  Names and shapes are checked against `config`. Raises NotACheckpointError (no such path, no
  checkpoint there), ValueError (unreadable files), CheckpointMismatchError (each differing
  parameter named), IncompleteCheckpointError, UnreadableCheckpointError, NoUsableCheckpointError.
  """
  fmt, _ = checkpoint_paths.locate(path)
  return LOADERS[fmt](checkpoint_paths.as_path(path), config, abstract_params)
