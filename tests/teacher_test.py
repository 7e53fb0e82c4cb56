"""Tests for seed_jax.teacher against a local OpenAI-compatible stub server."""

import contextlib
import http.server
import json
import re
import socket
import threading
import time

import pytest

from seed_jax import skills
from seed_jax import teacher as teacher_lib
from seed_jax.episodes import Episode, Step
from seed_jax.teacher import OpenAITeacher, TeacherRejectedError
from seed_jax.teacher import TeacherUnavailableError

_GOOD = {"episode_summary": "Took the mug.", "episode_skill": "Look first."}


class _Stub:
  """Scripted chat-completions server state, keyed by words in the prompt.

  "FAIL<n>": the first n requests with that prompt answer 500.
  "CODE<nnn>": the first request with that prompt answers HTTP nnn.
  "GARBAGE": the reply content is not JSON.
  "BADBODY": the HTTP body is not JSON (every time).
  "DENY": answers 401.
  "REJECT": answers 400 (a request the endpoint refuses).
  "MOVED": answers 301 to another host.
  "SAYS<nnn>": answers HTTP nnn with the body in `says` (every time).
  "CUT": the reply is cut short, finish_reason "length" (at max_tokens).
  "SLOW": waits until two requests have been in flight at once (at most
    1 s), then 50 ms more (to observe concurrency on a loaded machine too).
  Otherwise: a fenced JSON analysis.
  """

  def __init__(self):
    self.lock = threading.Lock()
    self.seen: dict[str, int] = {}
    self.requests: list[dict] = []
    self.in_flight = self.max_in_flight = 0
    self.says: dict | bytes = b""


def _handler(stub):

  class Handler(http.server.BaseHTTPRequestHandler):

    def log_message(self, *args):  # keep test output quiet
      pass

    def _send(self, code, body):
      data = body if isinstance(body, bytes) else json.dumps(body).encode()
      self.send_response(code)
      if 300 <= code < 400:
        self.send_header("Location", "http://127.0.0.1:1/v1/chat/completions")
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(data)))
      self.end_headers()
      self.wfile.write(data)

    def do_POST(self):
      body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
      prompt = body["messages"][0]["content"]
      with stub.lock:
        stub.requests.append({"path": self.path, "body": body,
                              "auth": self.headers.get("Authorization")})
        n = stub.seen[prompt] = stub.seen.get(prompt, 0) + 1
        stub.in_flight += 1
        stub.max_in_flight = max(stub.max_in_flight, stub.in_flight)
      try:
        code, reply = self._reply(prompt, n)
      finally:
        # Out of flight before the reply is written: once the client has
        # read it, it may send its next request before this thread runs on.
        with stub.lock:
          stub.in_flight -= 1
      self._send(code, reply)

    def _reply(self, prompt, n):
      if "SLOW" in prompt:
        deadline = time.monotonic() + 1.0
        while stub.max_in_flight < 2 and time.monotonic() < deadline:
          time.sleep(0.005)
        time.sleep(0.05)
      if self.path != "/v1/chat/completions":
        return 404, {"error": "not found"}
      for k in range(1, 4):
        if f"FAIL{k}" in prompt and n <= k:
          return 500, {"error": "boom"}
      says = re.search(r"SAYS(\d{3})", prompt)
      if says:
        return int(says.group(1)), stub.says
      code = re.search(r"CODE(\d{3})", prompt)
      if code and n == 1:
        return int(code.group(1)), {"error": "scripted"}
      if "DENY" in prompt:
        return 401, {"error": "bad key"}
      if "REJECT" in prompt:
        return 400, {"error": "context length exceeded"}
      if "MOVED" in prompt:
        return 301, {"error": "moved"}
      if "BADBODY" in prompt:
        return 200, b"<html>oops</html>"
      content = ("I am not sure what happened." if "GARBAGE" in prompt
                 else "Sure:\n```json\n" + json.dumps(_GOOD) + "\n```")
      finish = "stop"
      if "CUT" in prompt:
        content, finish = content[:30], "length"
      return 200, {"choices": [{"message": {
          "role": "assistant", "content": content}, "finish_reason": finish}]}

  return Handler


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
  # urllib honours proxy variables; the stub server is local.
  for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY",
               "all_proxy", "ALL_PROXY"):
    monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server():
  stub = _Stub()
  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(stub))
  httpd.daemon_threads = True
  thread = threading.Thread(target=httpd.serve_forever, args=(0.01,),
                            daemon=True)
  thread.start()
  stub.base_url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
  try:
    yield stub
  finally:
    httpd.shutdown()
    httpd.server_close()


