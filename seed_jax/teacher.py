"""External analyzer: an OpenAI-compatible chat-completions client (stdlib).

Writes `{"episode_summary", "episode_skill"}` per episode for Stage 1
(docs/algorithm.md §2) or as the external-analyzer variant (§7), from the
analysis prompt the policy sees (skills.build_analysis_prompt).
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import logging
import math
import numbers
import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Sequence

from seed_jax import skills
from seed_jax.episodes import Episode

ENV_BASE_URL = "SEED_TEACHER_BASE_URL"
ENV_MODEL = "SEED_TEACHER_MODEL"
ENV_API_KEY = "SEED_TEACHER_API_KEY"
# Retried too: every 5xx but these two, which the server would answer again
# (it lacks the method or the HTTP version).
_RETRY_STATUS = frozenset({408, 409, 425, 429})
_PERMANENT_5XX = frozenset({501, 505})
# The endpoint refuses this one request (too long, malformed): the prompt
# gets no reply and the others go on.
_REJECT_STATUS = frozenset({400, 413, 422})
# An HTTP error body is read this far for the server's message ("The model
# `m` does not exist", "maximum context length is 4096 tokens").
_ERROR_BODY_BYTES = 512
_MESSAGE_CHARS = 300


def _retryable(status: int) -> bool:
  return status in _RETRY_STATUS or (
      500 <= status < 600 and status not in _PERMANENT_5XX)


def _check_base_url(base_url: str) -> None:
  """Raises ValueError unless `base_url` is http(s)://host[:port][/path]."""
  # urllib sends the URL as it is: a non-ASCII character fails in the
  # request line's encoding, whitespace splits it.
  bad = [c for c in base_url if not " " < c <= "~"]
  if bad:
    raise ValueError(f"bad teacher base URL {base_url!r}: it has "
                     f"{bad[0]!r}, which a URL cannot carry as it is "
                     "(whitespace or beyond ASCII); percent-encode it in the "
                     "path, give a host in its xn-- (punycode) form")
  parts = urllib.parse.urlsplit(base_url)
  try:
    port_ok = parts.port != 0  # None when not given
  except ValueError:  # not a number, or out of range
    port_ok = False
  if (parts.scheme not in ("http", "https") or not parts.hostname
      or not port_ok or parts.query or parts.fragment):
    raise ValueError(f"bad teacher base URL {base_url!r}: need http:// or "
                     "https://, a host, if given a port in 1-65535, and no "
                     "?query or #fragment (e.g. 'http://127.0.0.1:8000/v1')")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
  """Refuses redirects: urllib would repeat a redirected POST as a GET
  without its body, and send the API key to the host the redirect names."""

  def redirect_request(self, req, fp, code, msg, headers, newurl):
    return None  # urllib then raises the 3xx as an HTTPError


_OPENER = urllib.request.build_opener(_NoRedirect())


class TeacherUnavailableError(RuntimeError):
  """The endpoint could not be reached or kept failing.

  Attributes:
    url: the chat-completions URL.
    attempts: requests made for the failing prompt.
    status: the last HTTP status, or None for a connection-level failure.
    partial: from the *_many methods, one entry per input: its result where
      a reply arrived before the failure, else None; None from the others.
    completed: from the *_many methods, per input, whether a reply arrived
      (tells an unparsed annotation from a missing one); else None.
  """

  def __init__(self, url: str, attempts: int, reason: str,
               status: int | None = None, partial: list[Any] | None = None,
               completed: list[bool] | None = None):
    super().__init__(f"teacher endpoint {url} unavailable after {attempts} "
                     f"attempt{'s' if attempts != 1 else ''}: {reason}")
    self.url, self.attempts, self.reason = url, attempts, reason
    self.status, self.partial, self.completed = status, partial, completed

  def with_partial(self, partial: list[Any],
                   completed: list[bool]) -> TeacherUnavailableError:
    return TeacherUnavailableError(self.url, self.attempts, self.reason,
                                   self.status, partial, completed)


