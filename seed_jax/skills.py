"""Hindsight skills: analysis prompt, lenient parser, skill-augmented prompts.

Host-side and pure, so the RL self-analysis prompt is byte-identical to the
Stage-1 one (docs/algorithm.md §4); skill blocks are placed as in §5.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from typing import Any, Callable, Mapping

from seed_jax.episodes import Episode, Step

MODES = ("episode_only", "episode_step")

_HEAD = "Analyze the following agent episode and return ONLY valid JSON."
_SUMMARY_FIELD = ('- "episode_summary": one or two sentences on what the agent'
                  ' did and how the episode ended.')
_SKILL_FIELD = {
    True: ('- "episode_skill": the episode succeeded, so write a reusable'
           ' workflow: the ordered moves that solved the task, stated so they'
           ' carry over to similar tasks.'),
    False: ('- "episode_skill": the episode failed, so write avoidance rules:'
            ' what to stop doing and what to do instead, naming the decisive'
            ' observations.'),
}
_STEP_FIELD = ('- "step_skills": at most {k} critical steps that decided the'
               ' outcome, keyed by step number, each with a one-sentence skill'
               ' for that decision.')
_CONSTRAINTS = (
    "Constraints:\n"
    "- Write one short policy-facing skill, not a retrospective explanation.\n"
    "- Return only these fields, with no text outside the JSON.")
_PLACEHOLDER = "<skill>"
_SHAPE = ('{"episode_summary": "<summary>", "episode_skill": "%s"%%s}'
          % _PLACEHOLDER)
_STEP_SHAPE = ', "step_skills": {"<step number>": "%s"}' % _PLACEHOLDER


@dataclasses.dataclass(frozen=True)
class AnalysisPrompt:
  """An analysis prompt and what its length budget cut.

  Attributes:
    text: the user message.
    num_steps: steps in the episode.
    steps_cut: steps left out of the middle by the length budget (0: none).
  """
  text: str
  num_steps: int
  steps_cut: int = 0

  @property
  def truncated(self) -> bool:
    return self.steps_cut > 0


def format_step(number: int, step: Step) -> str:
  """Serializes one step (1-based number): "Step 2\nObservation: You see a
  mug.\nResponse: <action>take mug</action>\nAction valid: true"."""
  return (f"Step {number}\nObservation: {step.observation.strip()}\n"
          f"Response: {step.response.strip()}\n"
          f"Action valid: {'true' if step.action_valid else 'false'}")


def _omitted(n: int) -> str:
  return f"... ({n} step{'' if n == 1 else 's'} omitted) ..."


def _fit_blocks(header: str, blocks: list[str],
                max_chars: int | None) -> tuple[list[str], int]:
  """Chooses the step blocks under the budget: the last step always, then the
  first, then as many of the last steps as fit; a marker stands for the cut."""
  n, sizes = len(blocks), [2 + len(b) for b in blocks]  # 2: the "\n\n"

  def cost(first: int, tail_start: int) -> int:
    marker = 2 + len(_omitted(tail_start - first)) if tail_start > first else 0
    return len(header) + sum(sizes[:first]) + sum(sizes[tail_start:]) + marker

  if max_chars is None or n < 2 or cost(0, 0) <= max_chars:
    return blocks, 0
  tail_start = n - 1
  first = 1 if n > 2 and cost(1, tail_start) <= max_chars else 0
  while tail_start - 1 > first and cost(first, tail_start - 1) <= max_chars:
    tail_start -= 1
  cut = tail_start - first
  return blocks[:first] + [_omitted(cut)] + blocks[tail_start:], cut


