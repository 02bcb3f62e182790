"""Where the MCWQ data and the project's caches live.

The data directory (upstream `coastalcph/seq2sparql` `mcwq/`, or the full release with
`dataset.json` and `splits/`) is an explicit `path`, else `$MCWQ_DATA_DIR`, else
`<repository root>/../shared/mcwq`. Caches live in `$MCWQ_CACHE_DIR`, else `~/.cache/mcwq_t5x`,
never next to the data (which may be read-only). A single file may also be an object-store URL
(`read_bytes`: `gs://bucket/key`, `s3://...`, through TensorStore's key-value stores, as the
checkpoints' `checkpointing.checkpoint_paths.StorePath`). No TensorFlow, seqio or gin import.
"""
from __future__ import annotations

import os
import pathlib
from typing import Optional, Union

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "mcwq"
DEFAULT_CACHE_DIR = pathlib.Path("~/.cache/mcwq_t5x")
DATA_DIR_ENV = "MCWQ_DATA_DIR"
CACHE_DIR_ENV = "MCWQ_CACHE_DIR"

PathLike = Union[str, os.PathLike]
# Retries of one object-store request: about 8 s before a store is called unreachable (those of
# `checkpointing.checkpoint_paths.STORE_RETRIES`; this wing cannot import that one).
STORE_RETRIES = {"max_retries": 4, "initial_delay": "0.5s", "max_delay": "4s"}


class DataNotFoundError(FileNotFoundError):
  """Raised when MCWQ data files are missing; the message names the path and the fetch command."""


def fetch_command(out_dir: Optional[PathLike] = None) -> str:
  """`python scripts/download_mcwq.py --out DIR` (from the repository root) filling `out_dir`
  (default `$MCWQ_DATA_DIR` or the default data directory)."""
  if out_dir is None:
    out_dir = os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
  return f"python scripts/download_mcwq.py --out {out_dir}"


def not_found(path: PathLike,
              what: str = "MCWQ data",
              out_dir: Optional[PathLike] = None) -> DataNotFoundError:
  """The DataNotFoundError (to raise) naming the missing `path`, `what` it is and the fetch
  command."""
  if out_dir is not None and pathlib.Path(out_dir).is_dir():
    # A copy exists but lacks this part (the shared copy has dev and test files only): do not
    # suggest writing into it.
    return DataNotFoundError(
        f"{what} not found: expected {path}; this copy ({out_dir}) has no such files. Get the "
        "full release with `python scripts/download_mcwq.py --out DIR`, then "
        f"`export {DATA_DIR_ENV}=DIR`.")
  return DataNotFoundError(
      f"{what} not found: expected {path}. Fetch the public MCWQ files with "
      f"`{fetch_command(out_dir)}` (or copy a local copy with "
      f"`python scripts/download_mcwq.py --from DIR --out {out_dir or '<data dir>'}`), "
      f"then point ${DATA_DIR_ENV} at that directory.")


def data_dir(path: Optional[PathLike] = None, must_exist: bool = True) -> pathlib.Path:
  """The absolute MCWQ data directory: `path`, `$MCWQ_DATA_DIR` or the default.

  DataNotFoundError (naming the path and the fetch command) when `must_exist` and it does not.
  """
  if path is None or str(path) == "":
    path = os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
  resolved = pathlib.Path(path).expanduser().absolute()
  if must_exist and not resolved.is_dir():
    raise not_found(resolved, "MCWQ data directory", out_dir=resolved)
  return resolved


def cache_dir(create: bool = True) -> pathlib.Path:
  """The absolute cache directory `$MCWQ_CACHE_DIR`, else `~/.cache/mcwq_t5x` (made if `create`)."""
  path = pathlib.Path(os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR).expanduser().absolute()
  if create:
    path.mkdir(parents=True, exist_ok=True)
  return path


def is_url(path: PathLike) -> bool:
  """True for `scheme://...` (an object store), False for a local path."""
  return "://" in os.fspath(path)


def read_bytes(path: PathLike) -> bytes:
  """The bytes of a local file, or of an object-store URL (`gs://bucket/key`, `s3://bucket/key`)
  read through TensorStore with `STORE_RETRIES`.

  FileNotFoundError: no such file or object; OSError: a URL that cannot be read (no network, no
  access, a scheme TensorStore lacks), its message "<url>: <the store's error, first line>".
  """
  path = os.fspath(path)
  if not is_url(path):
    return pathlib.Path(path).read_bytes()
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  try:
    context = ts.Context({
        "gcs_request_retries": STORE_RETRIES,
        "s3_request_retries": STORE_RETRIES
    })
    result = ts.KvStore.open(path, context=context).result().read(b"").result()
  except Exception as e:  # why: TensorStore raises ValueError/OSError variants alike
    raise OSError(f"{path}: {(str(e).strip().splitlines() or [type(e).__name__])[0]}") from None
  if result.state != "value":
    raise FileNotFoundError(f"{path}: no such object")
  return bytes(result.value)
