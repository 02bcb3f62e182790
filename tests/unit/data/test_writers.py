"""`writers.write_atomic`: a result file is replaced whole or left as it was.

A full disk is injected (the `full_disk` fixture of conftest.py), no root tricks. `kill -9` safety
follows from the order of operations: until `os.replace`, the previous file is untouched and only
a `.NAME.tmp-*` file exists beside it; `os.replace` itself is atomic, so a reader sees one file or
the other (a test stops a write mid-way and checks; the last one tells a rename of the finished
temporary file from a copy over the old file: a reader of the old file, its inode, the calls).
"""
import errno
import os
import pathlib

import pytest

from mcwq_t5x.data import writers


def test_write_atomic_writes_and_replaces(tmp_path):
  path = tmp_path / "sub" / "metrics.json"
  assert writers.write_atomic(path, "old\n") == path  # creates the folder
  writers.write_atomic(path, (f"{i}\n" for i in range(3)))
  assert path.read_text() == "0\n1\n2\n"
  assert oct(path.stat().st_mode & 0o777) == "0o644"
  assert sorted(p.name for p in path.parent.iterdir()) == ["metrics.json"]  # no temporary file


def test_a_full_disk_keeps_the_previous_file_and_names_it(tmp_path, full_disk):
  path = tmp_path / "predictions.txt"
  path.write_text("good old predictions\n")
  full_disk(10)
  with pytest.raises(writers.ResultWriteError) as e:
    writers.write_atomic(path, ["new line\n"] * 1000)
  assert str(e.value) == (f"cannot write {path}: No space left on device (ENOSPC); nothing was "
                          "written (the previous predictions.txt, if any, is unchanged)")
  assert e.value.errno == errno.ENOSPC and "\n" not in str(e.value)
  assert path.read_text() == "good old predictions\n"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.txt"]  # no partial file


def test_a_full_disk_on_a_new_file_leaves_nothing(tmp_path, full_disk):
  full_disk(0)
  with pytest.raises(writers.ResultWriteError, match="EDQUOT|ENOSPC"):
    writers.write_atomic(tmp_path / "score.json", "{}\n")
  assert list(tmp_path.iterdir()) == []  # not even a 0-byte file


def test_open_atomic_binary_writes_bytes_whole_or_not_at_all(tmp_path, full_disk):
  """The binary mode (the report's PNG figures): bytes written as given, no temporary file left;
  a full disk keeps the previous file."""
  path = tmp_path / "figure.png"
  data = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40
  with writers.open_atomic(path, binary=True) as f:
    f.write(data)
  assert path.read_bytes() == data and oct(path.stat().st_mode & 0o777) == "0o644"
  full_disk(100)
  with pytest.raises(writers.ResultWriteError, match=f"cannot write {path}: .*ENOSPC"):
    with writers.open_atomic(path, binary=True) as f:
      f.write(b"new figure")
      f.write(bytes(1000))
  assert path.read_bytes() == data
  assert sorted(p.name for p in tmp_path.iterdir()) == ["figure.png"]


def test_a_write_stopped_midway_leaves_the_old_file_whole(tmp_path):
  """What a reader (or the next run, after `kill -9`) sees while the new file is half written:
  the old file, whole, and a temporary file beside it."""
  path = tmp_path / "predictions.txt"
  path.write_text("old\n")

  class Killed(BaseException):  # not an OSError: as if the process ended here
    pass

  def lines():
    yield "new 1\n"
    assert path.read_text() == "old\n"
    assert [p.name.startswith(".predictions.txt.tmp-") for p in tmp_path.iterdir()
           ].count(True) == 1  # all that a `kill -9` here would leave besides the old file
    raise Killed

  with pytest.raises(Killed):
    writers.write_atomic(path, lines())
  assert path.read_text() == "old\n"


def test_the_new_file_is_renamed_into_place_not_copied_over(tmp_path, monkeypatch):
  """The finished temporary file is synced, then renamed onto `path` (a new inode), then the folder
  synced: a reader that opened the old file reads it whole, a hard link to it keeps it. Copying
  the new contents over the old file would rewrite that inode in place."""
  path = tmp_path / "predictions.txt"
  path.write_text("old 1\nold 2\n")
  old_inode = path.stat().st_ino
  os.link(path, tmp_path / "kept")
  calls = []
  real_fsync, real_replace = os.fsync, os.replace

  def fsync(fd):
    calls.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
    real_fsync(fd)

  def replace(src, dst):
    calls.append(("replace", str(src), str(dst)))
    real_replace(src, dst)

  monkeypatch.setattr(os, "fsync", fsync)
  monkeypatch.setattr(os, "replace", replace)
  reader = os.open(path, os.O_RDONLY)  # unbuffered: each read goes to the file
  try:
    writers.write_atomic(path, "new\n")
    assert os.pread(reader, 100, 0) == b"old 1\nold 2\n", "the reader sees the new file"
  finally:
    os.close(reader)
  assert path.read_text() == "new\n" and path.stat().st_ino != old_inode
  assert (tmp_path / "kept").read_text() == "old 1\nold 2\n"
  tmp = calls[0][1]
  assert pathlib.Path(tmp).parent == tmp_path and pathlib.Path(tmp).name.startswith(
      ".predictions.txt.tmp-")
  assert calls == [("fsync", tmp), ("replace", tmp, str(path)), ("fsync", str(tmp_path))]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["kept", "predictions.txt"]
