"""Chat completions from any OpenAI-compatible server (vLLM, llama.cpp, Ollama, TGI, hosted APIs),
with the project's transport and a crash-safe cache of every answer.

`POST {base_url}/chat/completions` (JSON, `Authorization: Bearer <key>`) through
`mcwq_t5x.stores.transport.Transport`: a deadline on each attempt as a whole (a server trickling
its answer cannot hold a request longer than `timeout_s`), 429, 5xx and connection errors retried
at most `max_retries` times after its backoff (at least `Retry-After`). `RequestFailed` for good:
a time-out, retries spent, a `Retry-After` over `max_retry_after_s`, another 4xx (401, 403, 404:
the same for every request), and a 200 that is not a chat completion (not JSON, not UTF-8, an
HTML page, no `choices[0].message`; not cached, so a rerun asks again). A prompt over the context
length (a 400 saying so) is an answer with text None and an "error" (cached; a syntax error for
the example). An answer's `reasoning_content` (or `reasoning`) is kept beside its `content`.

The cache (`stores.jsonl_cache.JsonlCache`, fsync'ed) is keyed by model, sampling parameters and
prompt: a rerun after a kill sends no request twice, except those in flight at the kill. The API
key is sent, never stored or logged: every text that came from the server (a body echoing the
request's headers) is cached and reported with the key replaced by `REDACTED`.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Any, Callable, Mapping

from mcwq_t5x.stores import jsonl_cache
from mcwq_t5x.stores import transport

CONTEXT_MARKERS = ("context length", "context_length", "maximum context", "too many tokens",
                   "exceeds the context", "context window")
REDACTED = "REDACTED"
MIN_SECRET_LENGTH = 8  # shorter keys (a local server's "EMPTY") are not redacted
USER_AGENT = "mcwq-t5x prompting"


class RequestFailed(RuntimeError):
  """A request that failed for good (see module docstring); the message names it, never the
  key."""


class ContextLengthExceeded(RequestFailed):
  """The server refused the prompt as longer than the model's context (HTTP 400)."""


def _error_message(body: bytes) -> str:
  """The `error.message` of an OpenAI-style error body, else the body's head."""
  try:
    error = json.loads(body.decode("utf-8")).get("error")
    message = error.get("message") if isinstance(error, dict) else error
    if isinstance(message, str) and message:
      return message
  except (UnicodeDecodeError, ValueError, AttributeError):
    pass
  return transport.body_head(body)


def parse_completion(body: bytes) -> dict[str, Any]:
  """{"text", "reasoning", "usage", "finish_reason"} of a chat-completion answer's body (text
  and reasoning: str or None).

  Raises:
    ValueError: the body is not UTF-8 JSON holding `choices[0].message` (an object whose
      `content` is a string or null); the message quotes the body's head.
  """
  try:
    answer = json.loads(body.decode("utf-8"))
  except (UnicodeDecodeError, ValueError) as e:
    raise ValueError(f"not a JSON chat completion ({type(e).__name__}): "
                     f"{transport.body_head(body)}") from e
  choices = answer.get("choices") if isinstance(answer, dict) else None
  choice = choices[0] if isinstance(choices, list) and choices else None
  message = choice.get("message") if isinstance(choice, dict) else None
  if not isinstance(message, dict):
    raise ValueError(f"no choices[0].message in the answer: {transport.body_head(body)}")
  text = message.get("content")
  reasoning = message.get("reasoning_content", message.get("reasoning"))
  if not isinstance(text, (str, type(None))) or not isinstance(reasoning, (str, type(None))):
    raise ValueError(f"choices[0].message's content is not a string: {transport.body_head(body)}")
  usage = answer.get("usage")
  return {
      "text": text,
      "reasoning": reasoning,
      "usage": usage if isinstance(usage, dict) else None,
      "finish_reason": choice.get("finish_reason")
  }


def _is_answer(value: Any) -> bool:
  """Whether a cached value is an answer: a text, reasoning or an error (a 200 without a
  completion, cached as all None by earlier versions, is asked again)."""
  return isinstance(value, dict) and any(
      value.get(k) is not None for k in ("text", "reasoning", "error", "finish_reason"))