class _Sleeps(list):

  def __call__(self, seconds):
    self.append(seconds)


def _teacher(base_url, **kw):
  kw.setdefault("sleep", _Sleeps())
  kw.setdefault("timeout", 5.0)
  return OpenAITeacher(base_url, "stub-model", "sk-test", **kw)


def _episode(task, n=2):
  steps = [Step(f"obs {i}", "", f"<action>a{i}</action>", f"a{i}", True)
           for i in range(1, n + 1)]
  return Episode("household", task, "clean", 0, steps=steps, success=True)


def test_complete_sends_openai_request(server):
  teacher = _teacher(server.base_url + "/", max_tokens=64)
  assert "Look first." in teacher.complete("hello")
  (req,) = server.requests
  assert req["path"] == "/v1/chat/completions"
  assert req["auth"] == "Bearer sk-test"
  assert req["body"] == {
      "model": "stub-model", "temperature": 0.0, "max_tokens": 64,
      "messages": [{"role": "user", "content": "hello"}]}
  assert "sk-test" not in repr(teacher)


def test_retries_with_exponential_backoff(server):
  teacher = _teacher(server.base_url, max_retries=3, backoff=0.5)
  assert "Look first." in teacher.complete("FAIL3 please")
  assert teacher._sleep == [0.5, 1.0, 2.0]
  assert teacher.requests == 4


def test_retries_exhausted_names_url(server):
  teacher = _teacher(server.base_url, max_retries=1)
  with pytest.raises(TeacherUnavailableError) as info:
    teacher.complete("FAIL3 please")
  err = info.value
  assert (err.attempts, err.status) == (2, 500)
  assert server.base_url + "/chat/completions" in str(err)
  assert "HTTP 500" in str(err)


def test_client_errors_are_not_retried(server):
  teacher = _teacher(server.base_url, max_retries=3)
  with pytest.raises(TeacherUnavailableError, match="HTTP 401") as info:
    teacher.complete("DENY")
  assert (info.value.attempts, teacher._sleep) == (1, [])
  with pytest.raises(TeacherUnavailableError, match="HTTP 404"):
    OpenAITeacher(server.base_url + "/nope", "m", sleep=_Sleeps()).complete("x")


def test_transient_5xx_are_retried_but_not_501_or_505(server):
  teacher = _teacher(server.base_url, max_retries=1)
  for code in (500, 502, 520, 524, 529):  # 52x, 529: proxies, overload
    assert "Look first." in teacher.complete(f"CODE{code}")
  assert teacher.requests == 10 and teacher._sleep == [1.0] * 5
  for code in (501, 505):  # the server would answer the same again
    with pytest.raises(TeacherUnavailableError, match=f"HTTP {code}") as info:
      teacher.complete(f"CODE{code}")
    assert (info.value.attempts, info.value.status) == (1, code)
  assert teacher.requests == 12


@pytest.mark.parametrize("code,error", [
    (404, TeacherUnavailableError), (401, TeacherUnavailableError),
    (400, TeacherRejectedError)])
def test_an_http_error_names_the_servers_message(server, code, error):
  server.says = {"error": {"message": f"The model `stub-model` does not "
                           f"exist ({code})", "type": "NotFoundError"}}
  teacher = _teacher(server.base_url, max_retries=2)
  with pytest.raises(error, match=rf"HTTP {code} [A-Za-z ]+: The model "
                     rf"`stub-model` does not exist \({code}\)$"):
    teacher.complete(f"SAYS{code}")
  assert teacher.requests == 1  # still not retried


def test_an_http_error_body_is_read_only_in_part(server):
  teacher = _teacher(server.base_url, max_retries=0)
  # vLLM's error shape; a long message is cut.
  server.says = {"object": "error", "message": "maximum context length is "
                 "4096 tokens " + "x" * 5000, "code": 400}
  with pytest.raises(TeacherRejectedError, match="HTTP 400 Bad Request: max"
                     r"imum context length is 4096 tokens x+\.\.\.$") as info:
    teacher.complete("SAYS400")
  assert len(info.value.reason) < 400
  # A JSON body cut by the read limit still gives its message.
  server.says = ('{"error": {"message": "context\\n too \\"long\\"", '
                 '"pad": "' + "p" * 5000 + '"}}').encode()
  with pytest.raises(TeacherRejectedError, match=r'context too "long"$'):
    teacher.complete("SAYS400")
  # Not JSON: the start of the text, on one line.
  server.says = b"<html>\n<h1>502  Bad\tGateway</h1>" + b" " * 100_000
  with pytest.raises(TeacherUnavailableError,
                     match=r"HTTP 502 Bad Gateway: <html> <h1>502 Bad "
                     r"Gateway</h1>$"):
    teacher.complete("SAYS502")
  server.says = b""  # nothing said: the status alone
  with pytest.raises(TeacherUnavailableError, match=r"HTTP 503 Service "
                     r"Unavailable$"):
    teacher.complete("SAYS503")


