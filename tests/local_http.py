"""Local HTTP servers on 127.0.0.1 for the tests of the remote clients (SPARQL endpoints, Cloud
Translation, object stores): a threaded `http.server` that answers with a handler the test
supplies, a real SPARQL 1.1 server (`oxigraph serve-read-only`) over given N-Triples, and a
stand-in of Google Cloud Storage's JSON API over a folder (`GcsFolder`, `gcs_env`).

Tests take servers from the `local_server` fixture (tests/conftest.py), which shuts them down after
the test; a module-scoped fixture enters `serve` itself. No server here sleeps for a wait a client
is asked to make: the tests inject the clients' sleep and clock.
"""
import contextlib
import http.server
import json
import pathlib
import socket
import subprocess
import threading
import time
import urllib.parse
from typing import Iterator, Type

import mains


class Server(http.server.ThreadingHTTPServer):
  """A threaded server on 127.0.0.1, on a free port.

  Attributes:
    base: "http://127.0.0.1:<port>".
    url: `base` + the path given to `serve`.
    requests: requests answered so far (handlers add 1 through `Handler.read_body`).
    disconnected: set by `Handler.trickle` when the client hung up.
    Any keyword given to `serve`: the handler's state (a script of answers, a log...).
  """
  daemon_threads = True

  def __init__(self, handler: Type[http.server.BaseHTTPRequestHandler], path: str, **state):
    super().__init__(("127.0.0.1", 0), handler)
    self.base = f"http://127.0.0.1:{self.server_port}"
    self.url = self.base + path
    self.requests = 0
    self.disconnected = threading.Event()
    for name, value in state.items():
      setattr(self, name, value)


class Handler(http.server.BaseHTTPRequestHandler):
  """A quiet request handler with helpers to read a request and write an answer; a test's handler
  subclasses it and defines `do_POST` (and `do_GET`...)."""
  server: Server

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    del format, args  # no line on stderr per request

  def read_body(self) -> bytes:
    """The request's body (Content-Length bytes); counts the request in `server.requests`."""
    self.server.requests += 1
    return self.rfile.read(int(self.headers.get("Content-Length", 0)))

  def read_form(self) -> dict[str, list[str]]:
    """The request's urlencoded form, e.g. {"query": [...]} or {"q": [...], "target": [...]}."""
    return urllib.parse.parse_qs(self.read_body().decode())

  def answer(self,
             status: int,
             body: bytes = b"",
             content_type: str = "application/sparql-results+json",
             headers: dict[str, str] | None = None) -> None:
    """Sends `status` with `headers`, Content-Type and Content-Length, then `body`."""
    self.send_response(status)
    for name, value in (headers or {}).items():
      self.send_header(name, value)
    self.send_header("Content-Type", content_type)
    self.send_header("Content-Length", str(len(body)))
    self.end_headers()
    self.wfile.write(body)

  def trickle(self, raw: bytes, interval_s: float, at_once: int = 0) -> None:
    """Writes the first `at_once` bytes of `raw` at once, then the rest one byte every
    `interval_s` seconds, then closes the connection; sets `server.disconnected` when the client
    hangs up first."""
    try:
      if at_once:
        self.wfile.write(raw[:at_once])
        self.wfile.flush()
      for i in range(at_once, len(raw)):
        self.wfile.write(raw[i:i + 1])
        self.wfile.flush()
        time.sleep(interval_s)
    except OSError:  # broken pipe / reset: the client hung up
      self.server.disconnected.set()
    self.close_connection = True


class Trickle(Handler):
  """Answers every POST with status 200 and the server's `body` (of `content_type`), one byte every
  `server.interval_s` seconds: a client whose timeout bounds only each read would wait for all of
  it.

  `server.phase`: "status-line" trickles from the first byte of the answer, "body-with-length"
  sends the head at once and trickles a body of known length, "body-to-close" the same without
  Content-Length (the body ends when the connection closes).
  """

  def do_POST(self):  # noqa: N802
    self.read_body()
    head = f"HTTP/1.0 200 OK\r\nContent-Type: {self.server.content_type}\r\n"
    if self.server.phase != "body-to-close":
      head += f"Content-Length: {len(self.server.body)}\r\n"
    head += "\r\n"
    self.trickle(
        head.encode() + self.server.body,
        self.server.interval_s,
        at_once=0 if self.server.phase == "status-line" else len(head))