class ChatClient:
  """One model on one server; `complete(prompt)` is thread-safe.

  Args:
    base_url: the server's OpenAI API root, e.g. "http://localhost:8000/v1".
    model: the model name the server knows.
    api_key: the key (from the environment; never written anywhere, see `redact`).
    params: sampling parameters sent with every request (temperature, seed, max_tokens).
    cache_path: the JSONL request cache (None: memory).
    min_interval_s: least seconds between the starts of two requests (a rate limit).
    timeout_s: seconds one attempt may take as a whole (connecting to the last byte).
    max_retries, backoff_s, max_backoff_s, max_retry_after_s: the transport's retry policy.
    sleep: the sleep function (tests inject one).

  Raises:
    ValueError: `timeout_s` <= 0 or `max_retries` < 0.

  Attributes:
    policy: the `transport.RetryPolicy` of the retry and pacing arguments (the transport's).
    sent: requests sent (attempts: retries and redirect hops included).
    retries: `sent` less the prompts asked.
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
    self.url = base_url.rstrip("/") + "/chat/completions"
    self.cache = jsonl_cache.JsonlCache(cache_path)
    self._key = api_key
    # why: a placeholder ("EMPTY") or a very short key would redact ordinary words
    self._secret = api_key if len(api_key) >= MIN_SECRET_LENGTH else None
    self._transport = transport.Transport(
        timeout_s,
        max_retries,
        backoff_s=backoff_s,
        max_backoff_s=max_backoff_s,
        min_interval_s=min_interval_s,
        max_retry_after_s=max_retry_after_s,
        user_agent=USER_AGENT,
        sleep=sleep)
    self.policy = self._transport.policy
    self._lock = threading.Lock()
    self._asked = 0

  @property
  def sent(self) -> int:
    return self._transport.num_requests

  @property
  def retries(self) -> int:
    return self._transport.num_requests - self._asked

  def key(self, prompt: str) -> str:
    """The cache key of `prompt` for this model and these parameters."""
    return jsonl_cache.make_key("chat", self.model, json.dumps(self.params, sort_keys=True), prompt)

  def redact(self, value: Any) -> Any:
    """`value` (a str, or lists and dicts of them) with the API key replaced by `REDACTED` (a key
    of `MIN_SECRET_LENGTH` characters or more)."""
    if isinstance(value, str):
      return value.replace(self._secret, REDACTED) if self._secret else value
    if isinstance(value, dict):
      return {k: self.redact(v) for k, v in value.items()}
    if isinstance(value, list):
      return [self.redact(v) for v in value]
    return value

  def complete(self, prompt: str) -> dict[str, Any]:
    """{"text", "reasoning", "usage", "finish_reason", "cached"} for `prompt`, from the cache or
    the server; a prompt longer than the model's context gives text None and "error"
    "context_length: ..." (cached).

    Raises:
      RequestFailed: see module docstring.
    """
    key = self.key(prompt)
    hit = self.cache.get(key)
    if _is_answer(hit):
      return dict(hit, cached=True)
    try:
      value = self._request(prompt)
    except ContextLengthExceeded as e:  # why: the same prompt fails the same way: cache it too
      value = {"text": None, "usage": None, "error": f"context_length: {e}"}
    value = self.redact(value)
    self.cache.put(key, value)
    return dict(value, cached=False)

  def _request(self, prompt: str) -> dict[str, Any]:
    body = json.dumps({
        "model": self.model,
        "messages": [{
            "role": "user",
            "content": prompt
        }],
        **self.params
    }).encode("utf-8")
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self._key}"}
    with self._lock:
      self._asked += 1
    try:
      response = self._transport.post(self.url, body, headers)
    except transport.DeadlineExceeded as e:
      # Not retried: the request would take as long again.
      raise self._failed(f"no complete answer within the time-out ({e})") from None
    except transport.HTTPStatusError as e:
      status, message = e.response.status, _error_message(e.response.body)
      text = e.response.body.decode("utf-8", "replace").lower()  # why: message, code, type
      if status == 400 and any(m in text for m in CONTEXT_MARKERS):
        raise ContextLengthExceeded(
            self.redact(f"{self.model}: prompt longer than the context: {message}")) from None
      raise self._failed(f"{self.url}: HTTP {status}: {message}") from None
    except (transport.TransportError, transport.RetryAfterTooLong) as e:
      raise self._failed(str(e)) from None
    try:
      return parse_completion(response.body)
    except ValueError as e:
      raise self._failed(f"{self.url}: HTTP {response.status} but {e}") from None

  def _failed(self, message: str) -> RequestFailed:
    return RequestFailed(self.redact(f"{self.model}: {message}"))
