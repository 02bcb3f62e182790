"""The prompting path on the shared data: selection, prompt, the OpenAI-protocol server of the
tests (answering through the nearest-neighbour baseline), parsing, cache, scoring, the error cases,
and the API key kept out of every file."""
import json
import sys
import time

import pytest

from mcwq_t5x import prompt as prompt_main
from mcwq_t5x.data import readers
from mcwq_t5x.data import rir
from mcwq_t5x.evaluation import metrics
from mcwq_t5x.prompting import client as client_lib
from mcwq_t5x.prompting import prompt_format
from mcwq_t5x.prompting import selection as selection_lib
import local_http
import mains

SECRET = "sk-test-secret-0123456789"
TASK = ["--task", "mcwq_mcd1_he", "--split", "test", "--max_examples", "6"]


def _prompt(out, *extra, env=None, check=True):
  return mains.python_m(
      "mcwq_t5x.prompt", *TASK, "--out", str(out), *extra, env=env, check=check, timeout=120)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
  out = tmp_path_factory.mktemp("nn")
  _prompt(out, "--model", "nearest_neighbour", "--selection", "similar", "--shots", "1")
  return out


def test_parse_task_and_system_names():
  assert prompt_main.parse_task("mcwq_random_split_zh") == ("random_split", "zh")
  with pytest.raises(ValueError, match="mcwq_mcd1_he"):
    prompt_main.parse_task("mcwq_mcd1_zeroshot_he")
  assert prompt_main.system_name("m", 8, "oracle_compounds", "same") == \
      "ORACLE_m_8shot_oracle_compounds"
  assert prompt_main.system_name("org/M 7b", 8, "cover", "en") == "org-M-7b_8shot_cover_en-demos"


def test_extract_and_convert_a_real_query():
  ex = readers.read_split("mcd1", "test", "kn")[0]
  fenced = f"The query is:\n```sparql\n{ex.sparql.replace(' . ', ' .' + chr(10))}\n```\nDone."
  assert prompt_format.to_rir(fenced) == ex.rir
  assert prompt_format.to_rir(f"SPARQL: {ex.sparql}") == ex.rir
  assert prompt_format.to_rir("I do not know.") == ""
  assert prompt_format.to_rir("SELECT ?x WHERE { ?x") == ""  # truncated: no closing brace
  assert metrics.classify_error(ex.rir, "") == metrics.SYNTAX_ERROR


def test_selection_methods_on_shared_dev():
  pool = readers.read_split("mcd1", "dev", "en")[:400]
  test = readers.read_split("mcd1", "test", "en")[:20]
  sel = selection_lib.Selector([e.question for e in pool], [e.sparql for e in pool], "en", seed=3)
  assert sel.select("random", "q", 8, index=5) == sel.select("random", "other", 8, index=5)
  assert sel.select("random", "q", 8, index=5) != sel.select("random", "q", 8, index=6)
  cover, oracle, similar = [], [], []
  for i, ex in enumerate(test):
    units = selection_lib.cover_units(ex.question, "en")
    c = sel.select("cover", ex.question, 4, i)
    s = sel.select("similar", ex.question, 4, i)
    assert len(c) == len(set(c)) == 4
    got = set().union(*(selection_lib.cover_units(pool[j].question, "en") for j in c))
    top = set().union(*(selection_lib.cover_units(pool[j].question, "en") for j in s))
    cover.append(len(units & got))
    similar.append(len(units & top))
    o = sel.select("oracle_compounds", ex.question, 4, i, ex.sparql)
    oracle.append(selection_lib.compound_coverage(ex.sparql, [pool[j].sparql for j in o]))
    assert oracle[-1] >= selection_lib.compound_coverage(ex.sparql, [pool[j].sparql for j in s])
  assert sum(cover) > sum(similar)  # the cover covers more of the question than the top 4
  assert 0.5 < sum(oracle) / len(oracle) <= 1.0
  zh = selection_lib.tokens("M0的导演是谁？", "zh")
  assert zh == ["m0", "的", "导", "演", "是", "谁"]


