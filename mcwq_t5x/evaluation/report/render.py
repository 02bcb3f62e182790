"""Formatting the report's tables: Markdown (intervals merged into "77.6 (76.5–78.7)") and CSV."""
from __future__ import annotations

import csv
import pathlib
from typing import Any, Optional, Sequence

from mcwq_t5x.data import writers
from mcwq_t5x.evaluation.report.common import CI_HIGH
from mcwq_t5x.evaluation.report.common import CI_LOW


def fmt(value: Any, digits: int) -> str:
  """A cell as text: floats with `digits` decimals, None as "-"."""
  if value is None:
    return "-"
  if isinstance(value, float):
    return f"{value:.{digits}f}"
  return str(value)


def merge_intervals(header: Sequence[str],
                    rows: Sequence[Sequence[Any]],
                    digits: int = 1) -> tuple[list[str], list[list[Any]], list[int]]:
  """(header, rows, kept) for reading: value and `<column> 95% CI low/high` become "77.6
  (76.5–78.7)"; `kept[j]` is the original index of new column j."""
  index = {name: i for i, name in enumerate(header)}
  dropped = {index[f"{c} {b}"] for c in header for b in (CI_LOW, CI_HIGH) if f"{c} {b}" in index}
  kept = [i for i in range(len(header)) if i not in dropped]
  new_rows = []
  for row in rows:
    new = []
    for i in kept:
      value = row[i]
      low_i, high_i = index.get(f"{header[i]} {CI_LOW}"), index.get(f"{header[i]} {CI_HIGH}")
      if (low_i is not None and high_i is not None and value is not None and
          row[low_i] is not None and row[high_i] is not None):
        value = (f"{fmt(value, digits)} ({fmt(row[low_i], digits)}–"
                 f"{fmt(row[high_i], digits)})")
      new.append(value)
    new_rows.append(new)
  return [header[i] for i in kept], new_rows, kept


def to_markdown(header: Sequence[str],
                rows: Sequence[Sequence[Any]],
                digits: int = 1,
                links: Optional[Sequence[dict[int, str]]] = None) -> str:
  """A Markdown table; floats with `digits` decimals, None as "-"; a cell with an entry in
  `links` (per row: {column: URL}) becomes a link."""
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
  for k, row in enumerate(rows):
    row_links = links[k] if links is not None and k < len(links) else {}
    cells = []
    for j, v in enumerate(row):
      text = fmt(v, digits).replace("|", "\\|")
      cells.append(f"[{text}]({row_links[j]})" if j in row_links and v is not None else text)
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def write_csv(path: pathlib.Path, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
  """Writes a CSV table; floats with 4 decimals, None as an empty cell."""
  with writers.open_atomic(path, newline="") as f:  # whole or not at all
    writer = csv.writer(f)
    writer.writerow(header)
    for row in rows:
      writer.writerow(
          ["" if v is None else (f"{v:.4f}" if isinstance(v, float) else v) for v in row])


# ----------------------------------------------------------------------------------------------
# Figures.
