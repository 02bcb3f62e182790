"""The stderr filter process of `console.quiet_native_logs`: copies stdin (a command's stderr) to
stdout line by line, dropping the lines that fully match a pattern given as an argument.

A partial line is written once nothing more arrives for 0.2 s (prompts, progress bars). It
ignores SIGINT, SIGTERM and SIGHUP (a signal to the command's process group leaves it running
while the command prints its traceback or saves its checkpoint) and ends when every writer has
closed the pipe; if its output is closed it keeps reading, so that no writer blocks. Standard
library only: it runs as `python -I -S stderr_filter.py PATTERN...`.
"""
import os
import re
import select
import signal
import sys


def main(patterns: list[str]) -> None:
  """Filters fd 0 to fd 1 until end of input; `patterns` are regular expressions (bytes-matched)."""
  for name in ("SIGINT", "SIGTERM", "SIGHUP"):
    signal.signal(getattr(signal, name), signal.SIG_IGN)
  noise = re.compile("|".join("(?:%s)" % p for p in patterns).encode())
  pending, broken = b"", False

  def write(data: bytes) -> None:
    nonlocal broken
    while data and not broken:
      try:
        data = data[os.write(1, data):]
      except OSError:
        broken = True  # why: keep reading so that no writer blocks

  while True:
    if pending and not select.select([0], [], [], 0.2)[0]:
      write(pending)
      pending = b""
      continue
    try:
      chunk = os.read(0, 1 << 16)
    except InterruptedError:
      continue
    if not chunk:
      break
    *lines, pending = (pending + chunk).split(b"\n")
    write(b"".join(l + b"\n" for l in lines if not noise.fullmatch(l)))
  if pending and not noise.fullmatch(pending):
    write(pending)


if __name__ == "__main__":
  main(sys.argv[1:])