def test_end_to_end_through_a_server_equals_the_baseline(baseline, tmp_path):
  gold = readers.read_split("mcd1", "test", "he")[:6]
  predictions = (baseline / "predictions.txt").read_text(encoding="utf-8").splitlines()
  run = json.loads((baseline / "run.json").read_text(encoding="utf-8"))
  assert len(predictions) == 6 and run["demonstration_part"] == "dev"
  assert all(rir.rir_to_sparql(p) for p in predictions)  # copies of real queries: all parse
  assert run["system"] == "nearest_neighbour_1shot_similar"
  with local_http.serve(local_http.ChatCompletions, seen=[], script=[]) as server:
    out = tmp_path / "llm"
    env = {"MCWQ_TEST_KEY": SECRET}
    args = ("--base_url", server.base + "/v1", "--model", "test-model", "--shots", "1",
            "--selection", "similar", "--api_key_env", "MCWQ_TEST_KEY")
    first = _prompt(out, *args, env=env)
    assert server.requests == 6
    assert {auth for _, auth in server.seen} == {f"Bearer {SECRET}"}
    request = server.seen[0][0]
    assert request["temperature"] == 0.0 and request["seed"] == 0 and request["model"] == \
        "test-model"
    assert (out / "predictions.txt").read_text(encoding="utf-8").splitlines() == predictions
    again = _prompt(out, *args, env=env)
    assert server.requests == 6  # every answer came from the cache
    assert "6 from the cache" in again.stdout
  run = json.loads((out / "run.json").read_text(encoding="utf-8"))
  assert run["server"] == server.base + "/v1" and run["model"] == "test-model"
  assert run["demonstrations"][0][0].startswith("dev:") and len(run["demonstrations"]) == 6
  assert run["usage"]["prompt_tokens"] > 6 * 20
  for path in out.iterdir():
    assert SECRET not in path.read_text(encoding="utf-8"), path
  assert SECRET not in first.stdout + first.stderr + again.stdout + again.stderr
  scored = mains.python_m(
      "mcwq_t5x.score",
      "--predictions",
      str(out / "predictions.txt"),
      "--targets",
      str(out / "targets.txt"),
      timeout=120)
  exact = sum(p == g.rir for p, g in zip(predictions, gold))
  assert json.loads(scored.stdout)["exact_match"] == pytest.approx(100.0 * exact / 6)


def test_errors_are_retried_or_named(tmp_path):
  sleeps = []
  script = [(429, {
      "Retry-After": "7"
  }, {
      "error": {
          "message": "slow down"
      }
  }), (500, {}, {
      "error": {
          "message": "boom"
      }
  })]
  with local_http.serve(local_http.ChatCompletions, seen=[], script=script) as server:
    chat = client_lib.ChatClient(
        server.base + "/v1",
        "m",
        "k", {"temperature": 0.0},
        tmp_path / "c.jsonl",
        sleep=sleeps.append,
        backoff_s=1.0)
    answer = chat.complete("Question: q\nSPARQL: ASK WHERE { M0 wdt:P57 M1 }\n")
    assert answer["text"] == "```sparql\nASK WHERE { M0 wdt:P57 M1 }\n```"
    assert sleeps == [7.0, 2.0] and server.requests == 3 and chat.retries == 2
    server.script.append((400, {}, {
        "error": {
            "message": "This model's maximum context length "
                       "is 4096 tokens",
            "code": "context_length_exceeded"
        }
    }))
    refused = chat.complete("a long prompt")
    assert refused["text"] is None and "maximum context length" in refused["error"]
    assert chat.complete("a long prompt")["cached"]  # not sent again
    server.script.append((429, {"Retry-After": "9999"}, {"error": {"message": "quota"}}))
    with pytest.raises(client_lib.RequestFailed, match="9999"):
      chat.complete("another prompt")
    server.script.extend([(503, {}, {"error": {"message": "down"}})] * 2)
    with pytest.raises(client_lib.RequestFailed, match="after 2 attempts: HTTP 503"):
      client_lib.ChatClient(
          server.base + "/v1", "m", "k", {}, None, max_retries=1, sleep=sleeps.append).complete("p")
    server.script.append("hang")
    server.hang_s = 3.0
    before = server.requests
    with pytest.raises(client_lib.RequestFailed, match="time-out"):
      client_lib.ChatClient(
          server.base + "/v1", "m", "k", {}, None, timeout_s=0.5,
          sleep=sleeps.append).complete("p2")
    assert server.requests == before + 1  # a time-out is not retried


