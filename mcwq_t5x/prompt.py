"""In-context semantic parsing of MCWQ with a large language model.

  python -m mcwq_t5x.prompt --task mcwq_mcd1_he --split test --base_url http://localhost:8000/v1
      --model NAME --shots 8 --selection {random,similar,cover,oracle_compounds} --out DIR
  python -m mcwq_t5x.prompt --task mcwq_mcd1_en --split test --model nearest_neighbour
      --selection similar --shots 1 --out DIR      # the retrieval baseline, no server

Writes to DIR, whole or not at all: `predictions.txt` (RIR, line-parallel with the split; no
parseable query: an empty line), `targets.txt`, `responses.jsonl` (raw answers, reasoning and the
query read from each), `requests.jsonl` (the crash-safe request cache: a rerun sends no request
twice), `run.json` (never the key) and, over a whole test part, `predictions_{split}_{lang}.txt`
for `mcwq_t5x.report`. DIR must be new, empty or an earlier run of this command (another tool's
folder, a training run's, is refused: exit status 2). Demonstrations come from the split's train
part, else its dev part. The key is read from `--api_key_env` (default OPENAI_API_KEY). The first
request that fails for good stops the run (no new request is sent; those in flight finish): exit
status 1, rerun to resume. A malformed data file: one line `DataFormatError: FILE:LINE: problem`,
exit status 1.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import re
import sys
import threading
from typing import Any, Optional, Sequence

from mcwq_t5x.data import readers
from mcwq_t5x.data import writers
from mcwq_t5x.prompting import client as client_lib
from mcwq_t5x.prompting import prompt_format
from mcwq_t5x.prompting import selection as selection_lib
from mcwq_t5x import console

OFFLINE_MODEL = "nearest_neighbour"
_TASK = re.compile(r"^mcwq_(?P<split>.+)_(?P<language>[a-z]{2})$")
RUN_KIND = "prompting"  # run.json's "kind"
#: The files this command writes in --out (`predictions_<split>_<lang>.txt` too, `OWN_FILE`).
OUT_FILES = ("predictions.txt", "targets.txt", "responses.jsonl", "requests.jsonl", "run.json")
OWN_FILE = re.compile(r"^\.?(" + "|".join(re.escape(f) for f in OUT_FILES) +
                      r"|predictions_[A-Za-z0-9_]+_[a-z]{2,3}\.txt)(\..*)?$")  # why: .NAME.* temps


def parse_task(task: str) -> tuple[str, str]:
  """("mcd1", "he") from "mcwq_mcd1_he"; ValueError for a name not of the form
  mcwq_{split}_{lang}."""
  m = _TASK.match(task)
  if not m or "zeroshot" in task or task.endswith("multilingual"):
    raise ValueError(f"--task {task!r}: expected mcwq_{{split}}_{{lang}}, e.g. mcwq_mcd1_he")
  return m.group("split"), m.group("language")


def system_name(model: str, shots: int, selection: str, demo_language: str) -> str:
  """The report's name of a run, e.g. "llama-3-8b_8shot_cover" ("ORACLE_..." for an oracle
  selection); no space or slash (it names figure files)."""
  name = f"{re.sub(r'[^A-Za-z0-9._+-]+', '-', model)}_{shots}shot_{selection}"
  if demo_language == "en":
    name += "_en-demos"
  return f"ORACLE_{name}" if selection in selection_lib.ORACLE_METHODS else name


def check_out_dir(out: pathlib.Path) -> None:
  """Raises ValueError unless `out` is absent, an empty folder, or an earlier run of this command
  (only `OUT_FILES`, prediction files and their temporary files; a run.json of kind
  "prompting"); the message names what else is there."""
  if not out.exists():
    return
  if not out.is_dir():
    raise ValueError(f"--out {out}: exists and is not a folder; choose another --out")
  other = sorted(e.name + ("/" if e.is_dir() else "")
                 for e in out.iterdir()
                 if not OWN_FILE.match(e.name) or not e.is_file())
  run_json = out / "run.json"
  if not other and run_json.is_file():
    try:
      kind = json.loads(run_json.read_text(encoding="utf-8")).get("kind")
    except (ValueError, AttributeError):  # why: not JSON, or not an object
      kind = None
    if kind != RUN_KIND:
      other = [f"run.json of kind {kind!r}"]
  if other:
    shown = ", ".join(other[:10]) + (f", ... and {len(other) - 10} more" if len(other) > 10 else "")
    raise ValueError(f"--out {out}: holds another tool's output, not a prompting run's ({shown}); "
                     "nothing was changed. Choose a new or empty folder (or an earlier prompt "
                     "--out to resume it)")


def _write_whole(path: pathlib.Path, text: str) -> None:
  """`writers.write_atomic`: a failed write (a full disk) leaves no temporary file and keeps the
  previous file; raises its ResultWriteError."""
  writers.write_atomic(path, text)


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m mcwq_t5x.prompt", description=__doc__.split("\n")[0])
  p.add_argument("--task", required=True, help="e.g. mcwq_mcd1_he")
  p.add_argument("--split", default="test", choices=("dev", "test"), help="the part to answer")
  p.add_argument("--base_url", default=None, help="OpenAI API root, e.g. http://localhost:8000/v1")
  p.add_argument("--model", required=True, help=f"the server's model name, or {OFFLINE_MODEL}")
  p.add_argument("--shots", type=int, default=8)
  p.add_argument("--selection", default="cover", choices=selection_lib.METHODS)
  p.add_argument("--demo_language", default="same", choices=("same", "en"))
  p.add_argument("--max_examples", type=int, default=None, help="answer the first N only")
  p.add_argument("--concurrency", type=int, default=4, help="requests in flight at once")
  p.add_argument("--requests_per_s", type=float, default=0.0, help="rate limit; 0 = none")
  p.add_argument("--seed", type=int, default=0, help="random selection and the server's seed")
  p.add_argument("--max_tokens", type=int, default=512)
  p.add_argument("--timeout", type=float, default=120.0, help="seconds per attempt")
  p.add_argument("--retries", type=int, default=5, help="retries on 429, 5xx, connection errors")
  p.add_argument("--max_retry_after", type=float, default=600.0)
  p.add_argument("--api_key_env", default="OPENAI_API_KEY")
  p.add_argument("--data_dir", default=None)
  p.add_argument("--out", required=True)
  return p


def _pool(split: str, language: str, data_dir: Optional[str]) -> tuple[str, list[readers.Example]]:
  parts = readers.available_parts(split, language, data_dir)
  if "train" in parts:
    return "train", readers.read_split(split, "train", language, data_dir)
  print(
      f"note: {split} has no train part here; demonstrations come from its dev part",
      file=sys.stderr)
  return "dev", readers.read_split(split, "dev", language, data_dir)


def main(argv: Optional[Sequence[str]] = None) -> int:
  args = _parser().parse_args(argv)
  try:
    split, language = parse_task(args.task)
  except ValueError as e:
    console.print_error(e)
    return 2
  offline = args.model == OFFLINE_MODEL
  if offline and (args.selection != "similar" or args.shots != 1):
    console.print_error(
        ValueError(f"--model {OFFLINE_MODEL} is the retrieval baseline: it needs --selection "
                   "similar --shots 1"))
    return 2
  if not offline and not args.base_url:
    console.print_error(ValueError("--base_url is required (or --model nearest_neighbour)"))
    return 2
  flag_checks = {
      "--timeout": args.timeout > 0,
      "--retries": args.retries >= 0,
      "--concurrency": args.concurrency >= 1,
      "--shots": args.shots >= 1,
  }
  for flag, ok in flag_checks.items():
    if not ok:
      console.print_error(ValueError(f"{flag} must be positive (at least 0 for --retries)"))
      return 2
  out = pathlib.Path(args.out)
  try:
    check_out_dir(out)
  except ValueError as e:
    console.print_error(e)
    return 2
  try:
    examples = readers.read_split(split, args.split, language, args.data_dir)
    pool_part, pool = _pool(split, language, args.data_dir)
    shown = pool if args.demo_language == "same" else readers.read_split(
        split, pool_part, "en", args.data_dir)  # why: the language files are line-parallel
  except (FileNotFoundError, readers.DataFormatError) as e:
    console.print_error(e)
    return 1
  if args.max_examples is not None:
    examples = examples[:args.max_examples]
  leave_out = pool_part == args.split  # why: never show a test example as its own demonstration
  selector = selection_lib.Selector([e.question for e in pool], [e.sparql for e in pool], language,
                                    args.seed)
  demos = []
  for i, ex in enumerate(examples):
    chosen = selector.select(args.selection, ex.question, args.shots + leave_out, i, ex.sparql)
    demos.append([j for j in chosen if not (leave_out and j == i)][:args.shots])
  prompts = [
      prompt_format.render([(shown[j].question, shown[j].sparql)
                            for j in d], ex.question)
      for ex, d in zip(examples, demos)
  ]
  params = {"temperature": 0.0, "seed": args.seed, "max_tokens": args.max_tokens}
  if not offline:
    chat = client_lib.ChatClient(
        args.base_url,
        args.model,
        os.environ.get(args.api_key_env) or "EMPTY",
        params,
        out / "requests.jsonl",
        min_interval_s=1.0 / args.requests_per_s if args.requests_per_s > 0 else 0.0,
        timeout_s=args.timeout,
        max_retries=args.retries,
        max_retry_after_s=args.max_retry_after)
  out.mkdir(parents=True, exist_ok=True)
  results: list[dict[str, Any]] = [{} for _ in examples]
  failures: list[tuple[int, client_lib.RequestFailed]] = []
  if offline:
    for i, d in enumerate(demos):
      results[i] = {"text": pool[d[0]].sparql, "usage": None, "cached": False}
  else:
    stop = threading.Event()  # why: the first failure for good stops the run

    def one(i: int) -> None:
      if stop.is_set():
        return
      try:
        results[i] = chat.complete(prompts[i])
      except client_lib.RequestFailed as e:
        failures.append((i, e))
        stop.set()

    with concurrent.futures.ThreadPoolExecutor(max(1, args.concurrency)) as executor:
      list(executor.map(one, range(len(examples))))
  if failures:
    answered = sum(bool(r) for r in results)
    for i, e in sorted(failures, key=lambda f: f[0])[:10]:
      console.print_error(e, f"example {i + 1}: ")
    console.print_error(
        client_lib.RequestFailed(
            f"stopped: {len(failures)} request(s) failed, {answered} of {len(examples)} "
            f"answered and cached in {out / 'requests.jsonl'}, "
            f"{len(examples) - answered - len(failures)} not asked; rerun to resume"))
    return 1
  answers = [prompt_format.read_answer(r.get("text")) for r in results]
  predictions = [a.rir for a in answers]
  usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
  for r in results:
    for k in usage:
      n = (r.get("usage") or {}).get(k)
      usage[k] += n if isinstance(n, int) else 0  # why: a server's odd count is not a crash
  ids = [[f"{pool_part}:{pool[j].line}" for j in d] for d in demos]
  responses = [
      json.dumps(
          {
              "line": ex.line,
              "demonstrations": d,
              "response": r.get("text"),
              "reasoning": r.get("reasoning"),
              "finish_reason": r.get("finish_reason"),
              "error": r.get("error"),
              "query": a.query,
              "prediction": a.rir,
              "cached": r.get("cached")
          },
          ensure_ascii=False) for ex, d, r, a in zip(examples, ids, results, answers)
  ]
  no_query = sum(a.query is None for a in answers)
  run = {
      "kind": RUN_KIND,
      "system": system_name(args.model, args.shots, args.selection, args.demo_language),
      "oracle": args.selection in selection_lib.ORACLE_METHODS,
      "task": args.task,
      "split": split,
      "language": language,
      "part": args.split,
      "n_examples": len(examples),
      "server": None if offline else args.base_url,
      "model": args.model,
      "parameters": params,
      "shots": args.shots,
      "selection": args.selection,
      "demo_language": args.demo_language,
      "demonstration_part": pool_part,
      "seed": args.seed,
      "demonstrations": ids,
      "usage": usage,
      "syntax_errors": sum(not p for p in predictions),
      "no_query": no_query,  # no well-formed query in the answer (context-length errors too)
      "unparseable_queries": sum(a.query is not None and not a.rir for a in answers),
      "context_length_errors": sum(bool(r.get("error")) for r in results),
      "truncated_answers": sum(r.get("finish_reason") == "length" for r in results),
      "requests_sent": 0 if offline else chat.sent,
      "retries": 0 if offline else chat.retries,
      "cached_answers": sum(bool(r.get("cached")) for r in results),
  }
  try:
    _write_whole(out / "responses.jsonl", "".join(r + "\n" for r in responses))
    _write_whole(out / "targets.txt", "".join(e.rir + "\n" for e in examples))
    _write_whole(out / "predictions.txt", "".join(p + "\n" for p in predictions))
    _write_whole(out / "run.json", json.dumps(run, indent=1, ensure_ascii=False) + "\n")
    if args.split == "test" and args.max_examples is None:  # why: the report reads whole test sets
      _write_whole(out / f"predictions_{split}_{language}.txt",
                   "".join(p + "\n" for p in predictions))
  except writers.ResultWriteError as e:  # why: a full disk is one line, the old files kept
    console.print_error(e)
    return 1
  exact = sum(p == e.rir for p, e in zip(predictions, examples))
  print(f"{run['system']}: {len(examples)} examples, exact match "
        f"{100.0 * exact / max(1, len(examples)):.2f}%, {no_query} without a query, "
        f"{run['unparseable_queries']} with a query the converter rejects, "
        f"{run['truncated_answers']} cut at --max_tokens, {run['cached_answers']} from the cache, "
        f"{usage['total_tokens']} tokens")
  return 0


if __name__ == "__main__":
  sys.exit(main())