@contextlib.contextmanager
def serve(handler: Type[http.server.BaseHTTPRequestHandler],
          path: str = "/",
          **state) -> Iterator[Server]:
  """A `Server` answering with `handler` in a daemon thread, shut down and closed on exit."""
  server = Server(handler, path, **state)
  threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
  try:
    yield server
  finally:
    server.shutdown()
    server.server_close()


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on (free when this returns)."""
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


@contextlib.contextmanager
def sparql_server(ntriples: pathlib.Path, folder: pathlib.Path, load_timeout_s: int = 300):
  """A read-only SPARQL 1.1 server over the N-Triples file `ntriples` (`oxigraph load` into
  `folder/db`, then `oxigraph serve-read-only`), stopped on exit; yields its query URL.

  Raises:
    subprocess.CalledProcessError: the triples do not load.
    AssertionError: the server does not accept connections within 10 s.
  """
  exe = mains.console_script("oxigraph")
  subprocess.run([exe, "load", "--location",
                  str(folder / "db"), "--file",
                  str(ntriples)],
                 check=True,
                 capture_output=True,
                 timeout=load_timeout_s)
  port = free_port()
  proc = subprocess.Popen(
      [exe, "serve-read-only", "--location",
       str(folder / "db"), "--bind", f"127.0.0.1:{port}"],
      stdout=subprocess.DEVNULL,
      stderr=subprocess.DEVNULL)
  try:
    for _ in range(100):
      try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        break
      except OSError:
        time.sleep(0.1)
    else:
      raise AssertionError(f"oxigraph serve-read-only on 127.0.0.1:{port}: no connection in 10 s")
    yield f"http://127.0.0.1:{port}/query"
  finally:
    proc.terminate()
    proc.wait(timeout=10)


def completion(model: str,
               content: str | None,
               reasoning: str | None = None,
               usage: tuple[int, int] = (0, 0),
               finish_reason: str = "stop") -> dict:
  """An OpenAI chat-completion answer with one choice: `content` (and `reasoning_content`, as
  vLLM's reasoning parsers send it, when given) and `usage` (prompt, completion tokens)."""
  message = {"role": "assistant", "content": content}
  if reasoning is not None:
    message["reasoning_content"] = reasoning
  return {
      "id": "chatcmpl-test",
      "object": "chat.completion",
      "created": 0,
      "model": model,
      "choices": [{
          "index": 0,
          "finish_reason": finish_reason,
          "message": message
      }],
      "usage": {
          "prompt_tokens": usage[0],
          "completion_tokens": usage[1],
          "total_tokens": sum(usage)
      },
  }


class ChatCompletions(Handler):
  """An OpenAI-protocol chat-completions server (`POST .../chat/completions`) that answers through
  the nearest-neighbour baseline: the first demonstration's query of the prompt (the line after
  the first "SPARQL: "), in a ```sparql code fence, with a usage record (prompt tokens = words).

  State (keywords of `serve`): `script`, a list of answers sent first, in order, each
  (status, headers, body) or "hang" (sleep `hang_s` seconds, then answer normally) or "noquery"
  (a 200 whose text holds no query); `seen`, a list that gets each request's JSON and
  Authorization header. A scripted body is JSON-encoded, or sent as it is when bytes (with the
  scripted headers' Content-Type, else text/html); a callable body is first called with the
  request's headers (a dict: a server echoing them).
  """

  def do_POST(self):  # pylint: disable=invalid-name
    request = json.loads(self.read_body())
    self.server.seen.append((request, self.headers.get("Authorization")))
    step = self.server.script.pop(0) if self.server.script else None
    if step == "hang":
      time.sleep(self.server.hang_s)
    elif isinstance(step, tuple):
      status, headers, body = step
      headers = dict(headers)
      if callable(body):
        body = body(dict(self.headers))
      if isinstance(body, bytes):
        self.answer(status, body, headers.pop("Content-Type", "text/html"), headers)
      else:
        self.answer(status, json.dumps(body).encode(), "application/json", headers)
      return
    prompt = request["messages"][-1]["content"]
    lines = [l for l in prompt.split("\n") if l.startswith("SPARQL: ")]
    text = ("I cannot answer that."
            if step == "noquery" or not lines else f"```sparql\n{lines[0][len('SPARQL: '):]}\n```")
    words = len(prompt.split())
    body = completion(request["model"], text, usage=(words, len(text.split())))
    try:
      self.answer(200, json.dumps(body).encode(), "application/json")
    except BrokenPipeError:  # the client gave up waiting (the time-out case)
      pass


class GcsFolder(Handler):
  """Google Cloud Storage's JSON API (read only) over the folder `server.root`: each subfolder is a
  bucket, each file below it an object named by its relative path. The calls TensorStore's `gcs`
  key-value store makes (`gcs_env` points it here): object metadata
  `GET /storage/v1/b/<bucket>/o/<object>`, the object's bytes with `?alt=media` (a `Range` header
  honoured), and the listing `GET /storage/v1/b/<bucket>/o` by `prefix` or
  `startOffset`/`endOffset` (one page). A missing bucket or object is a 404; every request's path
  is appended to `server.seen` (a list given to `serve`).
  """

  def do_GET(self):  # noqa: N802
    self.server.requests += 1
    self.server.seen.append(self.path)
    url = urllib.parse.urlsplit(self.path)
    query = urllib.parse.parse_qs(url.query)
    parts = url.path.split("/", 6)  # ["", "storage", "v1", "b", bucket, "o", object]
    bucket = self.server.root / parts[4] if len(parts) > 5 and parts[1:4] == ["storage", "v1", "b"
                                                                             ] else None
    if bucket is None or parts[5] != "o" or not bucket.is_dir() or parts[4] in ("", ".", ".."):
      return self._error(404, "No such bucket")
    if len(parts) == 6:
      return self._list(parts[4], bucket, query)
    name = urllib.parse.unquote(parts[6])
    f = bucket / name
    if ".." in name.split("/") or not f.is_file():
      return self._error(404, "No such object: " + name)
    data = f.read_bytes()
    generation = {"x-goog-generation": "1", "x-goog-metageneration": "1"}
    if query.get("alt") != ["media"]:
      meta = {
          "kind": "storage#object",
          "bucket": parts[4],
          "name": name,
          "size": str(len(data)),
          "generation": "1",
          "metageneration": "1"
      }
      return self.answer(200, json.dumps(meta).encode(), "application/json", generation)
    ranged = self.headers.get("Range", "").partition("bytes=")[2]
    if not ranged:
      return self.answer(200, data, "application/octet-stream", generation)
    first, _, last = ranged.partition("-")
    end = int(last) + 1 if last else len(data)
    self.answer(206, data[int(first):end], "application/octet-stream", {
        **generation, "Content-Range": f"bytes {first}-{end - 1}/{len(data)}"
    })

  def _list(self, name: str, bucket: pathlib.Path, query: dict[str, list[str]]) -> None:
    prefix = query.get("prefix", [""])[0]
    start, end = query.get("startOffset", [""])[0], query.get("endOffset", [""])[0]
    items = []
    for f in sorted(bucket.rglob("*")):
      key = f.relative_to(bucket).as_posix()
      if (f.is_file() and key.startswith(prefix) and key >= start and (not end or key < end)):
        items.append({
            "kind": "storage#object",
            "bucket": name,
            "name": key,
            "size": str(f.stat().st_size),
            "generation": "1"
        })
    self.answer(200,
                json.dumps({
                    "kind": "storage#objects",
                    "items": items
                }).encode(), "application/json")

  def _error(self, status: int, message: str) -> None:
    body = {"error": {"code": status, "message": message}}
    self.answer(status, json.dumps(body).encode(), "application/json")


def gcs_env(url: str) -> dict[str, str]:
  """The variables that point TensorStore's `gcs` key-value store at `url` (a `GcsFolder` server's
  `base`, or a closed port) and give it a token, so that it asks no credentials service."""
  return {"TENSORSTORE_GCS_HTTP_URL": url, "GOOGLE_AUTH_TOKEN_FOR_TESTING": "local-test-token"}
