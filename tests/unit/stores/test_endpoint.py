"""Tests of the endpoints' time bounds: Retry-After (RFC 9110 §10.2.3), whole-request timeouts of
the remote endpoint, and query timeouts of the embedded pyoxigraph store and their caching.

Every server here is a local one on 127.0.0.1 started by the test (the `local_server` fixture,
tests/local_http.py); no test sleeps for the waits a server asks (the sleep and the clock are
injected).
"""

import concurrent.futures
import email.utils
import json
import logging
import os
import time

import pytest

from mcwq_t5x import score as score_cli
from mcwq_t5x.stores import cache as cache_lib
from mcwq_t5x.stores import endpoint as ep
from mcwq_t5x.stores import flags as store_flags
from mcwq_t5x.stores import oxigraph
from mcwq_t5x.stores import remote as remote_lib
from mcwq_t5x.stores import transport
from preprocessing import migrate
import local_http

NOW = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT, the injected wall clock
ASK_TRUE = json.dumps({"head": {}, "boolean": True}).encode()


def http_date(t):
  return email.utils.formatdate(t, usegmt=True)


# ---- 10. Retry-After: both forms, at least what the server asks, a maximum ----


def test_parse_retry_after_reads_delay_seconds_and_all_three_http_date_forms():
  assert transport.parse_retry_after("300") == 300.0
  assert transport.parse_retry_after(" 0 ") == 0.0
  assert http_date(NOW + 300) == "Wed, 21 Oct 2015 07:33:00 GMT"
  assert transport.parse_retry_after(
      "Wed, 21 Oct 2015 07:33:00 GMT", now=NOW) == 300.0  # IMF-fixdate
  assert transport.parse_retry_after(
      "Wednesday, 21-Oct-15 07:33:00 GMT", now=NOW) == 300.0  # RFC 850
  assert transport.parse_retry_after("Wed Oct 21 07:33:00 2015", now=NOW) == 300.0  # asctime, UTC
  assert transport.parse_retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now=NOW) == 0.0  # in the past
  for junk in (None, "", "soon", "1.5", "-3", "inf", "nan"):
    assert transport.parse_retry_after(junk, now=NOW) is None, junk


def test_retry_delay_waits_at_least_what_the_server_asks_and_refuses_more_than_the_maximum():
  assert transport.retry_delay(2.0, None, max_s=120.0) == 2.0
  assert transport.retry_delay(500.0, None, max_s=120.0) == 120.0  # the backoff is capped
  assert transport.retry_delay(2.0, "300", max_s=600.0) == 300.0  # not capped at a backoff cap
  assert transport.retry_delay(2.0, http_date(NOW + 300), max_s=600.0, now=NOW) == 300.0
  assert transport.retry_delay(8.0, "1", max_s=600.0) == 8.0  # never less than the backoff
  with pytest.raises(transport.RetryAfterTooLong, match="3600 s.*maximum of 600 s") as e:
    transport.retry_delay(2.0, "3600", max_s=600.0)
  assert (e.value.wait_s, e.value.max_s) == (3600.0, 600.0)
  with pytest.raises(transport.RetryAfterTooLong):
    transport.retry_delay(2.0, http_date(NOW + 3600), max_s=600.0, now=NOW)


def test_retry_policy_backs_off_doubling_to_its_cap_and_is_the_transports():
  policy = transport.RetryPolicy(5, backoff_s=1.5, max_backoff_s=5.0, max_retry_after_s=60.0)
  assert [policy.backoff(n) for n in range(5)] == [0.0, 1.5, 3.0, 5.0, 5.0]
  assert policy.delay(1, "30") == 30.0 and policy.delay(0, None) == 0.0
  with pytest.raises(transport.RetryAfterTooLong, match="maximum of 60 s"):
    policy.delay(2, "61")
  with pytest.raises(ValueError, match="max_retries must not be negative"):
    transport.RetryPolicy(-1)
  t = transport.Transport(
      10.0, 5, backoff_s=1.5, max_backoff_s=5.0, max_retry_after_s=60.0, min_interval_s=0.0)
  assert t.policy == policy