def build_analysis_prompt(episode: Episode, *, mode: str = "episode_only",
                          max_critical_steps: int = 3,
                          max_chars: int | None = None) -> AnalysisPrompt:
  """Builds the analysis prompt (one user message) for a finished episode.

  Instructions first (fields, constraints, JSON shape), then the context: the
  task, `episode_success: success|failure` and the steps. Blocks are separated
  by one blank line. Over `max_chars`, steps are cut from the middle: the last
  step is always kept, then the first, then as many of the last as fit, with
  "... (N steps omitted) ..." in place of the cut; the instructions are never
  cut, so the text can exceed `max_chars` when they and the last step alone do.

  Args:
    episode: the episode to analyze.
    mode: "episode_only" (summary and skill) or "episode_step" (also
      `step_skills` for at most `max_critical_steps` critical steps).
    max_critical_steps: K in "episode_step" mode.
    max_chars: length budget in characters, or None for no budget.

  Returns:
    An AnalysisPrompt with the text and the number of steps cut.

  Raises:
    ValueError: on an unknown mode or a non-positive K.

  Example (episode_only, success; "..." abridges the fixed instructions):
    Episode(task="put a mug in sink", success=True, steps=[Step(observation=
    "You see a mug.", response="<action>take mug</action>", action_valid=True,
    ...)]) ->
    "Analyze the following agent episode and return ONLY valid JSON.\n\n
    Fields to write:\n- \"episode_summary\": ...\n\nConstraints:\n...\n\n
    JSON shape:\n{...}\n\nTask: put a mug in sink\nepisode_success: success
    \n\nStep 1\nObservation: You see a mug.\nResponse: <action>take mug
    </action>\nAction valid: true"
  """
  if mode not in MODES:
    raise ValueError(f"unknown analysis mode {mode!r}; expected one of {MODES}")
  if max_critical_steps < 1:
    raise ValueError(f"max_critical_steps must be >= 1: {max_critical_steps}")
  fields = [_SUMMARY_FIELD, _SKILL_FIELD[bool(episode.success)]]
  if mode == "episode_step":
    fields.append(_STEP_FIELD.format(k=max_critical_steps))
  shape = _SHAPE % (_STEP_SHAPE if mode == "episode_step" else "")
  outcome = "success" if episode.success else "failure"
  header = "\n\n".join([
      _HEAD, "Fields to write:\n" + "\n".join(fields), _CONSTRAINTS,
      "JSON shape:\n" + shape,
      f"Task: {episode.task.strip()}\nepisode_success: {outcome}"])
  blocks = [format_step(k, s) for k, s in enumerate(episode.steps, start=1)]
  blocks = blocks or ["(no steps)"]
  kept, cut = _fit_blocks(header, blocks, max_chars)
  text = "\n\n".join([header] + kept)
  return AnalysisPrompt(text=text, num_steps=len(episode.steps), steps_cut=cut)


def fit_analysis_prompt(episode: Episode, *, encode: Callable[[str], list],
                        max_tokens: int, mode: str = "episode_only",
                        max_critical_steps: int = 3,
                        max_chars: int | None = None) -> AnalysisPrompt | None:
  """`build_analysis_prompt`, its steps cut further in the middle while the
  encoded prompt is longer than `max_tokens`.

  Stage 1 and RL both call this with the same budgets, so their prompts stay
  byte-identical however long the episode.

  Args:
    episode, mode, max_critical_steps, max_chars: as `build_analysis_prompt`.
    encode: text -> token ids as the policy will see them (chat template
      included), e.g. `rollout.Policy.encode`.
    max_tokens: the longest prompt allowed, in tokens.

  Returns:
    The prompt, or None when the instructions and the last step alone are
    longer than `max_tokens`.
  """
  budget = max_chars
  while True:
    built = build_analysis_prompt(episode, mode=mode,
                                  max_critical_steps=max_critical_steps,
                                  max_chars=budget)
    n = len(encode(built.text))
    if n <= max_tokens:
      return built
    if built.num_steps - built.steps_cut <= 1:
      return None
    budget = min(len(built.text) - 1, len(built.text) * max_tokens // n)


@dataclasses.dataclass(frozen=True)
class Analysis:
  """A parsed analysis.

  Attributes:
    summary: "episode_summary" ("" when absent).
    skill: "episode_skill", stripped, never empty.
    step_skills: critical-step skills keyed by the 1-based step number shown in
      the prompt (`episode.steps[k - 1]`).
  """
  summary: str
  skill: str
  step_skills: dict[int, str] = dataclasses.field(default_factory=dict)

  def to_dict(self) -> dict[str, Any]:
    """The JSON object form; `step_skills` only when there are any."""
    out: dict[str, Any] = dict(episode_summary=self.summary,
                               episode_skill=self.skill)
    if self.step_skills:
      out["step_skills"] = {str(k): v for k, v in self.step_skills.items()}
    return out

  def to_json(self) -> str:
    """Canonical JSON text, e.g. the Stage-1 SFT target."""
    return json.dumps(self.to_dict(), ensure_ascii=False)


@dataclasses.dataclass(frozen=True)
class ParseError:
  """Why a reply gave no analysis.

  Attributes:
    reason: "no_json" (no decodable object), "missing_skill" (objects, none
      with "episode_skill"), "empty_skill" (only empty or unusable skills),
      "not_text" (the input was not a string), "truncated" (the reply was
      cut at its token budget and does not parse: a budget too small, not a
      malformed reply), "prompt_too_long" (the analysis prompt did not fit
      the policy's context; nothing was asked) or "rejected" (a teacher
      endpoint refused the request).
    detail: a short human-readable note.
  """
  reason: str
  detail: str = ""


_FENCE = re.compile(r"```[^\n`]*\n?(.*?)```", re.DOTALL)
_SPECIAL = re.compile(r'[{}"\\]')
_DQ_STRING = re.compile(r'"(?:[^"\\]|\\.)*"?', re.DOTALL)
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEY_COLON = re.compile(r"\s*:")
_CLOSE_SQ = re.compile(r"\s*(?:[,:}\]]|$)")
_TRAILING = re.compile(r"\s*[}\]]")
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}
_STEP_KEY = re.compile(r"^\s*(?:step\s*[_#:\-]?\s*|#)?(\d+)(?:\.0*)?\s*$",
                       re.IGNORECASE)