class TeacherRejectedError(RuntimeError):
  """The endpoint refused one request (HTTP 400, 413 or 422, e.g. a prompt
  over its context); not retried. `complete_many` gives that prompt None,
  the annotate methods a ParseError "rejected", and they go on."""

  def __init__(self, url: str, reason: str, status: int):
    super().__init__(f"teacher endpoint {url} rejected a request: {reason}")
    self.url, self.reason, self.status = url, reason, status


class _Retryable(Exception):

  def __init__(self, reason: str, status: int | None = None,
               retry_after: float | None = None):
    super().__init__(reason)
    self.reason, self.status, self.retry_after = reason, status, retry_after


def _clean(text: str) -> str:
  """`text` on one line (whitespace runs as one space), cut to
  `_MESSAGE_CHARS`."""
  text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
  return text if len(text) <= _MESSAGE_CHARS else (
      text[:_MESSAGE_CHARS] + "...")


def _error_message(data: Any) -> str | None:
  """The message of an OpenAI-style error body, e.g. {"error": {"message":
  ...}}, {"error": "..."}, or vLLM's and FastAPI's {"message"|"detail": ...};
  None when `data` carries none."""
  if not isinstance(data, dict):
    return None
  error = data.get("error")
  if isinstance(error, dict):
    error = error.get("message") or error.get("type") or error.get("code")
  for value in (error, data.get("message"), data.get("detail")):
    if isinstance(value, str) and value.strip():
      return _clean(value)
  return None


def _error_body(e: urllib.error.HTTPError) -> str:
  """What the server said with an HTTP error: the message of a JSON error
  body, else the body's start; "" when it sent nothing readable. Reads at
  most `_ERROR_BODY_BYTES`."""
  try:
    raw = e.read(_ERROR_BODY_BYTES) if e.fp is not None else b""
  except (OSError, http.client.HTTPException, ValueError):
    return ""
  text = (raw or b"").decode("utf-8", errors="replace")
  try:
    message = _error_message(json.loads(text))
  except ValueError:  # not JSON, or cut short by the limit
    message = None
    found = re.search(r'"message"\s*:\s*"((?:[^"\\]|\\.)*)', text)
    if found:  # the string's escapes undone, unless it is cut in one
      try:
        message = _clean(json.loads(f'"{found.group(1)}"'))
      except ValueError:
        message = _clean(found.group(1))
  return message if message is not None else _clean(text)


class Completion(str):
  """A reply's text; `truncated`: the endpoint cut it at `max_tokens`
  (finish_reason "length")."""
  truncated = False


def _content(body: bytes) -> Completion:
  """The first choice's message text of a chat-completions response.

  Raises:
    _Retryable: the body is an error object (some proxies answer HTTP 200
      with {"error": {...}}), naming its message.
  """
  data = json.loads(body.decode("utf-8", errors="replace"))
  if isinstance(data, dict) and "choices" not in data:
    message = _error_message(data)
    if message is not None:
      raise _Retryable(f"HTTP 200 with an error body: {message}", 200)
  choice = data["choices"][0]
  content = choice["message"].get("content")
  if isinstance(content, list):  # content parts
    content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
  text = Completion(content if isinstance(content, str) else "")
  text.truncated = choice.get("finish_reason") == "length"
  return text


def _retry_after(headers: Any) -> float | None:
  try:
    return float(headers.get("Retry-After"))
  except (TypeError, ValueError, AttributeError):
    return None


