"""Chat completions from any OpenAI-compatible server (vLLM, llama.cpp, Ollama, TGI, hosted APIs),
with the project's retry policy and a crash-safe cache of every answer.

This module alone retries, with the transport's `mcwq_t5x.stores.transport.RetryPolicy` (the
`openai` client is built with `max_retries=0`; backoff doubling to `max_backoff_s`, at least
`Retry-After`, more than `max_retry_after_s` an error): 429, 5xx and connection errors at most
`max_retries` times, then `RequestFailed`; a time-out or another 4xx is `RequestFailed` at once; a
prompt over the context length is an answer with text None and an "error" (cached; a syntax error
for the example). The cache (`stores.jsonl_cache.JsonlCache`, fsync'ed) is keyed by model,
sampling parameters and prompt: a rerun after a kill sends no request twice. The API key is passed
in, never stored or logged.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, Mapping

import openai

from mcwq_t5x.stores import jsonl_cache
from mcwq_t5x.stores import transport

CONTEXT_MARKERS = ("context length", "context_length", "maximum context", "too many tokens",
                   "exceeds the context", "context window")


class RequestFailed(RuntimeError):
  """A request that failed for good (retries spent, time-out, a 4xx); the message names it."""


class ContextLengthExceeded(RequestFailed):
  """The server refused the prompt as longer than the model's context (HTTP 400)."""


def _is_context_error(error: openai.BadRequestError) -> bool:
  text = f"{error.message} {getattr(error, 'code', '')} {error.body}".lower()
  return any(m in text for m in CONTEXT_MARKERS)


class ChatClient:
  """One model on one server; `complete(prompt)` is thread-safe.

  Args:
    base_url: the server's OpenAI API root, e.g. "http://localhost:8000/v1".
    model: the model name the server knows.
    api_key: the key (from the environment; never written anywhere).
    params: sampling parameters sent with every request (temperature, seed, max_tokens).
    cache_path: the JSONL request cache.
    concurrency: requests in flight at once (the caller's thread pool size; informative).
    min_interval_s: least seconds between the starts of two requests (a rate limit).
    timeout_s, max_retries, backoff_s, max_backoff_s, max_retry_after_s: see module docstring.
    sleep: the sleep function (tests inject one).

  Attributes:
    policy: the `transport.RetryPolicy` of the retry and pacing arguments (the transport's).
  """

  def __init__(self,
               base_url: str,
               model: str,
               api_key: str,
               params: Mapping[str, Any],
               cache_path: Any,
               min_interval_s: float = 0.0,
               timeout_s: float = 120.0,
               max_retries: int = 5,
               backoff_s: float = transport.DEFAULT_BACKOFF_S,
               max_backoff_s: float = transport.DEFAULT_MAX_BACKOFF_S,
               max_retry_after_s: float = transport.DEFAULT_MAX_RETRY_AFTER_S,
               sleep: Callable[[float], None] = time.sleep):
    self.model = model
    self.params = dict(params)
    self.cache = jsonl_cache.JsonlCache(cache_path)
    # max_retries=0: `openai` would retry on its own schedule (Retry-After capped at 60 s), twice
    # over with ours.
    self._client = openai.OpenAI(
        base_url=base_url, api_key=api_key, max_retries=0,
        timeout=timeout_s)  # why: this module owns the retries
    self.policy = transport.RetryPolicy(max_retries, backoff_s, max_backoff_s, max_retry_after_s,
                                        min_interval_s)
    self._sleep = sleep
    self._pace_lock = threading.Lock()
    self._last = 0.0
    self.sent = 0
    self.retries = 0

  def key(self, prompt: str) -> str:
    """The cache key of `prompt` for this model and these parameters."""
    return jsonl_cache.make_key("chat", self.model, json.dumps(self.params, sort_keys=True), prompt)

  def complete(self, prompt: str) -> dict[str, Any]:
    """{"text", "usage", "cached"} for `prompt`, from the cache or the server; a prompt longer
    than the model's context gives text None and "error" "context_length: ..." (cached).

    Raises:
      RequestFailed: see module docstring.
    """
    key = self.key(prompt)
    hit = self.cache.get(key)
    if hit is not None:
      return dict(hit, cached=True)
    try:
      value = self._request(prompt)
    except ContextLengthExceeded as e:  # why: the same prompt fails the same way: cache it too
      value = {"text": None, "usage": None, "error": f"context_length: {e}"}
    self.cache.put(key, value)
    return dict(value, cached=False)

  def _request(self, prompt: str) -> dict[str, Any]:
    for attempt in range(self.policy.max_retries + 1):
      with self._pace_lock:
        self._last = transport.pace(self._last, self.policy.min_interval_s, self._sleep)
        self.sent += 1
      try:
        answer = self._client.chat.completions.create(
            model=self.model, messages=[{
                "role": "user",
                "content": prompt
            }], **self.params)
      except openai.APITimeoutError as e:
        # Not retried: the request would take as long again (as `transport.DeadlineExceeded`).
        raise RequestFailed(f"{self.model}: no complete answer within the time-out ({e})") from e
      except openai.BadRequestError as e:
        if _is_context_error(e):
          raise ContextLengthExceeded(f"{self.model}: prompt longer than the context: "
                                      f"{e.message}") from e
        raise RequestFailed(f"{self.model}: HTTP 400: {e.message}") from e
      except (openai.RateLimitError, openai.InternalServerError, openai.APIConnectionError) as e:
        response = getattr(e, "response", None)
        what = f"HTTP {response.status_code}" if response is not None else type(e).__name__
        if attempt == self.policy.max_retries:
          raise RequestFailed(f"{self.model}: {what} after {attempt + 1} attempts: {e}") from e
        retry_after = response.headers.get("retry-after") if response is not None else None
        try:
          wait = self.policy.delay(attempt + 1, retry_after)
        except transport.RetryAfterTooLong as too_long:
          raise RequestFailed(f"{self.model}: {what}: {too_long}") from e
        self.retries += 1
        self._sleep(wait)
        continue
      except openai.APIStatusError as e:
        raise RequestFailed(f"{self.model}: HTTP {e.status_code}: {e.message}") from e
      choice = answer.choices[0] if answer.choices else None
      usage = answer.usage.model_dump() if answer.usage is not None else None
      return {
          "text": choice.message.content if choice else None,
          "usage": usage,
          "finish_reason": choice.finish_reason if choice else None
      }
    raise AssertionError("unreachable")