def test_a_200_with_an_error_body_names_its_message(server):
  server.says = {"error": {"message": "rate limited by upstream provider",
                           "code": 429}}
  teacher = _teacher(server.base_url, max_retries=1)
  with pytest.raises(TeacherUnavailableError, match="after 2 attempts: HTTP "
                     "200 with an error body: rate limited by upstream "
                     "provider$"):
    teacher.complete("SAYS200")


def test_malformed_body_is_retried_then_fails(server):
  teacher = _teacher(server.base_url, max_retries=2, backoff=1.0)
  with pytest.raises(TeacherUnavailableError, match="malformed response"):
    teacher.complete("BADBODY")
  assert teacher._sleep == [1.0, 2.0]


def _closed_port():
  with contextlib.closing(socket.socket()) as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_down_endpoint_fails_clearly_after_retries():
  url = f"http://127.0.0.1:{_closed_port()}/v1"
  sleeps = _Sleeps()
  teacher = OpenAITeacher(url, "m", sleep=sleeps, max_retries=4, backoff=2.0,
                          max_backoff=5.0, timeout=2.0)
  start = time.monotonic()
  with pytest.raises(TeacherUnavailableError) as info:
    teacher.annotate(_episode("put a mug in sink"))
  assert time.monotonic() - start < 5.0
  assert sleeps == [2.0, 4.0, 5.0, 5.0]
  err = info.value
  assert err.attempts == 5 and err.status is None
  assert str(err).startswith(
      f"teacher endpoint {url}/chat/completions unavailable after 5 attempts")
  assert teacher.stats.parsed + teacher.stats.failed == 0


def test_config_from_environment(monkeypatch, server):
  monkeypatch.setenv(teacher_lib.ENV_BASE_URL, server.base_url)
  monkeypatch.setenv(teacher_lib.ENV_MODEL, "env-model")
  monkeypatch.setenv(teacher_lib.ENV_API_KEY, "sk-env")
  teacher = OpenAITeacher(sleep=_Sleeps())
  teacher.complete("hi")
  assert server.requests[-1]["body"]["model"] == "env-model"
  assert server.requests[-1]["auth"] == "Bearer sk-env"
  OpenAITeacher(api_key="", sleep=_Sleeps()).complete("hi")
  assert server.requests[-1]["auth"] is None


def test_missing_config_is_a_clear_error(monkeypatch):
  for name in (teacher_lib.ENV_BASE_URL, teacher_lib.ENV_MODEL):
    monkeypatch.delenv(name, raising=False)
  with pytest.raises(ValueError, match="SEED_TEACHER_BASE_URL"):
    OpenAITeacher(model="m")
  with pytest.raises(ValueError, match="SEED_TEACHER_MODEL"):
    OpenAITeacher("http://127.0.0.1:1/v1")
  with pytest.raises(ValueError):
    OpenAITeacher("http://127.0.0.1:1/v1", "m", max_concurrency=0)


@pytest.mark.parametrize("setting", [
    dict(timeout=0), dict(backoff=-1), dict(max_backoff=-5),
    dict(max_tokens=0), dict(max_prompt_chars=0),
    dict(mode="episode_step", max_critical_steps=0)])
def test_settings_out_of_range_are_refused_up_front(setting):
  name = next(k for k in setting if k != "mode")
  with pytest.raises(ValueError, match=f"need {name} "):
    OpenAITeacher("http://127.0.0.1:1/v1", "m", **setting)


@pytest.mark.parametrize("temperature", [
    float("nan"), float("inf"), -0.5, "0.7", None, True])
