"""Crash-safe append-only JSONL cache for endpoint answers and translations.

Every answer is appended as one JSON line `{"key": ..., "value": ...}` and flushed (and fsync'ed)
before it is used, so a run killed at any point resumes from the file without repeating a request
and without losing a finished one. A torn last line (the process died while writing) is ignored
and overwritten-safe: the next append starts on a fresh line.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import threading
from typing import Any, Iterator


def make_key(*parts: str) -> str:
  """Stable SHA-256 key of the given strings (e.g. kind, query text)."""
  h = hashlib.sha256()
  for p in parts:
    h.update(p.encode("utf-8"))
    h.update(b"\x00")
  return h.hexdigest()


class JsonlCache:
  """A dict-like cache persisted as append-only JSON lines in `path` (made with its folder; None:
  memory); `fsync` after each append by default. `torn_lines`: unreadable lines skipped."""

  def __init__(self, path: str | os.PathLike | None, fsync: bool = True):
    self.path = pathlib.Path(path) if path is not None else None
    self._fsync = fsync
    self._data: dict[str, Any] = {}
    self._lock = threading.Lock()
    self.torn_lines = 0
    self._needs_newline = False
    if self.path is not None and self.path.exists():
      raw = self.path.read_bytes()
      self._needs_newline = bool(raw) and not raw.endswith(b"\n")
      for line in raw.split(b"\n"):
        if not line.strip():
          continue
        try:
          obj = json.loads(line)
          self._data[obj["key"]] = obj["value"]
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
          self.torn_lines += 1

  def __contains__(self, key: str) -> bool:
    return key in self._data

  def __len__(self) -> int:
    return len(self._data)

  def get(self, key: str, default: Any = None) -> Any:
    """The value stored under `key` (the last one written), else `default`."""
    return self._data.get(key, default)

  def __getitem__(self, key: str) -> Any:
    return self._data[key]

  def items(self) -> Iterator[tuple[str, Any]]:
    """(key, value) pairs in insertion order (a snapshot: `put` while iterating is safe)."""
    return iter(list(self._data.items()))

  def put(self, key: str, value: Any, **extra: Any) -> None:
    """Stores `value` under `key`, appended and flushed before returning (`extra` for humans
    only)."""
    with self._lock:
      self._data[key] = value
      if self.path is None:
        return
      self.path.parent.mkdir(parents=True, exist_ok=True)
      line = json.dumps({"key": key, "value": value, **extra}, ensure_ascii=False) + "\n"
      with open(self.path, "a", encoding="utf-8") as f:
        if self._needs_newline:
          f.write("\n")
          self._needs_newline = False
        f.write(line)
        f.flush()
        if self._fsync:
          os.fsync(f.fileno())