_MAX_CANDIDATES = 256  # decode attempts per reply
_MAX_SPAN_CHARS = 1 << 20  # longer {...} spans are not analyses
_MAX_REPAIR_CHARS = 1 << 16


def _brace_spans(text: str, string_aware: bool) -> list[tuple[int, int]]:
  """(start, end) of every balanced {...}; when string_aware, braces inside
  double-quoted strings (tracked only inside braces) do not count."""
  spans, stack = [], []
  in_str, escape_at = False, -2
  for m in _SPECIAL.finditer(text):
    ch, i = m.group(), m.start()
    if in_str:
      if i == escape_at + 1:
        continue  # this character is escaped
      if ch == "\\":
        escape_at = i
      elif ch == '"':
        in_str = False
    elif ch == '"' and string_aware and stack:
      in_str = True
    elif ch == "{":
      stack.append(i)
    elif ch == "}" and stack:
      spans.append((stack.pop(), i + 1))
  return spans


def _repair(s: str) -> str:
  """Lenient -> strict JSON: single-quoted strings, trailing commas, bare
  keys and Python literals (True/False/None)."""
  out, i, n = [], 0, len(s)
  while i < n:
    ch = s[i]
    if ch == '"':
      m = _DQ_STRING.match(s, i)
      out.append(m.group())
      i = m.end()
    elif ch == "'":
      buf, j = [], i + 1
      while j < n:
        c = s[j]
        if c == "\\" and j + 1 < n:
          buf.append("'" if s[j + 1] == "'" else s[j:j + 2])
          j += 2
          continue
        if c == "'" and _CLOSE_SQ.match(s, j + 1):
          break
        buf.append('\\"' if c == '"' else c)
        j += 1
      out.append('"' + "".join(buf) + '"')
      i = j + 1
    elif ch == "," and _TRAILING.match(s, i + 1):
      i += 1
    elif ch.isalpha() or ch == "_":
      word = m.group() if (m := _WORD.match(s, i)) else ch
      bare_key = _KEY_COLON.match(s, i + len(word))
      out.append(f'"{word}"' if bare_key else _PY_LITERALS.get(word, word))
      i += len(word)
    else:
      out.append(ch)
      i += 1
  return "".join(out)


def _decode(candidate: str) -> Any:
  try:
    return json.loads(candidate, strict=False)
  except Exception:  # ValueError, RecursionError on deep nesting, ...
    pass
  if len(candidate) > _MAX_REPAIR_CHARS:  # the repair is a Python loop
    return None
  try:
    return json.loads(_repair(candidate), strict=False)
  except Exception:
    return None


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _as_text(value: Any) -> str | None:
  """A field value as text: strings stripped, numbers and lists of strings
  and numbers joined; None for anything else (booleans included)."""
  if isinstance(value, str):
    return value.strip()
  if _is_number(value):
    return str(value)
  if isinstance(value, (list, tuple)) and all(
      isinstance(v, str) or _is_number(v) for v in value):
    return " ".join(str(v).strip() for v in value if str(v).strip())
  return None


def _skill_text(value: Any) -> str | None:
  """A skill's text: a string, or a list of strings joined; None when empty,
  anything else (a number, a boolean, a list with such an item), or the
  prompt's own placeholder echoed back ("<skill>"), which would distill
  nothing but the prompt's shape."""
  items = [value] if isinstance(value, str) else value
  if not isinstance(items, (list, tuple)) or not all(
      isinstance(v, str) for v in items):
    return None
  text = _as_text(value)
  return None if not text or text.lower() == _PLACEHOLDER else text