class _Scripted(local_http.Handler):
  """Answers the server's `script` of (status, headers) in turn, then 200 with ASK true."""

  def do_POST(self):  # noqa: N802
    self.read_body()
    status, headers = self.server.script.pop(0) if self.server.script else (200, {})
    self.answer(status, ASK_TRUE if status == 200 else b"busy", headers=headers)


@pytest.fixture
def scripted(local_server):
  return local_server(_Scripted, "/sparql", script=[])


def test_remote_endpoint_waits_the_full_retry_after_in_both_forms(scripted):
  scripted.script = [(429, {
      "Retry-After": "300"
  }), (503, {
      "Retry-After": http_date(NOW + 90)
  }), (429, {})]
  waits = []
  remote = remote_lib.RemoteEndpoint(
      scripted.url,
      backoff_s=2.0,
      max_backoff_s=120.0,
      min_interval_s=0.0,
      sleep=waits.append,
      clock=lambda: NOW)
  assert remote.ask("ASK WHERE { ?s ?p ?o }") is True
  # 300 s as asked (not the 120 s backoff cap), 90 s from the date (not the 4 s backoff), then the
  # backoff (8 s) when the server asks nothing.
  assert waits == [300.0, 90.0, 8.0]
  assert scripted.requests == remote.num_requests == 4


@pytest.mark.parametrize("form", ["delay-seconds", "HTTP-date"])
def test_remote_endpoint_stops_when_retry_after_exceeds_the_maximum(scripted, form):
  value = "3600" if form == "delay-seconds" else http_date(NOW + 3600)
  scripted.script = [(429, {"Retry-After": value})] * 10
  waits = []
  remote = remote_lib.RemoteEndpoint(
      scripted.url,
      max_retry_after_s=600.0,
      min_interval_s=0.0,
      sleep=waits.append,
      clock=lambda: NOW)
  with pytest.raises(transport.RetryAfterTooLong, match=r"HTTP 429.*3600 s.*600 s.*stopping") as e:
    remote.ask("ASK WHERE { ?s ?p ?o }")
  assert e.value.wait_s == 3600.0
  assert not isinstance(e.value, ep.EndpointError)  # the migration stops instead of going on
  assert waits == [] and scripted.requests == 1


def test_remote_endpoint_next_query_still_waits_after_giving_up(scripted):
  scripted.script = [(429, {"Retry-After": "30"})] * 2
  waits = []
  remote = remote_lib.RemoteEndpoint(
      scripted.url, max_retries=0, min_interval_s=0.0, sleep=waits.append)
  with pytest.raises(ep.EndpointError, match="giving up after 1 attempts: HTTP 429"):
    remote.ask("ASK WHERE { ?s ?p ?o }")
  assert waits == []
  with pytest.raises(ep.EndpointError):
    remote.ask("ASK WHERE { ?x ?y ?z }")  # another query, but the server said: not for 30 s
  assert len(waits) == 1 and 29.0 < waits[0] <= 30.0
  assert scripted.requests == 2


# ---- 11. The remote timeout bounds the whole request ----


@pytest.mark.parametrize("phase", ["status-line", "body-with-length", "body-to-close"])
def test_remote_timeout_bounds_the_whole_request_against_a_trickling_server(phase, local_server):
  srv = local_server(
      local_http.Trickle,
      "/sparql",
      phase=phase,
      body=ASK_TRUE.ljust(30),  # one byte every 0.2 s: about 6 s in all
      content_type="application/sparql-results+json",
      interval_s=0.2)
  waits = []
  remote = remote_lib.RemoteEndpoint(srv.url, timeout_s=1.0, min_interval_s=0.0, sleep=waits.append)
  start = time.monotonic()
  with pytest.raises(ep.QueryTimeout, match="no complete answer within 1 s") as e:
    remote.ask("ASK WHERE { ?s ?p ?o }")
  elapsed = time.monotonic() - start
  assert 1.0 <= elapsed < 2.0, elapsed  # not ~6 s (the whole trickle), nor 6 tries of it
  assert e.value.timeout_s == 1.0
  assert srv.requests == 1 and waits == []  # a timeout is final: not retried
  assert srv.disconnected.wait(2.0)  # the connection was dropped, not left trickling