class OpenAITeacher:
  """OpenAI-compatible chat-completions teacher with retries and a
  concurrency limit.

  Example:
    teacher = OpenAITeacher("http://127.0.0.1:8000/v1", "qwen2.5-72b")
    teacher.annotate(episode)
    -> {"episode_summary": "...", "episode_skill": "..."} (None: unparsed)
  """

  def __init__(self, base_url: str | None = None, model: str | None = None,
               api_key: str | None = None, *, timeout: float = 60.0,
               max_retries: int = 3, backoff: float = 1.0,
               max_backoff: float = 30.0, max_concurrency: int = 4,
               temperature: float = 0.0, max_tokens: int = 512,
               mode: str = "episode_only", max_critical_steps: int = 3,
               max_prompt_chars: int | None = None,
               sleep: Callable[[float], None] = time.sleep):
    """Configures the client; nothing is sent.

    Args:
      base_url: API root such as "http://host:8000/v1"; default from
        $SEED_TEACHER_BASE_URL. Requests go to `<base_url>/chat/completions`.
      model: model name; default from $SEED_TEACHER_MODEL.
      api_key: bearer token; default from $SEED_TEACHER_API_KEY; none sent
        when empty (local servers).
      timeout: seconds a request may wait on the socket (to connect, and for
        each read); not a deadline for the whole reply.
      max_retries: retries after the first attempt, on connection errors,
        timeouts, malformed bodies, HTTP 408/409/425/429 and every 5xx but
        501 and 505.
      backoff: first retry delay in seconds; doubles per retry.
      max_backoff: cap on one delay (also on a server's Retry-After).
      max_concurrency: most requests in flight at once from this client.
      temperature: sampling temperature sent with each request: a finite
        number >= 0 (NaN or infinity is no JSON number, and a negative one
        would have every request rejected).
      max_tokens: reply length limit sent with each request.
      mode: analysis prompt mode ("episode_only" or "episode_step").
      max_critical_steps: K for "episode_step".
      max_prompt_chars: length budget of the analysis prompt.
      sleep: the delay function (injected in tests).

    Raises:
      ValueError: when no base URL or model is given or set, the base URL is
        not http(s)://host[:port][/path], the API key has a character an HTTP
        header cannot carry (beyond latin-1, or a control character), the
        temperature is not a finite number >= 0, or a limit is out of range.
    """
    base_url = base_url or os.environ.get(ENV_BASE_URL, "")
    model = model or os.environ.get(ENV_MODEL, "")
    if not base_url:
      raise ValueError(f"no teacher base URL: pass base_url or set "
                       f"{ENV_BASE_URL}")
    if not model:
      raise ValueError(f"no teacher model: pass model or set {ENV_MODEL}")
    _check_base_url(base_url)
    api_key = api_key if api_key is not None else os.environ.get(
        ENV_API_KEY, "")
    # Not latin-1 or a control character (a newline read from a key file):
    # the header could not be sent. Only the character is shown, not the key.
    bad = [c for c in api_key if ord(c) > 255 or not c.isprintable()]
    if bad:
      raise ValueError(f"the teacher API key (api_key or {ENV_API_KEY}) has "
                       f"a character an HTTP header cannot carry: {bad[0]!r}")
    limits = {"max_retries >= 0": max_retries >= 0,
              "max_concurrency >= 1": max_concurrency >= 1,
              "timeout > 0": timeout > 0, "backoff >= 0": backoff >= 0,
              "max_backoff >= 0": max_backoff >= 0,
              "max_tokens >= 1": max_tokens >= 1,
              "max_critical_steps >= 1": max_critical_steps >= 1,
              "max_prompt_chars >= 1 or None": (max_prompt_chars is None
                                                or max_prompt_chars >= 1)}
    if (isinstance(temperature, bool)
        or not isinstance(temperature, numbers.Real)
        or not math.isfinite(temperature) or temperature < 0):
      raise ValueError(f"teacher temperature {temperature!r}: need a finite "
                       "number >= 0 (e.g. 0.0 for greedy replies)")
    broken = [name for name, ok in limits.items() if not ok]
    if broken:
      raise ValueError(f"teacher settings out of range: need "
                       f"{', '.join(broken)}")
    if mode not in skills.MODES:
      raise ValueError(f"unknown analysis mode {mode!r}")
    self.url = base_url.rstrip("/") + "/chat/completions"
    self.model = model
    self._api_key = api_key
    self.timeout, self.max_retries = timeout, max_retries
    self.backoff, self.max_backoff = backoff, max_backoff
    self.max_concurrency = max_concurrency
    self.temperature, self.max_tokens = temperature, max_tokens
    self.mode, self.max_critical_steps = mode, max_critical_steps
    self.max_prompt_chars = max_prompt_chars
    self._sleep = sleep
    self._slots = threading.BoundedSemaphore(max_concurrency)
    self.stats = skills.ParseStats()
    self.requests = 0  # HTTP requests sent, retries included
    self.steps_cut = 0  # steps cut from analysis prompts by the budget
    self.rejected = 0  # prompts the endpoint refused (no reply)
    self.last_rejection = ""  # what the endpoint said when it last refused
    self._lock = threading.Lock()

  def __repr__(self) -> str:  # never shows the key
    return f"OpenAITeacher(url={self.url!r}, model={self.model!r})"

  def _post(self, prompt: str) -> Completion:
    payload = {"model": self.model, "temperature": self.temperature,
               "max_tokens": self.max_tokens,
               "messages": [{"role": "user", "content": prompt}]}
    headers = {"Content-Type": "application/json"}
    if self._api_key:
      headers["Authorization"] = f"Bearer {self._api_key}"
    request = urllib.request.Request(
        self.url, data=json.dumps(payload).encode("utf-8"), headers=headers,
        method="POST")
    with self._lock:
      self.requests += 1
    try:
      with _OPENER.open(request, timeout=self.timeout) as response:
        body = response.read()
    except urllib.error.HTTPError as e:
      reason = f"HTTP {e.code} {e.reason}"
      if 300 <= e.code < 400:
        raise TeacherUnavailableError(
            self.url, 1, f"{reason}: the endpoint redirects to "
            f"{e.headers.get('Location')!r}; use that as the base URL",
            e.code) from e
      said = _error_body(e)
      if said:
        reason = f"{reason}: {said}"
      if _retryable(e.code):
        raise _Retryable(reason, e.code, _retry_after(e.headers)) from e
      if e.code in _REJECT_STATUS:
        raise TeacherRejectedError(self.url, reason, e.code) from e
      raise TeacherUnavailableError(self.url, 1, reason, e.code) from e
    except (OSError, http.client.HTTPException) as e:  # refused, timeout, ...
      raise _Retryable(f"{type(e).__name__}: {getattr(e, 'reason', e)}") from e
    try:
      return _content(body)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
      raise _Retryable(f"malformed response body ({type(e).__name__})") from e

  def complete(self, prompt: str) -> Completion:
    """Sends one user message; returns the reply text ("" when none).

    Args:
      prompt: the user message.

    Returns:
      The first choice's message content, a str whose `.truncated` says
      that the endpoint cut it at `max_tokens`.

    Raises:
      TeacherUnavailableError: after `max_retries` retries of retryable
        failures, or at once on another HTTP error (e.g. 401, 404, 501).
      TeacherRejectedError: at once when the endpoint refuses this request
        (400, 413, 422).
    """
    attempt = 0
    while True:
      attempt += 1
      try:
        with self._slots:
          return self._post(prompt)
      except TeacherUnavailableError as e:
        raise TeacherUnavailableError(self.url, attempt, e.reason,
                                      e.status) from None
      except _Retryable as e:
        if attempt > self.max_retries:
          raise TeacherUnavailableError(self.url, attempt, e.reason,
                                        e.status) from e
        delay = self.backoff * 2 ** (attempt - 1)
        if e.retry_after is not None:
          delay = max(delay, e.retry_after)
        self._sleep(min(delay, self.max_backoff))

  def _complete_unless_rejected(self, prompt: str) -> str | None:
    """`complete`, or None (logged, counted in `rejected`) when the
    endpoint refuses this request."""
    try:
      return self.complete(prompt)
    except TeacherRejectedError as e:
      logging.warning("%s", e)
      with self._lock:
        self.rejected += 1
        self.last_rejection = e.reason
      return None

  def complete_many(self, prompts: Sequence[str]) -> list[str | None]:
    """Sends prompts concurrently (at most `max_concurrency` in flight).

    Args:
      prompts: user messages.

    Returns:
      Replies in input order; None for a prompt the endpoint rejected
      (counted in `rejected`).

    Raises:
      TeacherUnavailableError: as soon as one prompt fails for good; pending
        prompts are cancelled, `.partial` holds the replies that arrived
        (None for the rest) and `.completed` which prompts the endpoint
        answered, a refusal included (a None in `.partial` that is no gap).
    """
    results: list[str | None] = [None] * len(prompts)
    done = [False] * len(prompts)
    if not prompts:
      return results
    pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=min(self.max_concurrency, len(prompts)))
    try:
      futures = {pool.submit(self._complete_unless_rejected, p): i
                 for i, p in enumerate(prompts)}
      error = None
      for future in concurrent.futures.as_completed(futures):
        try:
          results[futures[future]] = future.result()
          done[futures[future]] = True
        except TeacherUnavailableError as e:
          if error is None:
            error = e
            for f in futures:
              f.cancel()
        except concurrent.futures.CancelledError:
          pass
      if error is not None:
        raise error.with_partial(results, done) from error
      return results
    finally:
      pool.shutdown(wait=True, cancel_futures=True)

  def _prompt(self, episode: Episode) -> str:
    built = skills.build_analysis_prompt(
        episode, mode=self.mode, max_critical_steps=self.max_critical_steps,
        max_chars=self.max_prompt_chars)
    with self._lock:
      self.steps_cut += built.steps_cut
    return built.text

  def _parse(self, reply: str | None, episode: Episode
             ) -> dict[str, Any] | skills.ParseError:
    if reply is None:  # rejected by the endpoint
      return self.stats.record(skills.ParseError("rejected",
                                                 self.last_rejection))
    k = self.max_critical_steps if self.mode == "episode_step" else 0
    result = self.stats.record(skills.parse_analysis(
        reply, num_steps=episode.length, max_step_skills=k,
        truncated=getattr(reply, "truncated", False)))
    return result.to_dict() if isinstance(result, skills.Analysis) else result

  def annotate(self, episode: Episode
               ) -> dict[str, Any] | skills.ParseError:
    """Analyzes one episode.

    Args:
      episode: a finished episode.

    Returns:
      {"episode_summary": str, "episode_skill": str} (plus "step_skills"
      {"<step number>": str} in "episode_step" mode when any), or the
      `skills.ParseError` saying why not when the reply does not parse
      ("truncated" when cut at `max_tokens`) or the endpoint rejects the
      request ("rejected", with what the endpoint said); both are counted
      in `stats`.

    Raises:
      TeacherUnavailableError: when the endpoint is down (see `complete`).
    """
    return self._parse(self._complete_unless_rejected(self._prompt(episode)),
                       episode)

  def annotate_many(self, episodes: Sequence[Episode],
                    prompts: Sequence[str] | None = None
                    ) -> list[dict[str, Any] | skills.ParseError | None]:
    """Analyzes episodes concurrently; a failure gives its ParseError.

    Args:
      episodes: finished episodes.
      prompts: the analysis prompts to send, one per episode (default: each
        built with this teacher's mode and budget); Stage 1 passes the ones
        its records keep, so the teacher sees what SFT will show.

    Returns:
      One annotation or ParseError (as `annotate`) per episode, in order.

    Raises:
      TeacherUnavailableError: when the endpoint goes down; `.partial` holds
        the annotations made so far (a refused request's ParseError
        "rejected" among them) and `.completed` which episodes got a reply or
        a refusal, so a caller can save what was kept and resume with the
        rest.
    """
    if prompts is None:
      prompts = [self._prompt(ep) for ep in episodes]
    elif len(prompts) != len(episodes):
      raise ValueError(f"{len(prompts)} prompts for {len(episodes)} episodes")
    try:
      replies = self.complete_many(prompts)
    except TeacherUnavailableError as e:
      partial = [self._parse(r, ep) if ok else None
                 for r, ep, ok in zip(e.partial, episodes, e.completed)]
      raise e.with_partial(partial, e.completed) from e
    return [self._parse(r, ep) for r, ep in zip(replies, episodes)]