def _step_number(key: Any) -> int | None:
  if isinstance(key, int) and not isinstance(key, bool):
    return key
  m = _STEP_KEY.match(str(key))
  return int(m.group(1)) if m else None


def _step_skills(value: Any, num_steps: int | None,
                 max_step_skills: int | None) -> dict[int, str]:
  pairs = list(value.items()) if isinstance(value, dict) else []
  if isinstance(value, list):  # [{"step": 3, "skill": "..."}, ...]
    pairs = [(v.get("step"), v.get("skill")) for v in value
             if isinstance(v, dict)]
  out: dict[int, str] = {}
  for key, skill in pairs:
    k, text = _step_number(key), _skill_text(skill)
    if (k is None or k < 1 or not text or k in out
        or (num_steps is not None and k > num_steps)):
      continue
    if max_step_skills is not None and len(out) >= max_step_skills:
      break
    out[k] = text
  return out


def _candidates(text: str):
  for m in _FENCE.finditer(text):
    yield m.group(1).strip()
  yield text.strip()
  spans = set(_brace_spans(text, True)) | set(_brace_spans(text, False))
  for start, end in sorted(spans, key=lambda se: (se[0], -se[1])):
    if end - start <= _MAX_SPAN_CHARS:
      yield text[start:end]


def parse_analysis(text: Any, *, num_steps: int | None = None,
                   max_step_skills: int | None = None,
                   truncated: bool = False) -> Analysis | ParseError:
  """Parses an analysis reply, leniently; never raises.

  Candidates in order: each fenced ``` block, the whole reply, then every
  balanced {...} by position (outer before inner). Each is decoded as JSON,
  then again after repair (single quotes, trailing commas, bare keys, Python
  literals). The first object with a non-empty "episode_skill" wins (the
  prompt's placeholder "<skill>" echoed back counts as empty). Step keys
  such as "3", "3.0", "step 3", "Step_3", "#3" become 3; others are dropped.

  Args:
    text: the analyzer's reply.
    num_steps: when given, step skills outside 1..num_steps are dropped.
    max_step_skills: when given, only the first K step skills are kept.
    truncated: the reply was cut at its token budget (`Sampled.truncated`);
      if it does not parse, the reason is "truncated" whatever it lacks.

  Returns:
    An Analysis, or a ParseError saying why there is none.

  Example:
    'Sure!\\n```json\\n{"episode_summary": "Took the mug.", "episode_skill":
    "Search countertops first.",}\\n```' -> Analysis(summary="Took the mug.",
    skill="Search countertops first.", step_skills={})
  """
  if isinstance(text, (bytes, bytearray)):
    text = bytes(text).decode("utf-8", errors="replace")
  if not isinstance(text, str):
    return ParseError("not_text", f"expected str, got {type(text).__name__}")
  seen_object = seen_key = False
  tried: set[int] = set()
  for candidate in _candidates(text):
    if len(tried) >= _MAX_CANDIDATES:
      break
    if not candidate.startswith("{") or hash(candidate) in tried:
      continue
    tried.add(hash(candidate))
    obj = _decode(candidate)
    if not isinstance(obj, dict):
      continue
    seen_object = True
    fields = {str(k).strip().lower(): v for k, v in obj.items()}
    if "episode_skill" not in fields:
      continue
    seen_key = True
    skill = _skill_text(fields["episode_skill"])
    if not skill:
      continue
    return Analysis(
        summary=_as_text(fields.get("episode_summary")) or "",
        skill=skill,
        step_skills=_step_skills(fields.get("step_skills"), num_steps,
                                 max_step_skills))
  if truncated:
    return ParseError("truncated", "cut at the token budget before it parsed")
  if seen_key:
    return ParseError("empty_skill", '"episode_skill" is empty or not text')
  if seen_object:
    return ParseError("missing_skill", 'no object has "episode_skill"')
  return ParseError("no_json", "no decodable JSON object")


