"""Where the MCWQ data and the project's caches live.

The data directory (upstream `coastalcph/seq2sparql` `mcwq/`, or the full release with
`dataset.json` and `splits/`) is an explicit `path`, else `$MCWQ_DATA_DIR`, else
`<repository root>/../shared/mcwq`. Caches live in `$MCWQ_CACHE_DIR`, else `~/.cache/mcwq_t5x`,
never next to the data (which may be read-only). No TensorFlow, seqio or gin import.
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


class DataNotFoundError(FileNotFoundError):
  """Raised when MCWQ data files are missing; the message names the path and the fetch command."""


def fetch_command(out_dir: Optional[PathLike] = None) -> str:
  """The shell command that downloads the public MCWQ files into `out_dir`.

  Args:
    out_dir: target directory; defaults to `$MCWQ_DATA_DIR` or the default data directory.

  Returns:
    e.g. `python scripts/download_mcwq.py --out /data/mcwq` (run from the repository root).
  """
  if out_dir is None:
    out_dir = os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
  return f"python scripts/download_mcwq.py --out {out_dir}"


def not_found(path: PathLike,
              what: str = "MCWQ data",
              out_dir: Optional[PathLike] = None) -> DataNotFoundError:
  """Builds the DataNotFoundError for a missing `path` (expected path + fetch command).

  Args:
    path: the file or directory that was expected.
    what: a short description of what is missing.
    out_dir: the data directory the fetch command should fill.

  Returns:
    A DataNotFoundError (the caller raises it).
  """
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
  """The MCWQ data directory, absolute with `~` expanded: `path`, `$MCWQ_DATA_DIR` or the default.

  Raises:
    DataNotFoundError: `must_exist` and the directory does not exist; the message names the
      path and the command that fetches the data.
  """
  if path is None or str(path) == "":
    path = os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
  resolved = pathlib.Path(path).expanduser().absolute()
  if must_exist and not resolved.is_dir():
    raise not_found(resolved, "MCWQ data directory", out_dir=resolved)
  return resolved


def cache_dir(create: bool = True) -> pathlib.Path:
  """Returns the cache directory: `$MCWQ_CACHE_DIR`, else `~/.cache/mcwq_t5x`.

  Args:
    create: create the directory (and parents) if it does not exist.

  Returns:
    The absolute cache directory.
  """
  path = pathlib.Path(os.environ.get(CACHE_DIR_ENV) or DEFAULT_CACHE_DIR).expanduser().absolute()
  if create:
    path.mkdir(parents=True, exist_ok=True)
  return path
