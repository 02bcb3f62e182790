"""Result files written whole or not at all (the counterpart of `readers`).

`write_atomic(path, text)` and `open_atomic(path)` (text, or `binary`: a PNG figure) write a
temporary file in `path`'s own folder, flush and fsync it, and move it onto `path` with
`os.replace` (atomic within one file system, POSIX), then fsync the folder. A reader, a `kill -9` or a power cut therefore sees the previous file or the new one,
never a truncated or mixed one; a failed write (a full disk: ENOSPC, EDQUOT) removes the
temporary file, leaves the previous `path` untouched and raises `ResultWriteError` naming the file.
A `kill -9` mid-write can leave only a `.<name>.tmp-*` file beside the old result.
"""
from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import tempfile
from typing import IO, Any, Iterable, Iterator, Union

#: The prefix of the temporary files (`.<name>.tmp-XXXX`) beside the file being written.
TMP_INFIX = ".tmp-"


class ResultWriteError(OSError):
  """A result file could not be written; the previous file, if any, is left as it was."""


def _message(path: pathlib.Path, e: OSError) -> str:
  name = errno.errorcode.get(e.errno or 0, "")
  why = e.strerror or str(e)
  return (f"cannot write {path}: {why}{f' ({name})' if name else ''}; nothing was written "
          f"(the previous {path.name}, if any, is unchanged)")


@contextlib.contextmanager
def open_atomic(path: Union[str, os.PathLike],
                newline: str | None = None,
                binary: bool = False) -> Iterator[IO[Any]]:
  """A file opened for writing, text (UTF-8; `newline` as `open`'s) or with `binary` bytes (a PNG
  figure: `fig.savefig(f, format="png")`), that replaces `path` only when the `with` block ends
  without an exception (module docstring); the folder is created if needed.

  Raises:
    ResultWriteError: an OSError while writing or moving (message: the file and the reason).
  """
  path = pathlib.Path(path)
  tmp = None
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Same folder: os.replace is only atomic within one file system.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}{TMP_INFIX}", dir=path.parent)
    text = {} if binary else {"encoding": "utf-8", "newline": newline}
    with os.fdopen(fd, "wb" if binary else "w", **text) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())  # the data is on disk before the name points at it
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would make results unreadable to the group
    os.replace(tmp, path)
    tmp = None
    _fsync_folder(path.parent)  # the rename itself survives a power cut
  except OSError as e:
    error = ResultWriteError(_message(path, e))  # one argument: str() is the message alone
    error.errno = e.errno
    raise error from None
  finally:
    if tmp is not None:
      with contextlib.suppress(OSError):
        os.unlink(tmp)


def _fsync_folder(folder: pathlib.Path) -> None:
  fd = os.open(folder, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def write_atomic(path: Union[str, os.PathLike], text: Union[str, Iterable[str]]) -> pathlib.Path:
  """Writes `text` (a string, or strings written one after another) to `path` atomically (module
  docstring). Returns `path`. Raises ResultWriteError."""
  with open_atomic(path) as f:
    if isinstance(text, str):
      f.write(text)
    else:
      for piece in text:
        f.write(piece)
  return pathlib.Path(path)