# ---- 12. Embedded store queries are bounded too, and a timeout is cached ----

N = 300  # a 300-triple store; a three-way cross product of it is 27 million solutions
SLOW = ("SELECT (COUNT(*) AS ?n) WHERE { ?a wdt:P1 ?b . ?c wdt:P1 ?d . ?e wdt:P1 ?f . "
        "FILTER ( CONCAT(STR(?a), STR(?c)) != STR(?e) ) }")  # takes > 10 s


@pytest.fixture
def small_store():
  import pyoxigraph  # pylint: disable=g-import-not-at-top
  store = pyoxigraph.Store()
  lines = "\n".join(f"<{ep.WD}Q{i + 1}> <{ep.WDT}P1> <{ep.WD}Q{i % 7 + 1}> ." for i in range(N))
  store.bulk_load(input=lines.encode(), format=pyoxigraph.RdfFormat.N_TRIPLES)
  return store


def pid_exists(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  return True


def test_embedded_query_timeout_kills_the_worker_and_raises(small_store, caplog):
  ox = oxigraph.OxigraphEndpoint(small_store, timeout_s=0.5)
  try:
    count = "SELECT (COUNT(*) AS ?n) WHERE { ?s wdt:P1 ?o }"
    assert ox.select(count) == [{"n": str(N)}]
    assert ox.select(count) == oxigraph.OxigraphEndpoint(small_store).select(count)  # same answers
    assert ox.ask("ASK WHERE { wd:Q8 wdt:P1 wd:Q1 }") is True
    with pytest.raises(ep.EndpointError, match="query failed: SyntaxError"):
      ox.select("SELECT WHERE { broken")
    worker = ox._worker.pid  # pylint: disable=protected-access
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=oxigraph.__name__):
      with pytest.raises(ep.QueryTimeout, match="timed out after 0.5 s") as e:
        ox.select(SLOW)
    elapsed = time.monotonic() - start
    assert 0.5 <= elapsed < 2.0, elapsed  # the query alone takes > 10 s
    assert e.value.timeout_s == 0.5 and ox.num_timeouts == 1
    assert "worker process was killed" in caplog.text
    assert not pid_exists(worker)  # killed and reaped, not left burning a core
    assert ox.ask("ASK WHERE { wd:Q8 wdt:P1 wd:Q1 }") is True  # a fresh worker answers
    assert ox._worker.pid != worker  # pylint: disable=protected-access
  finally:
    ox.close()


class _Fake(ep.Endpoint):
  """Answers every SELECT with `rows`, recording the queries."""

  def __init__(self, rows):
    self.rows, self.asked = rows, []

  def select(self, query):
    self.asked.append(query)
    return self.rows

  def ask(self, query):
    raise AssertionError("not used")


def test_cached_endpoint_records_a_timeout_and_does_not_rerun_it(small_store, tmp_path):
  path = tmp_path / "endpoint.jsonl"
  ox = oxigraph.OxigraphEndpoint(small_store, timeout_s=0.5)
  try:
    first = cache_lib.CachedEndpoint(ox, path)
    with pytest.raises(ep.QueryTimeout):
      first.select(SLOW)
    assert (first.misses, first.timeouts) == (1, 1)
  finally:
    ox.close()
  lines = [json.loads(line) for line in path.read_text().splitlines()]
  assert [(r["value"], r["kind"], r["query"]) for r in lines] == [({
      "timed_out_after_s": 0.5
  }, "select", SLOW)]

  # A rerun on the cache does not run it again.
  fake = _Fake([{"n": "1"}])
  rerun = cache_lib.CachedEndpoint(fake, path)
  start = time.monotonic()
  with pytest.raises(ep.QueryTimeout, match="recorded in the cache as timed out after 0.5 s") as e:
    rerun.select(SLOW)
  assert time.monotonic() - start < 0.2 and e.value.timeout_s == 0.5
  assert fake.asked == [] and (rerun.hits, rerun.misses, rerun.timeouts) == (1, 0, 1)

  # Unless asked: then it runs again, and the new answer replaces the record.
  asked = cache_lib.CachedEndpoint(fake, path, retry_timeouts=True)
  assert asked.select(SLOW) == [{"n": "1"}]
  assert fake.asked == [SLOW] and (asked.misses, asked.timeouts) == (1, 0)
  assert cache_lib.CachedEndpoint(_Fake([]), path).select(SLOW) == [{"n": "1"}]


