#!/usr/bin/env python3
"""Fetches the public MCWQ files into a data directory and verifies them.

  python scripts/download_mcwq.py --out ~/data/mcwq
  python scripts/download_mcwq.py --from ../shared/mcwq --out /tmp/mcwq

Default source: GitHub `coastalcph/seq2sparql` `mcwq/` (`official/`, `translations/` with the
RIR train files, `translations/gold/`); `--from DIR` copies a local copy or a full release. The
check (alone: `--verify-only`): every file parses, a part's four languages and question/RIR
pairs are line-parallel, dev/test counts are the published ones (mcd1 5,408/5,310, mcd2
5,929/5,891, mcd3 6,034/6,151, random_split 6,163/6,282) and the gold set has 155 examples.
"""
from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import urllib.error
import urllib.request
from typing import Optional, Sequence

_REPO = pathlib.Path(__file__).resolve().parents[1]
if str(_REPO) not in sys.path:
  sys.path.insert(0, str(_REPO))

from mcwq_t5x.data import paths  # noqa: E402  pylint: disable=g-import-not-at-top
from mcwq_t5x.data import readers  # noqa: E402  pylint: disable=g-import-not-at-top

BASE_URL = "https://raw.githubusercontent.com/coastalcph/seq2sparql/HEAD/mcwq"
# Published example counts (dev, test) per split, identical for the four languages.
KNOWN_COUNTS = {
    ("mcd1", "dev"): 5408,
    ("mcd1", "test"): 5310,
    ("mcd2", "dev"): 5929,
    ("mcd2", "test"): 5891,
    ("mcd3", "dev"): 6034,
    ("mcd3", "test"): 6151,
    ("random_split", "dev"): 6163,
    ("random_split", "test"): 6282,
    ("gold", "test"): 155,
}
COPY_ITEMS = ("official", "translations", "splits", "dataset.json", "gold_test.json")


def upstream_files(splits: Sequence[str] = readers.SPLITS,
                   languages: Sequence[str] = readers.LANGUAGES) -> list[tuple[str, bool]]:
  """(relative path under mcwq/, required) for every public file; train files are optional."""
  files = []
  for split in splits:
    for lang in languages:
      for part in ("dev", "test"):
        files.append((f"official/{split}/{part}.{lang}.txt", True))
      for part in readers.PARTS:
        for ext in ("txt", "sparql"):
          files.append((f"translations/{split}/{part}.{lang}.{ext}", False))
  for lang in readers.GOLD_LANGUAGES:
    if lang in languages:
      for ext in ("txt", "sparql", "json"):
        files.append((f"translations/gold/test.{lang}.{ext}", ext != "json"))
  return files


def download(out: pathlib.Path,
             base_url: str = BASE_URL,
             splits: Sequence[str] = readers.SPLITS,
             languages: Sequence[str] = readers.LANGUAGES,
             timeout: float = 60.0) -> list[str]:
  """Downloads the public files into `out` (skipping files already there).

  Returns:
    Relative paths of required files that could not be fetched (empty on success).
  """
  missing = []
  for rel, required in upstream_files(splits, languages):
    target = out / rel
    if target.is_file():
      continue
    target.parent.mkdir(parents=True, exist_ok=True)
    url = f"{base_url}/{rel}"
    try:
      with urllib.request.urlopen(url, timeout=timeout) as response:
        data = response.read()
    except (urllib.error.URLError, OSError) as e:
      print(f"{'MISSING' if required else 'absent (optional)'}: {url} ({e})", file=sys.stderr)
      if required:
        missing.append(rel)
      continue
    tmp = target.with_name(target.name + ".part")
    tmp.write_bytes(data)
    tmp.replace(target)
    print(f"fetched {rel} ({len(data):,} bytes)")
  return missing


def _copy_file(src: pathlib.Path, dst: pathlib.Path) -> None:
  """Copies the bytes of `src` to `dst` (not its permission bits: a read-only source, such as
  CI's copy of ../shared, must give a writable copy)."""
  dst.parent.mkdir(parents=True, exist_ok=True)
  shutil.copyfile(src, dst)


def copy_local(src: pathlib.Path, out: pathlib.Path) -> list[str]:
  """Copies the MCWQ items of a local copy `src` into `out`.

  Only file contents are copied; files and directories under `out` get the default (umask)
  permissions, so a read-only source still gives a copy that can be updated later (e.g. with
  the train files).

  Returns:
    The copied top-level items.

  Raises:
    FileNotFoundError: `src` has none of the MCWQ items.
  """
  copied = []
  for item in COPY_ITEMS:
    s = src / item
    if s.is_dir():
      for path in sorted(s.rglob("*")):
        if path.is_file():
          _copy_file(path, out / item / path.relative_to(s))
    elif s.is_file():
      _copy_file(s, out / item)
    else:
      continue
    copied.append(item)
  if not copied:
    raise FileNotFoundError(f"{src} holds none of {COPY_ITEMS}: not an MCWQ copy")
  return copied