def test_a_bad_temperature_is_refused_up_front(temperature):
  # NaN and infinity would be sent as invalid JSON, a negative one would have
  # every prompt rejected (HTTP 400) and counted as unparsed.
  with pytest.raises(ValueError, match=r"teacher temperature .*: need a "
                     "finite number >= 0"):
    OpenAITeacher("http://127.0.0.1:1/v1", "m", temperature=temperature)
  for ok in (0, 0.0, 1.3):
    assert OpenAITeacher("http://127.0.0.1:1/v1", "m",
                         temperature=ok).temperature == ok


def test_a_redirect_is_not_followed(server):
  t = _teacher(server.base_url)
  with pytest.raises(TeacherUnavailableError,
                     match="redirects to 'http://127.0.0.1:1/v1/chat"):
    t.complete("MOVED")
  assert len(server.requests) == 1  # not retried, not sent on


@pytest.mark.parametrize("url", [
    "127.0.0.1:8000/v1", "ftp://127.0.0.1/v1", "http:///v1",
    "http://127.0.0.1:99999/v1", "http://127.0.0.1:abc/v1",
    "http://127.0.0.1:0/v1", "http://127.0.0.1:8000/v1?key=1",
    "http://127.0.0.1:8000/v1#frag", "http://127.0.0.1:8000/v1/mod\u00e8le",
    "http://127.0.0.1:8000/v1 x", "http://127.0.0.1:8000/v1\n",
    "http://h\u00f4te.example/v1"])
def test_bad_base_url_is_a_clear_error(url):
  with pytest.raises(ValueError, match=re.escape(f"base URL {url!r}")):
    OpenAITeacher(url, "m")


def test_a_base_url_a_request_cannot_carry_names_the_character():
  # Once accepted, these failed on the first request: a UnicodeEncodeError,
  # or an InvalidURL retried as if the endpoint were down.
  with pytest.raises(ValueError, match="has '\u00e8', which a URL cannot "
                     "carry.*percent-encode"):
    OpenAITeacher("http://127.0.0.1:1/v1/mod\u00e8le", "m")
  with pytest.raises(ValueError, match="has ' ', which a URL cannot carry"):
    OpenAITeacher("http://127.0.0.1:1/v1 x", "m")
  OpenAITeacher("http://127.0.0.1:1/v1/mod%C3%A8le", "m")  # encoded: fine


def test_api_key_a_header_cannot_carry_is_a_clear_error(monkeypatch):
  for key in ("sk-\u20ac", "sk-test\n"):
    with pytest.raises(ValueError, match="cannot carry") as info:
      OpenAITeacher("http://127.0.0.1:1/v1", "m", key)
    assert key not in str(info.value)  # the key is not shown
  monkeypatch.setenv(teacher_lib.ENV_API_KEY, "sk-\u2026")
  with pytest.raises(ValueError, match=teacher_lib.ENV_API_KEY):
    OpenAITeacher("http://127.0.0.1:1/v1", "m")
  # Accepted: IPv6, https, an empty port, a latin-1 key.
  OpenAITeacher("https://[::1]:8443/v1", "m", "sk-\xe9")
  OpenAITeacher("http://example.com:/v1", "m", "")


def _why(annotation):
  """An annotation as is, or a failure's reason."""
  if isinstance(annotation, skills.ParseError):
    return annotation.reason
  return annotation


def test_annotate_parses_and_counts_failures(server):
  teacher = _teacher(server.base_url)
  assert teacher.annotate(_episode("put a mug in sink")) == _GOOD
  failed = teacher.annotate(_episode("GARBAGE task"))
  assert isinstance(failed, skills.ParseError) and failed.reason == "no_json"
  assert teacher.stats.as_dict() == {"parsed": 1, "failed": 1,
                                     "parse_rate": 0.5, "failed/no_json": 1}
  prompt = server.requests[0]["body"]["messages"][0]["content"]
  assert prompt.startswith(
      "Analyze the following agent episode and return ONLY valid JSON.")
  assert "Task: put a mug in sink\nepisode_success: success" in prompt


def test_a_reply_cut_at_max_tokens_is_counted_truncated(server):
  """A reply the endpoint cut at max_tokens (finish_reason "length") fails
  as "truncated" (the budget is too small), not as a malformed reply."""
  teacher = _teacher(server.base_url, max_tokens=8)
  got = teacher.annotate_many([_episode("a")], ["CUT a"])
  assert [_why(g) for g in got] == ["truncated"]
  assert _why(teacher.annotate(_episode("CUT b"))) == "truncated"
  assert teacher.stats.as_dict() == {"parsed": 0, "failed": 2,
                                     "parse_rate": 0.0, "failed/truncated": 2}
  assert teacher.complete("CUT").truncated
  assert not teacher.complete("whole").truncated