def test_the_chat_client_retries_and_paces_by_the_transports_policy(tmp_path):
  """One `transport.RetryPolicy` for every remote client: the chat client's arguments make the
  one a `transport.Transport` of the same arguments holds, and its waits are that policy's
  (backoff doubling to its cap)."""
  from mcwq_t5x.stores import transport  # pylint: disable=g-import-not-at-top
  sleeps = []
  settings = dict(max_retries=4, backoff_s=1.0, max_backoff_s=3.0, max_retry_after_s=60.0)
  script = [(500, {}, {"error": {"message": "boom"}})] * 4
  with local_http.serve(local_http.ChatCompletions, seen=[], script=script) as server:
    chat = client_lib.ChatClient(
        server.base + "/v1",
        "m",
        "k", {},
        None,
        min_interval_s=0.0,
        sleep=sleeps.append,
        **settings)
    assert chat.policy == transport.Transport(10.0, **settings).policy
    assert chat.complete("p")["text"] is not None
  assert sleeps == [chat.policy.backoff(n) for n in (1, 2, 3, 4)] == [1.0, 2.0, 3.0, 3.0]


def test_main_counts_no_query_and_context_length_and_resumes_after_a_stop(tmp_path):
  context = (400, {}, {"error": {"message": "maximum context length exceeded"}})
  script = ["noquery", context, (500, {}, {"error": {"message": "quota"}})]
  with local_http.serve(local_http.ChatCompletions, seen=[], script=script) as server:
    args = ("--base_url", server.base + "/v1", "--model", "m", "--shots", "2", "--selection",
            "cover", "--retries", "0", "--concurrency", "1")
    stopped = _prompt(tmp_path, *args, check=False)
    assert stopped.returncode == 1 and "Traceback" not in stopped.stderr
    assert stopped.stderr.splitlines()[-1] == (
        f"RequestFailed: stopped: 1 request(s) failed, 2 of 6 answered and cached in "
        f"{tmp_path / 'requests.jsonl'}, 3 not asked; rerun to resume")
    assert not (tmp_path / "predictions.txt").exists()  # whole or not at all
    assert server.requests == 3  # the first failure stopped the run
    _prompt(tmp_path, *args)
    assert server.requests == 3 + 4  # the no-query and context-length answers were cached
  run = json.loads((tmp_path / "run.json").read_text(encoding="utf-8"))
  predictions = (tmp_path / "predictions.txt").read_text(encoding="utf-8").split("\n")
  assert run["syntax_errors"] >= 2 and run["context_length_errors"] == 1
  assert run["no_query"] >= 2 and run["no_query"] + run["unparseable_queries"] == \
      run["syntax_errors"]
  assert predictions[0] == "" and predictions[1] == ""
  responses = [json.loads(l) for l in (tmp_path / "responses.jsonl").read_text().splitlines()]
  assert responses[0]["response"] == "I cannot answer that."
  assert responses[1]["error"].startswith("context_length")


def test_oracle_is_named_and_offline_baseline_needs_similar_1(tmp_path):
  bad = _prompt(tmp_path, "--model", "nearest_neighbour", "--shots", "8", check=False)
  assert bad.returncode == 2 and "--selection similar --shots 1" in bad.stderr
  probe = mains.run([
      sys.executable, "-c", "import sys, mcwq_t5x.prompt; "
      "print(sorted(m for m in ('jax', 'tensorflow', 'seqio') if m in sys.modules))"
  ])
  assert probe.stdout.strip() == "[]"


def test_report_discovers_a_prompting_run_as_its_own_system(tmp_path):
  from mcwq_t5x.evaluation.report import discovery  # pylint: disable=import-outside-toplevel
  run_dir = tmp_path / "llm_cover"
  run_dir.mkdir()
  (run_dir / "predictions_mcd1_he.txt").write_text("x\n", encoding="utf-8")
  (run_dir / "run.json").write_text(
      json.dumps({
          "kind": "prompting",
          "system": "ORACLE_m_8shot_oracle_compounds",
          "model": "m",
          "shots": 8,
          "demonstration_part": "dev"
      }))
  other = tmp_path / "mt5_small"
  other.mkdir()
  (other / "predictions_mcd1_he.txt").write_text("x\n", encoding="utf-8")
  found = discovery.discover(tmp_path)
  assert sorted(f.model for f in found) == ["ORACLE_m_8shot_oracle_compounds", "mt5_small"]
  assert {f.split for f in found} == {"mcd1"} and {f.language for f in found} == {"he"}
  # Table 4's training part and model size: the demonstrations' part and the served model.
  assert {(f.model, f.train_part, f.train_languages, f.size) for f in found
         } == {("ORACLE_m_8shot_oracle_compounds", "dev", "8-shot prompt", "m"),
               ("mt5_small", None, None, None)}


