"""The prompt shown to a model and the reading of its answer.

A prompt is one user message: an instruction, then each demonstration as `Question: ...` /
`SPARQL: ...` lines, then the test question and an open `SPARQL:` line. Targets are in SPARQL
(what LLMs saw in pre-training) with MCWQ's placeholders M0..M9 and Wikidata ids; the answer is
converted to RIR (`mcwq_t5x.data.rir.sparql_to_rir`) for scoring like every model's predictions.
"""
from __future__ import annotations

import re
from typing import Optional, Sequence

from mcwq_t5x.data import rir

INSTRUCTION = (
    "Translate the question into a SPARQL query over Wikidata. Entities are written as the "
    "placeholders M0 to M9; properties and classes are Wikidata ids (wdt:P57, wd:Q5). Answer "
    "with the query only, on one line, formatted as in the examples.")
_QUERY = re.compile(r"\b(SELECT|ASK)\b.*\}", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```(?:sparql)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)


def render(demonstrations: Sequence[tuple[str, str]], question: str) -> str:
  """The prompt text for `question` after the (question, SPARQL) `demonstrations`."""
  parts = [INSTRUCTION, ""]
  for q, s in demonstrations:
    parts += [f"Question: {q}", f"SPARQL: {s}", ""]
  parts += [f"Question: {question}", "SPARQL:"]
  return "\n".join(parts)


def extract_sparql(response: Optional[str]) -> Optional[str]:
  """The first SELECT/ASK query of a response (in a code fence if there is one), on one line, or
  None when the response holds none."""
  if not response:
    return None
  fenced = _FENCE.search(response)
  text = fenced.group(1) if fenced else response
  match = _QUERY.search(text)
  if not match:
    return None
  return " ".join(match.group(0).split())


def to_rir(response: Optional[str]) -> str:
  """The response's query in RIR, or "" (a syntax error for `score`) when it holds no query
  that the SPARQL→RIR converter accepts."""
  query = extract_sparql(response)
  if query is None:
    return ""
  try:
    return rir.sparql_to_rir(query)
  except ValueError:  # why: RIRError and SparqlParseError are ValueErrors; unparseable = syntax error
    return ""