def test_annotate_many_keeps_order_and_limits_concurrency(server):
  teacher = _teacher(server.base_url, max_concurrency=2, max_prompt_chars=10)
  tasks = ["SLOW a", "SLOW GARBAGE b", "SLOW FAIL1 c", "SLOW d", "SLOW e",
           "SLOW GARBAGE f"]
  got = teacher.annotate_many([_episode(t, n=3) for t in tasks])
  assert [_why(g) for g in got] == [_GOOD, "no_json", _GOOD, _GOOD, _GOOD,
                                    "no_json"]
  assert server.max_in_flight == 2
  assert (teacher.stats.parsed, teacher.stats.failed) == (4, 2)
  assert teacher.steps_cut == 12  # the budget cut 2 of 3 steps per prompt
  assert teacher.requests == 7  # one retry


def test_a_rejected_request_fails_only_its_episode(server):
  teacher = _teacher(server.base_url, max_retries=3, max_concurrency=2)
  got = teacher.annotate_many([_episode(t) for t in ("a", "REJECT b", "c")])
  assert [_why(g) for g in got] == [_GOOD, "rejected", _GOOD]
  assert teacher.rejected == 1 and teacher.requests == 3  # not retried
  assert teacher.stats.as_dict()["failed/rejected"] == 1
  assert "context length exceeded" in got[1].detail  # the server's word
  assert _why(teacher.annotate(_episode("REJECT d"))) == "rejected"
  assert teacher.rejected == 2 and teacher._sleep == []
  with pytest.raises(TeacherRejectedError, match="HTTP 400"):
    teacher.complete("REJECT e")


def test_annotate_many_sends_the_given_prompts(server):
  teacher = _teacher(server.base_url)
  eps = [_episode("a"), _episode("b")]
  assert teacher.annotate_many(eps, ["first prompt", "second"]) == [_GOOD] * 2
  sent = sorted(r["body"]["messages"][0]["content"] for r in server.requests)
  assert sent == ["first prompt", "second"]
  with pytest.raises(ValueError, match="1 prompts for 2 episodes"):
    teacher.annotate_many(eps, ["one"])


def test_complete_many_empty():
  teacher = OpenAITeacher("http://127.0.0.1:1/v1", "m")
  assert teacher.complete_many([]) == []


def _down_after_two(server, second):
  """`(teacher, error)` after annotating "a", `second`, then two requests
  the endpoint fails (the fourth may start or not) with one retry."""
  teacher = _teacher(server.base_url, max_concurrency=1, max_retries=1)
  tasks = ["a", second, "FAIL3 c", "FAIL3 d"]
  with pytest.raises(TeacherUnavailableError) as info:
    teacher.annotate_many([_episode(t) for t in tasks])
  assert info.value.completed == [True, True, False, False]
  return teacher, info.value


def test_annotate_many_returns_partial_results_when_endpoint_fails(server):
  teacher, err = _down_after_two(server, "GARBAGE b")
  assert [_why(p) for p in err.partial] == [_GOOD, "no_json", None, None]
  assert (err.status, err.attempts) == (500, 2)
  assert teacher.stats.as_dict()["parsed"] == 1


def test_a_request_refused_before_an_outage_is_completed_as_rejected(server):
  """A refusal was a gap in `.partial` (None, `.completed` False): counted
  as never answered, and not in `stats`, though `rejected` counted it."""
  teacher, err = _down_after_two(server, "REJECT b")
  assert [_why(p) for p in err.partial] == [_GOOD, "rejected", None, None]
  assert "context length exceeded" in err.partial[1].detail
  assert teacher.rejected == 1
  assert teacher.stats.as_dict() == {"parsed": 1, "failed": 1,
                                     "parse_rate": 0.5, "failed/rejected": 1}


def test_episode_step_mode_returns_step_skills(server, monkeypatch):
  reply = ('{"episode_summary": "s", "episode_skill": "k", "step_skills": '
           '{"step 2": "two", "9": "out of range", "1": "one", "3": "three"}}')
  teacher = _teacher(server.base_url, mode="episode_step",
                     max_critical_steps=2)
  monkeypatch.setattr(teacher, "complete", lambda prompt: reply)
  assert teacher.annotate(_episode("x", n=3)) == {
      "episode_summary": "s", "episode_skill": "k",
      "step_skills": {"2": "two", "1": "one"}}