# ---- Answers of reasoning models and answers in prose ----


def test_read_answer_strips_reasoning_and_takes_the_last_well_formed_query():
  gold = readers.read_split("mcd1", "test", "he")[:3]
  q0, q1, q2 = (g.sparql for g in gold)
  cases = {
      # reasoning that mentions SELECT, then the answer after the closing tag
      f"<think>The question asks whether... maybe SELECT the films? No.</think>\n\n{q0}": q0,
      f"To ask Wikidata this question, use: {q0}": q0,  # "ask" in prose is no query
      # the opening tag was in the chat template: only the closing one is in the answer
      f"Okay, ASK about M1 first: {q1}. Hmm.</think>\n```sparql\n{q0}\n```": q0,
      # a draft, then the final query in a fence, then prose naming SELECT
      f"Draft: {q1}\nFinal:\n```\n{q2}\n```\nThe SELECT clause returns ?x0.": q2,
      f"<think>{q0}": None,  # ran out of tokens while reasoning: no answer yet
      q0.replace("WHERE {", "WHERE {", 1)[:-2]: None,  # truncated: no closing brace
  }
  for response, query in cases.items():
    answer = prompt_format.read_answer(response)
    assert answer.query == query, response
    assert answer.rir == (rir.sparql_to_rir(query) if query else ""), response
  lower = prompt_format.read_answer(q0.replace("ASK WHERE", "ask where"))
  assert lower.query is not None and lower.rir == ""  # a query the converter rejects: wrong
  assert prompt_format.to_rir(f"<think>x</think>{q1}") == gold[1].rir


def test_main_scores_reasoning_answers_and_counts_no_query_apart_from_wrong_ones(tmp_path):
  gold = readers.read_split("mcd1", "test", "he")[:6]
  q = [g.sparql for g in gold]
  answers = [
      local_http.completion("m", f"<think>Does M1 star... SELECT the actors?</think>\n\n{q[0]}"),
      local_http.completion("m", f"To ask Wikidata this question, use: {q[1]}"),
      local_http.completion("m", None, reasoning=f"It could be {q[2]} but", finish_reason="length"),
      local_http.completion("m", f"```sparql\n{q[3]}\n```", reasoning="Long thoughts. SELECT"),
      local_http.completion("m", q[4].replace("WHERE", "where")),
      local_http.completion("m", "I cannot answer that."),
  ]
  script = [(200, {}, a) for a in answers]
  with local_http.serve(local_http.ChatCompletions, seen=[], script=script) as server:
    done = _prompt(tmp_path, "--base_url", server.base + "/v1", "--model", "m", "--shots", "1",
                   "--selection", "similar", "--concurrency", "1")
  predictions = (tmp_path / "predictions.txt").read_text(encoding="utf-8").splitlines()
  assert predictions == [gold[0].rir, gold[1].rir, "", gold[3].rir, "", ""]
  run = json.loads((tmp_path / "run.json").read_text(encoding="utf-8"))
  assert (run["no_query"], run["unparseable_queries"], run["syntax_errors"]) == (2, 1, 3)
  assert run["truncated_answers"] == 1
  assert "exact match 50.00%, 2 without a query, 1 with a query the converter rejects, " \
      "1 cut at --max_tokens" in done.stdout
  rows = [json.loads(l) for l in (tmp_path / "responses.jsonl").read_text().splitlines()]
  assert rows[0]["response"].startswith("<think>")  # the raw answer is kept
  assert rows[0]["query"] == q[0] and rows[2]["query"] is None
  assert rows[2]["reasoning"] == f"It could be {q[2]} but" and rows[2]["finish_reason"] == "length"


# ---- The output folder ----