def test_migrate_bounds_embedded_queries_with_timeout_and_passes_retry_timeouts(tmp_path):
  args = migrate.build_parser().parse_args(
      ["--out", str(tmp_path), "--codex", "", "--timeout", "7.5", "--retry-timeouts"])
  endpoint = migrate.make_endpoint(args)
  assert isinstance(endpoint.inner, oxigraph.OxigraphEndpoint)
  assert endpoint.inner.timeout_s == 7.5 and endpoint.retry_timeouts is True
  remote = migrate.make_endpoint(migrate.build_parser().parse_args(
      ["--out", str(tmp_path), "--endpoint", "remote", "--max-retry-after", "90"]))
  assert (remote.inner.timeout_s, remote.inner.max_retry_after_s) == (60.0, 90.0)
  assert remote.retry_timeouts is False


@pytest.mark.parametrize("user_agent_flag", ["--user-agent", "--user_agent"])
def test_evaluate_and_migrate_build_the_same_remote_endpoint_from_their_flags(
    tmp_path, user_agent_flag):
  flags = ["--url", "http://x", user_agent_flag, "A", "--timeout", "3", "--retries", "2"]
  for args in (score_cli._parser().parse_args(["--predictions", "p"] + flags),
               migrate.build_parser().parse_args(["--out", str(tmp_path)] + flags)):
    remote = store_flags.remote_endpoint_from_arguments(args)
    assert (remote.url, remote.user_agent, remote.timeout_s, remote.max_retries) == ("http://x",
                                                                                     "A", 3.0, 2)
    assert (remote.min_interval_s,
            remote.max_retry_after_s) == (remote_lib.DEFAULT_MIN_INTERVAL_S,
                                          transport.DEFAULT_MAX_RETRY_AFTER_S)


# ---- An endpoint's error is never an answer ----


class _Fixed(local_http.Handler):
  """Answers every POST with status 200 and the server's `body` (and `content_type`)."""

  def do_POST(self):  # noqa: N802
    self.read_body()
    self.answer(200, self.server.body, self.server.content_type)


@pytest.fixture
def fixed(local_server):
  return local_server(_Fixed, "/sparql", content_type="application/sparql-results+json")


@pytest.mark.parametrize(
    "form,body,problem",
    [("select", b'{"error": "java.util.concurrent.TimeoutException"}', "an error object"),
     ("ask", b'{"error": {"message": "query timeout"}}', "an error object"),
     ("select", b'{"head": {"vars": ["x"]}}', "no 'results.bindings' list"),
     ("select", b'{"results": {"bindings": []}}', "no 'head' object"),
     ("select", b'{"head": {}, "results": {"bindings": [{"x": "Q1"}]}}', "a binding that is not"),
     ("ask", b'{"head": {}}', "no boolean 'boolean'"),
     ("ask", b'{"head": {}, "boolean": "true"}', "no boolean 'boolean'"),
     ("select", b"<!DOCTYPE html><html><body>Service unavailable</body></html>", "not JSON"),
     ("ask", b"Internal error", "not JSON"), ("select", b"[]", "a JSON list, not an object")])