class ParseStats:
  """Thread-safe parse counts, for reporting a parse rate.

  Example: after `stats.record(parse_analysis(r))` for three good replies and
  one without JSON, `stats.as_dict()` -> {"parsed": 3, "failed": 1,
  "parse_rate": 0.75, "failed/no_json": 1}.
  """

  def __init__(self):
    self.parsed, self.failed = 0, 0
    self.reasons: dict[str, int] = {}
    self._lock = threading.Lock()

  def record(self, result: Analysis | ParseError) -> Analysis | ParseError:
    """Counts `result` and returns it."""
    with self._lock:
      if isinstance(result, Analysis):
        self.parsed += 1
      else:
        self.failed += 1
        self.reasons[result.reason] = self.reasons.get(result.reason, 0) + 1
    return result

  def add(self, counts: Mapping[str, Any]) -> None:
    """Adds counts in `as_dict`'s form (its parse_rate is ignored)."""
    with self._lock:
      self.parsed += int(counts.get("parsed", 0))
      self.failed += int(counts.get("failed", 0))
      for key, n in counts.items():
        if key.startswith("failed/"):
          reason = key[len("failed/"):]
          self.reasons[reason] = self.reasons.get(reason, 0) + int(n)

  @property
  def rate(self) -> float:
    """Parsed fraction; 0.0 before any record."""
    total = self.parsed + self.failed
    return self.parsed / total if total else 0.0

  def as_dict(self) -> dict[str, float]:
    out = dict(parsed=self.parsed, failed=self.failed, parse_rate=self.rate)
    out.update({f"failed/{k}": v for k, v in sorted(self.reasons.items())})
    return out


TASK_MARKERS = ("Your task is to:", "Your goal is to", "Your question:")
TURN_MARKER = "Now it's your turn"
EPISODE_BLOCK = ("**Episode-Level Skill**\nRefer to this episode-level skill"
                 " when deciding what action to take in the current episode:\n"
                 "[{skill}]")
STEP_BLOCK = ("**Critical-Step Skill**\nUse this current-step skill for this"
              " decision only:\n[{skill}]")


def _insert_block(prompt: str, block: str) -> str:
  """Places `block` as build_skill_prompt documents; blank runs collapse."""
  lines = prompt.split("\n")
  at = next((i + 1 for i, line in enumerate(lines)
             if any(m in line for m in TASK_MARKERS)), None)
  if at is None:
    at = next((i for i, line in enumerate(lines)
               if line.lstrip().startswith(TURN_MARKER)), None)
  if at is None:
    at = len(lines)
  head, tail = lines[:at], lines[at:]
  while head and not head[-1].strip():
    head.pop()
  while tail and not tail[0].strip():
    tail.pop(0)
  text = "\n\n".join(p for p in ("\n".join(head), block, "\n".join(tail)) if p)
  if prompt.endswith("\n") and not text.endswith("\n"):
    text += "\n"  # keep a final newline (only dropped with an empty tail)
  return text


def _clean_skill(skill: str) -> str:
  skill = skill.strip()
  if not skill:
    raise ValueError("skill must be non-empty")
  return skill


def build_skill_prompt(prompt: str, skill: str, *,
                       step_skill: str | None = None) -> str:
  """Inserts the episode-level skill block (docs/algorithm.md §5) in a prompt.

  The block goes after the first line containing "Your task is to:", "Your
  goal is to" or "Your question:"; else before the first line starting with
  "Now it's your turn"; else at the end. Exactly one blank line separates it
  from the text on either side. With `step_skill`, the critical-step block
  follows the episode block (one blank line between them).

  Args:
    prompt: the rollout prompt.
    skill: the episode skill (stripped; must be non-empty).
    step_skill: optional critical-step skill for this step.

  Returns:
    The augmented prompt.

  Raises:
    ValueError: if a skill is empty.

  Example:
    ("You are an agent.\\nYour task is to: heat an egg.\\nNow it's your turn.",
     "Open the microwave first.") ->
    "You are an agent.\\nYour task is to: heat an egg.\\n\\n**Episode-Level
    Skill**\\nRefer to this episode-level skill when deciding what action to
    take in the current episode:\\n[Open the microwave first.]\\n\\nNow it's
    your turn."
  """
  block = EPISODE_BLOCK.format(skill=_clean_skill(skill))
  if step_skill is not None:
    block += "\n\n" + STEP_BLOCK.format(skill=_clean_skill(step_skill))
  return _insert_block(prompt, block)


def build_step_skill_prompt(prompt: str, skill: str) -> str:
  """Inserts only the critical-step skill block, placed as in
  build_skill_prompt (Args/Raises likewise).

  Example: ("Your goal is to push the box.\nNow it's your turn.", "Push
  left.") -> "Your goal is to push the box.\n\n**Critical-Step Skill**\nUse
  this current-step skill for this decision only:\n[Push left.]\n\nNow it's
  your turn."
  """
  return _insert_block(prompt, STEP_BLOCK.format(skill=_clean_skill(skill)))