def test_prompt_refuses_a_training_runs_folder_and_changes_nothing(tmp_path):
  run_dir = tmp_path / "tiny_random_split_en"
  (run_dir / "checkpoint_4").mkdir(parents=True)
  (run_dir / "run.json").write_text('{"format": "mcwq_t5x", "step": 4}\n')
  (run_dir / "config.gin").write_text("TRAIN_STEPS = 4\n")
  before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
  refused = _prompt(
      run_dir,
      "--model",
      "nearest_neighbour",
      "--selection",
      "similar",
      "--shots",
      "1",
      check=False)
  assert refused.returncode == 2 and "Traceback" not in refused.stderr
  assert refused.stderr.splitlines()[-1].startswith(
      f"ValueError: --out {run_dir}: holds another tool's output, not a prompting run's "
      "(checkpoint_4/, config.gin)")
  assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
  # A run.json of another kind alone, or a stray file, is refused too; an earlier prompting run
  # (with a temporary file a kill left) is not.
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "run.json").write_text('{"kind": "export"}')
  with pytest.raises(ValueError, match="run.json of kind 'export'"):
    prompt_main.check_out_dir(tmp_path / "other")
  mine = tmp_path / "mine"
  mine.mkdir()
  for name in ("run.json", "requests.jsonl", "predictions_mcd1_he.txt", ".predictions.txt.x1"):
    (mine / name).write_text('{"kind": "prompting"}')
  prompt_main.check_out_dir(mine)
  (mine / "notes.txt").write_text("mine")
  with pytest.raises(ValueError, match=r"\(notes.txt\)"):
    prompt_main.check_out_dir(mine)


# ---- Malformed answers, the deadline, the run's stop, the key ----


def test_a_200_that_is_not_a_chat_completion_fails_and_is_asked_again(tmp_path):
  malformed = [
      (200, {}, {
          "object": "chat.completion"
      }),  # no choices
      (200, {}, b"<html><body>502 Bad Gateway</body></html>"),
      (200, {
          "Content-Type": "application/json"
      }, b'{"choices": [{"message": '),
      (200, {
          "Content-Type": "application/json"
      }, b'{"choices": [{"message": {"content": "\xff\xfe"}}]}'),
  ]
  with local_http.serve(local_http.ChatCompletions, seen=[], script=list(malformed)) as server:
    chat = client_lib.ChatClient(server.base + "/v1", "m", "k", {}, tmp_path / "c.jsonl")
    for _, _, body in malformed:
      with pytest.raises(client_lib.RequestFailed, match="HTTP 200 but") as e:
        chat.complete("Question: q\nSPARQL: ASK WHERE { M0 wdt:P57 M1 }")
      assert repr(body[:12] if isinstance(body, bytes) else "")[2:8] in str(e.value)
    assert not (tmp_path / "c.jsonl").exists()  # nothing cached
    assert chat.complete("Question: q\nSPARQL: ASK WHERE { M0 wdt:P57 M1 }")["text"]
    assert server.requests == 5
    out = tmp_path / "run"
    server.script.append(malformed[0])
    args = ("--base_url", server.base + "/v1", "--model", "m", "--shots", "1", "--selection",
            "similar", "--concurrency", "1")
    failed = _prompt(out, *args, check=False)
    assert failed.returncode == 1 and "Traceback" not in failed.stderr
    assert "RequestFailed: example 1: m: " in failed.stderr
    assert "HTTP 200 but no choices[0].message" in failed.stderr
    assert server.requests == 5 + 1  # the run stopped
    _prompt(out, *args)
    assert server.requests == 6 + 6  # example 1 was asked again
  run = json.loads((out / "run.json").read_text(encoding="utf-8"))
  assert run["no_query"] == 0 and run["cached_answers"] == 0