def test_remote_answer_that_is_not_sparql_json_results_is_an_error_and_not_cached(
    fixed, tmp_path, form, body, problem):
  fixed.body = body
  remote = remote_lib.RemoteEndpoint(fixed.url, min_interval_s=0.0, sleep=lambda s: None)
  cached = cache_lib.CachedEndpoint(remote, tmp_path / "answers.jsonl")
  run = cached.select if form == "select" else cached.ask
  query = "SELECT ?x WHERE { ?x ?p ?o }" if form == "select" else "ASK WHERE { ?s ?p ?o }"
  for _ in range(2):  # nothing is cached: the second call asks again
    with pytest.raises(ep.EndpointError) as e:
      run(query)
    message = str(e.value)
    assert fixed.url in message and problem in message, message
    assert repr(body[:40].decode())[1:-1] in message  # the head of the body
  assert fixed.requests == 2 and (cached.hits, cached.misses) == (0, 2)
  assert len(cache_lib.CachedEndpoint(_Fake([]), tmp_path / "answers.jsonl").cache) == 0


def test_remote_select_reads_sparql_json_results(fixed):
  fixed.body = json.dumps({
      "head": {
          "vars": ["x", "l"]
      },
      "results": {
          "bindings": [{
              "x": {
                  "type": "uri",
                  "value": ep.WD + "Q42"
              },
              "l": {
                  "type": "literal",
                  "value": "Douglas Adams",
                  "xml:lang": "en"
              }
          }, {}]
      }
  }).encode()
  remote = remote_lib.RemoteEndpoint(fixed.url, min_interval_s=0.0)
  assert remote.select("SELECT ?x ?l WHERE { ?x rdfs:label ?l }") == [{
      "x": "wd:Q42",
      "l": "Douglas Adams"
  }, {}]


# ---- Redirects of a POST re-send the query ----


class _Moved(local_http.Handler):
  """`/old` (and `/loop`) redirect with the server's `status`; `/new` answers a POSTed query."""

  def do_POST(self):  # noqa: N802
    form = self.read_form()
    self.server.log.append(("POST", self.path, form.get("query", [""])[0]))
    location = {"/old": "/new", "/loop": "/loop", "/nowhere": None}
    if self.path in location:
      self.answer(
          self.server.status,
          headers={"Location": location[self.path]} if location[self.path] else {})
    else:
      self.answer(200, ASK_TRUE)

  def do_GET(self):  # noqa: N802
    self.server.log.append(("GET", self.path, ""))
    self.answer(405)


@pytest.fixture
def moved(local_server):
  return local_server(_Moved, log=[], status=301)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_remote_redirect_resends_the_query_to_the_new_location(moved, status, caplog):
  moved.status = status
  remote = remote_lib.RemoteEndpoint(moved.base + "/old", min_interval_s=0.0)
  query = "ASK WHERE { wd:Q42 wdt:P31 wd:Q5 }"
  with caplog.at_level(logging.WARNING, logger=transport.__name__):
    assert remote.ask(query) is True
  assert moved.log == [("POST", "/old", ep.PREFIXES + query), ("POST", "/new", ep.PREFIXES + query)]
  assert f"HTTP {status} redirect to {moved.base}/new" in caplog.text
  assert remote.num_requests == 2
  # A permanent redirect is remembered: the next query goes to the new location directly.
  assert remote.ask(query) is True
  assert [p for _, p, _ in moved.log[2:]] == (["/new"] if status in (301,
                                                                     308) else ["/old", "/new"])


def test_remote_redirect_without_location_or_in_a_loop_is_an_error_naming_it(moved):
  remote = remote_lib.RemoteEndpoint(moved.base + "/nowhere", min_interval_s=0.0)
  with pytest.raises(ep.EndpointError, match="HTTP 301 redirect without a Location header"):
    remote.ask("ASK WHERE { ?s ?p ?o }")
  moved.status = 307
  remote = remote_lib.RemoteEndpoint(moved.base + "/loop", min_interval_s=0.0)
  with pytest.raises(
      ep.EndpointError, match=f"more than 5 redirects .the last to {moved.base}/loop"):
    remote.ask("ASK WHERE { ?s ?p ?o }")
  assert remote.num_requests == 6