def verify(root: pathlib.Path,
           splits: Sequence[str] = readers.SPLITS,
           languages: Sequence[str] = readers.LANGUAGES) -> tuple[list[str], list[str]]:
  """Checks the files under `root` for `splits` x `languages` (see module docstring).

  Returns:
    (report lines, problems); no problems means the copy is complete and consistent.
  """
  report, problems = [], []
  for split in tuple(splits) + (readers.GOLD_SPLIT,):
    langs = tuple(
        l for l in languages if split != readers.GOLD_SPLIT or l in readers.GOLD_LANGUAGES)
    parts = ("test",) if split == readers.GOLD_SPLIT else readers.PARTS
    for part in parts:
      counts = {}
      for lang in langs:
        try:
          layout, _ = readers.split_files(split, part, lang, root)
          if layout in ("official", "translations", "jsonl"):
            counts[lang] = len(readers.read_split(split, part, lang, root))
        except paths.DataNotFoundError:
          continue
        except (readers.DataFormatError, ValueError) as e:
          problems.append(str(e))
        # translations/ pairs next to official/ must be parallel with it.
        txt = root / "translations" / split / f"{part}.{lang}.txt"
        rir_file = txt.with_suffix(".sparql")
        if layout == "official" and txt.is_file() and rir_file.is_file():
          try:
            n = len(readers.read_rir_pair(txt, rir_file, lang))
          except readers.DataFormatError as e:
            problems.append(str(e))
          else:
            if n != counts.get(lang):
              problems.append(f"{txt}: {n} lines, but official/{split}/{part}.{lang}.txt "
                              f"has {counts.get(lang)}")
      if not counts:
        if (split, part) in KNOWN_COUNTS:
          problems.append(f"{split}/{part}: no files found under {root}")
        continue
      report.append(f"{split:>12} {part:>5}: " +
                    "  ".join(f"{l}={n:,}" for l, n in sorted(counts.items())))
      if len(set(counts.values())) > 1:
        problems.append(f"{split}/{part}: parallel languages differ in line count: {counts}")
      missing_langs = sorted(set(langs) - set(counts))
      if missing_langs:
        problems.append(f"{split}/{part}: languages missing: {missing_langs}")
      expected = KNOWN_COUNTS.get((split, part))
      if expected is not None:
        bad = {l: n for l, n in counts.items() if n != expected}
        if bad:
          problems.append(f"{split}/{part}: expected {expected:,} examples, found {bad}")
  return report, problems


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Command line (module docstring); returns the exit status (0: every file fetched)."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", required=True, type=pathlib.Path, help="target data directory")
  parser.add_argument(
      "--from",
      dest="src",
      type=pathlib.Path,
      default=None,
      help="copy from this local MCWQ directory instead of downloading")
  parser.add_argument("--base-url", default=BASE_URL, help="upstream base URL (mcwq/ folder)")
  parser.add_argument("--splits", nargs="+", default=list(readers.SPLITS), choices=readers.SPLITS)
  parser.add_argument(
      "--languages", nargs="+", default=list(readers.LANGUAGES), choices=readers.LANGUAGES)
  parser.add_argument("--verify-only", action="store_true", help="only verify --out")
  args = parser.parse_args(argv)
  out = args.out.expanduser().absolute()

  if not args.verify_only:
    if args.src is not None:
      src = args.src.expanduser().absolute()
      if src == out:
        parser.error("--from and --out are the same directory")
      copied = copy_local(src, out)
      print(f"copied {', '.join(copied)} from {src} to {out}")
    else:
      out.mkdir(parents=True, exist_ok=True)
      missing = download(out, args.base_url, args.splits, args.languages)
      if missing:
        print(
            f"ERROR: {len(missing)} required files could not be fetched, e.g. {missing[0]}",
            file=sys.stderr)
        return 1
  if not out.is_dir():
    print(f"ERROR: {out} does not exist", file=sys.stderr)
    return 1
  report, problems = verify(out, args.splits, args.languages)
  print("\n".join(report))
  for p in problems:
    print(f"PROBLEM: {p}", file=sys.stderr)
  if problems:
    return 1
  print(f"OK: {out} verified. Use it with: export MCWQ_DATA_DIR={out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
