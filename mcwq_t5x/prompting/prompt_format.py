"""The prompt shown to a model and the reading of its answer.

A prompt is one user message: an instruction, then each demonstration as `Question: ...` /
`SPARQL: ...` lines, then the test question and an open `SPARQL:` line. Targets are in SPARQL
(what LLMs saw in pre-training) with MCWQ's placeholders M0..M9 and Wikidata ids; the answer is
converted to RIR (`mcwq_t5x.data.rir.sparql_to_rir`) for scoring like every model's predictions.

Reading an answer (`read_answer`): reasoning is dropped first (`<think>...</think>` blocks, the text
before a lone closing tag, an unclosed block to the end: reasoning models' output); the queries
are then the well-formed ones (`SELECT <projection> [WHERE] {...}` or `ASK [WHERE] {...}`, braces
balanced) inside code fences, else anywhere in the text; of them the last one the converter
accepts, else the last one (an unparseable query). Prose such as "To ask Wikidata this question,
use: ASK WHERE {...}" holds one query, the one after the colon.
"""
from __future__ import annotations

import re
from typing import NamedTuple, Optional, Sequence

from mcwq_t5x.data import rir

INSTRUCTION = (
    "Translate the question into a SPARQL query over Wikidata. Entities are written as the "
    "placeholders M0 to M9; properties and classes are Wikidata ids (wdt:P57, wd:Q5). Answer "
    "with the query only, on one line, formatted as in the examples.")
_TAGS = r"think|thinking|reasoning"
_REASONING_BLOCK = re.compile(rf"<({_TAGS})>.*?</\1\s*>", re.DOTALL | re.IGNORECASE)
_REASONING_CLOSE = re.compile(rf"</(?:{_TAGS})\s*>", re.IGNORECASE)
_REASONING_OPEN = re.compile(rf"<(?:{_TAGS})>", re.IGNORECASE)
_FENCE = re.compile(r"```[^\n`]*\n?(.*?)```", re.DOTALL)
_KEYWORD = re.compile(r"\b(?:SELECT|ASK)\b", re.IGNORECASE)
# A query's head up to its opening brace: `ASK [WHERE] {` or `SELECT [DISTINCT|REDUCED]
# <variables, *, or parenthesised expressions such as count(*) or (COUNT(?x) AS ?n)> [WHERE] {`.
_PROJECTION = r"(?:\*|\?\w+|count\s*\(\s*\*\s*\)|\((?:[^(){}]|\([^(){}]*\))*\))"
_HEAD = re.compile(
    rf"(?:SELECT(?:\s+(?:DISTINCT|REDUCED))?(?:\s*{_PROJECTION})+|ASK)\s*(?:WHERE\s*)?\{{",
    re.IGNORECASE)


class Answer(NamedTuple):
  """What a response holds: `query` (the chosen SPARQL query on one line, None when the response
  holds no well-formed query) and `rir` (its RIR, "" when there is no query or the converter
  rejects it)."""
  query: Optional[str]
  rir: str


def render(demonstrations: Sequence[tuple[str, str]], question: str) -> str:
  """The prompt text for `question` after the (question, SPARQL) `demonstrations`."""
  parts = [INSTRUCTION, ""]
  for q, s in demonstrations:
    parts += [f"Question: {q}", f"SPARQL: {s}", ""]
  parts += [f"Question: {question}", "SPARQL:"]
  return "\n".join(parts)


def strip_reasoning(response: str) -> str:
  """`response` without its reasoning: `<think>`/`<thinking>`/`<reasoning>` blocks removed, the
  text up to the last lone closing tag dropped (the opening tag was in the chat template), and
  an unclosed block dropped to the end (the answer ran out of tokens while reasoning)."""
  text = _REASONING_BLOCK.sub(" ", response)
  closes = list(_REASONING_CLOSE.finditer(text))
  if closes:
    text = text[closes[-1].end():]
  opened = _REASONING_OPEN.search(text)
  if opened:
    text = text[:opened.start()]
  return text


def queries(text: str) -> list[str]:
  """The well-formed queries of `text` in order, each on one line (see the module docstring); a
  query inside another (a sub-query) is not listed apart."""
  out, pos = [], 0
  while True:
    keyword = _KEYWORD.search(text, pos)
    if keyword is None:
      return out
    head = _HEAD.match(text, keyword.start())
    if head is None:
      pos = keyword.end()
      continue
    depth, end = 0, None
    for i in range(head.end() - 1, len(text)):
      if text[i] == "{":
        depth += 1
      elif text[i] == "}":
        depth -= 1
        if depth == 0:
          end = i + 1
          break
    if end is None:  # why: unbalanced (a truncated answer) is no query
      pos = keyword.end()
      continue
    out.append(" ".join(text[keyword.start():end].split()))
    pos = end


def _convert(query: str) -> str:
  try:
    return rir.sparql_to_rir(query)
  except ValueError:  # why: RIRError and SparqlParseError are ValueErrors; unparseable = ""
    return ""


def read_answer(response: Optional[str]) -> Answer:
  """The query of a response and its RIR (see the module docstring); `Answer(None, "")` for None,
  an empty response or one without a well-formed query."""
  if not response:
    return Answer(None, "")
  text = strip_reasoning(response)
  fenced = [q for block in _FENCE.findall(text) for q in queries(block)]
  found = fenced or queries(text)
  if not found:
    return Answer(None, "")
  for query in reversed(found):
    converted = _convert(query)
    if converted:
      return Answer(query, converted)
  return Answer(found[-1], "")


def extract_sparql(response: Optional[str]) -> Optional[str]:
  """The query `read_answer` chooses, on one line, or None when the response holds none."""
  return read_answer(response).query


def to_rir(response: Optional[str]) -> str:
  """The response's query in RIR, or "" (a syntax error for `score`) when it holds no query
  that the SPARQL→RIR converter accepts."""
  return read_answer(response).rir