def test_remote_connection_refused_is_retried_with_backoff_then_an_error():
  waits = []
  remote = remote_lib.RemoteEndpoint(
      f"http://127.0.0.1:{local_http.free_port()}/sparql",  # a port nothing listens on
      max_retries=2,
      backoff_s=0.5,
      min_interval_s=0.0,
      sleep=waits.append)
  with pytest.raises(ep.EndpointError, match="giving up after 3 attempts: NewConnectionError"):
    remote.ask("ASK WHERE { ?s ?p ?o }")
  assert waits == [0.5, 1.0] and remote.num_requests == 3


class _CutOnce(local_http.Handler):
  """The first answer announces its full length but the connection closes after 10 bytes; later
  ones are complete (ASK true)."""

  def do_POST(self):  # noqa: N802
    self.read_body()
    self.send_response(200)
    self.send_header("Content-Type", "application/sparql-results+json")
    self.send_header("Content-Length", str(len(ASK_TRUE)))
    self.end_headers()
    self.wfile.write(ASK_TRUE if self.server.requests > 1 else ASK_TRUE[:10])
    self.close_connection = True


def test_remote_connection_lost_while_reading_the_answer_is_retried(local_server):
  srv = local_server(_CutOnce, "/sparql")
  waits = []
  remote = remote_lib.RemoteEndpoint(srv.url, backoff_s=0.5, min_interval_s=0.0, sleep=waits.append)
  assert remote.ask("ASK WHERE { ?s ?p ?o }") is True
  assert waits == [0.5] and srv.requests == remote.num_requests == 2


def test_remote_request_that_cannot_be_sent_is_an_error_at_once():
  waits = []
  remote = remote_lib.RemoteEndpoint("query.wikidata.org/sparql", sleep=waits.append)
  with pytest.raises(ep.EndpointError, match="query.wikidata.org/sparql: MissingSchema"):
    remote.ask("ASK WHERE { ?s ?p ?o }")
  assert waits == []  # not retried


# ---- 13. One transport, several threads: paced together ----


class _Arrivals(local_http.Handler):
  """Records when each POST arrives (`server.arrivals`, monotonic seconds), echoes its body."""

  def do_POST(self):  # noqa: N802
    self.server.arrivals.append(time.monotonic())
    self.answer(200, self.read_body(), "application/json")


def test_transport_paces_the_requests_of_all_threads_together(local_server):
  srv = local_server(_Arrivals, "/v1/chat/completions", arrivals=[])
  t = transport.Transport(5.0, 0, min_interval_s=0.3)
  bodies = [json.dumps({"n": n}).encode() for n in range(4)]
  start = time.monotonic()
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    answers = list(
        pool.map(lambda b: t.post(srv.url, b, {"Content-Type": "application/json"}), bodies))
  elapsed = time.monotonic() - start
  assert [a.body for a in answers] == bodies  # bytes go as they are
  assert len(srv.arrivals) == 4
  # why the whole time, not the gaps between arrivals: a loaded machine delays an arrival (and
  # shortens the gap after it), never the pacing; 4 requests at once take some milliseconds.
  assert elapsed >= 3 * 0.3 - 0.01, elapsed
  assert t.num_requests == 4
  t.close()


class _ChatWithRedirect(local_http.ChatCompletions):
  """`/old` redirects (307) to `server.to`; other paths answer as `local_http.ChatCompletions`
  (which records each request's Authorization header in `server.seen`)."""

  def do_POST(self):  # noqa: N802
    if self.path != "/old":
      return super().do_POST()
    self.read_body()
    self.answer(307, headers={"Location": self.server.to})


def test_a_redirect_keeps_the_authorization_header_on_its_host_only(local_server):
  target = local_server(_ChatWithRedirect, seen=[], script=[], to="/v1/chat/completions")
  other = local_server(_ChatWithRedirect, seen=[], script=[], to=target.base + "/new")
  t = transport.Transport(5.0, 0)
  body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "SPARQL: ASK"}]})
  headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-secret"}
  assert t.post(target.base + "/old", body.encode(), headers).status == 200
  assert target.seen[-1][1] == "Bearer sk-secret"  # same host: kept
  assert t.post(other.base + "/old", body.encode(), headers).status == 200
  assert target.seen[-1][1] is None  # another host (another port): not sent
  assert other.seen == [] and len(target.seen) == 2