def test_timeout_is_a_deadline_on_each_request_against_a_trickling_server(local_server, tmp_path):
  body = json.dumps(local_http.completion("m", "ASK WHERE { M0 wdt:P57 M1 }")).encode()
  server = local_server(
      local_http.Trickle,
      phase="body-with-length",
      body=body,  # one byte every 0.1 s: about 30 s in all
      content_type="application/json",
      interval_s=0.1)
  start = time.monotonic()
  timed_out = _prompt(
      tmp_path,
      "--base_url",
      server.base + "/v1",
      "--model",
      "m",
      "--shots",
      "1",
      "--selection",
      "similar",
      "--timeout",
      "1",
      "--retries",
      "0",
      "--concurrency",
      "1",
      check=False)
  elapsed = time.monotonic() - start
  assert timed_out.returncode == 1 and "Traceback" not in timed_out.stderr
  assert "no complete answer within 1 s" in timed_out.stderr
  assert server.requests == 1 and elapsed < 20, elapsed  # not 30 s a request, 6 times
  assert server.disconnected.wait(2.0)  # the connection was dropped, not left trickling


def _echo_headers(status, message):
  """A scripted error answer whose message echoes the request's headers (some proxies do)."""
  return (status, {}, lambda headers: {"error": {"message": f"{message}; request: {headers}"}})


def test_a_long_retry_after_or_a_401_stops_the_run_and_no_file_holds_the_key(tmp_path):
  env = {"MCWQ_TEST_KEY": SECRET}
  quota = (429, {"Retry-After": "3600"}, {"error": {"message": "quota exceeded"}})
  script = [quota, _echo_headers(401, "Invalid API key")]
  with local_http.serve(local_http.ChatCompletions, seen=[], script=script) as server:
    args = ("--base_url", server.base + "/v1", "--model", "m", "--shots", "1", "--selection",
            "similar", "--api_key_env", "MCWQ_TEST_KEY", "--concurrency", "1")
    outs = []
    for expected in ("asks to wait 3600 s", "HTTP 401: Invalid API key"):
      outs.append(_prompt(tmp_path / "stopped", *args, env=env, check=False))
      assert outs[-1].returncode == 1 and "Traceback" not in outs[-1].stderr
      assert expected in outs[-1].stderr
    assert server.requests == 2  # one request each: the rest were never sent
    assert SECRET not in outs[1].stderr and "Bearer REDACTED" in outs[1].stderr
    # A context-length refusal echoing the key is cached and reported without it.
    server.script.append(_echo_headers(400, "maximum context length is 10 tokens"))
    outs.append(_prompt(tmp_path / "stopped", *args, env=env))
    assert server.requests == 2 + 6
  rows = [
      json.loads(l) for l in (tmp_path / "stopped" / "responses.jsonl").read_text().splitlines()
  ]
  assert "Bearer REDACTED" in rows[0]["error"]
  for path in (tmp_path / "stopped").iterdir():
    assert SECRET not in path.read_text(encoding="utf-8"), path
  assert not any(SECRET in o.stdout + o.stderr for o in outs)


def test_a_malformed_data_file_is_one_line_naming_file_and_line(tmp_path):
  folder = tmp_path / "data" / "official" / "mcd1"
  folder.mkdir(parents=True)
  source = mains.REPO.parent / "shared" / "mcwq" / "official" / "mcd1"
  for part in ("dev", "test"):
    lines = (source / f"{part}.he.txt").read_text(encoding="utf-8").splitlines()[:5]
    if part == "test":
      lines[2] = lines[2].replace(" OUT: ", " ")  # no `OUT:`
      lines_of_test = lines
    (folder / f"{part}.he.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
  bad = _prompt(
      tmp_path / "out",
      "--model",
      "nearest_neighbour",
      "--selection",
      "similar",
      "--shots",
      "1",
      "--data_dir",
      str(tmp_path / "data"),
      check=False)
  assert bad.returncode == 1 and "Traceback" not in bad.stderr
  assert bad.stderr.strip().splitlines() == [
      f"DataFormatError: {folder / 'test.he.txt'}:3: expected `IN: <question>  OUT: <SPARQL>`, "
      f"found no `OUT:` separator: {lines_of_test[2][:80]!r}"
  ]


def test_a_bad_timeout_or_retry_count_is_one_line(tmp_path, capsys):
  for flag, value in (("--timeout", "0"), ("--retries", "-1")):
    code = prompt_main.main([
        *TASK, "--out",
        str(tmp_path), "--base_url", "http://127.0.0.1:9/v1", "--model", "m", flag, value
    ])
    assert code == 2 and capsys.readouterr().err.strip() == (
        f"ValueError: {flag} must be positive (at least 0 for --retries)")
  assert not any(tmp_path.iterdir())  # nothing written
