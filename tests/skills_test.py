"""Tests for seed_jax.skills: analysis prompt, parser, skill blocks."""

import json

from hypothesis import given, settings, strategies as st
import pytest

from seed_jax import skills
from seed_jax.episodes import Episode, Step
from seed_jax.skills import Analysis, ParseError

# ------------------------------------------------------------------ prompts --

_INSTRUCTIONS_SUCCESS = """\
Analyze the following agent episode and return ONLY valid JSON.

Fields to write:
- "episode_summary": one or two sentences on what the agent did and how the \
episode ended.
- "episode_skill": the episode succeeded, so write a reusable workflow: the \
ordered moves that solved the task, stated so they carry over to similar tasks.

Constraints:
- Write one short policy-facing skill, not a retrospective explanation.
- Return only these fields, with no text outside the JSON.

JSON shape:
{"episode_summary": "<summary>", "episode_skill": "<skill>"}
"""

_INSTRUCTIONS_FAILURE_STEP = """\
Analyze the following agent episode and return ONLY valid JSON.

Fields to write:
- "episode_summary": one or two sentences on what the agent did and how the \
episode ended.
- "episode_skill": the episode failed, so write avoidance rules: what to stop \
doing and what to do instead, naming the decisive observations.
- "step_skills": at most 2 critical steps that decided the outcome, keyed by \
step number, each with a one-sentence skill for that decision.

Constraints:
- Write one short policy-facing skill, not a retrospective explanation.
- Return only these fields, with no text outside the JSON.

JSON shape:
{"episode_summary": "<summary>", "episode_skill": "<skill>", "step_skills": \
{"<step number>": "<skill>"}}
"""


def _step(i, valid=True):
  return Step(observation=f"obs {i}\n", prompt=f"prompt {i}",
              response=f"<think>t{i}</think><action>a{i}</action>",
              action=f"a{i}", action_valid=valid)


def _episode(n, success):
  return Episode(env_name="household", task=" put a clean mug in sink ",
                 family="clean", seed=0,
                 steps=[_step(i, valid=i != 2) for i in range(1, n + 1)],
                 success=success)


def _block(i, valid="true"):
  return (f"Step {i}\nObservation: obs {i}\n"
          f"Response: <think>t{i}</think><action>a{i}</action>\n"
          f"Action valid: {valid}")


def test_analysis_prompt_success_exact():
  got = skills.build_analysis_prompt(_episode(2, True))
  assert got.text == _INSTRUCTIONS_SUCCESS + """
Task: put a clean mug in sink
episode_success: success

Step 1
Observation: obs 1
Response: <think>t1</think><action>a1</action>
Action valid: true

Step 2
Observation: obs 2
Response: <think>t2</think><action>a2</action>
Action valid: false"""
  assert (got.num_steps, got.steps_cut, got.truncated) == (2, 0, False)


def test_analysis_prompt_failure_episode_step_exact():
  got = skills.build_analysis_prompt(_episode(1, False), mode="episode_step",
                                     max_critical_steps=2)
  assert got.text == _INSTRUCTIONS_FAILURE_STEP + """
Task: put a clean mug in sink
episode_success: failure

Step 1
Observation: obs 1
Response: <think>t1</think><action>a1</action>
Action valid: true"""


def test_analysis_prompt_no_steps():
  got = skills.build_analysis_prompt(_episode(0, False))
  assert got.text.endswith("episode_success: failure\n\n(no steps)")


def test_analysis_prompt_is_deterministic():
  a = skills.build_analysis_prompt(_episode(5, True), max_chars=900)
  b = skills.build_analysis_prompt(_episode(5, True), max_chars=900)
  assert a == b


def test_analysis_prompt_truncation_cuts_the_middle():
  ep = _episode(10, True)
  full = skills.build_analysis_prompt(ep).text
  header = full[:full.index("\n\nStep 1\n")]
  blocks = [_block(i, "false" if i == 2 else "true") for i in range(1, 11)]
  marker = "... (6 steps omitted) ..."
  kept = [blocks[0], marker] + blocks[7:]
  budget = len("\n\n".join([header] + kept))
  got = skills.build_analysis_prompt(ep, max_chars=budget)
  assert got.text == "\n\n".join([header] + kept)
  assert got.text.startswith(_INSTRUCTIONS_SUCCESS)
  assert (got.steps_cut, got.truncated) == (6, True)
  assert len(got.text) <= budget
  # One character less: one more step goes (the marker is as long).
  got = skills.build_analysis_prompt(ep, max_chars=budget - 1)
  assert got.steps_cut == 7
  assert "... (7 steps omitted) ..." in got.text
  assert got.text.endswith(blocks[-1]) and blocks[0] in got.text


def test_analysis_prompt_truncation_never_cuts_instructions_or_last_step():
  ep = _episode(4, False)
  got = skills.build_analysis_prompt(ep, max_chars=10)
  assert got.text.startswith(_INSTRUCTIONS_SUCCESS.split("\n")[0])
  assert "episode_success: failure\n\n... (3 steps omitted) ...\n\n" in got.text
  assert got.text.endswith(_block(4))
  assert got.steps_cut == 3


def test_analysis_prompt_singular_marker_and_fit():
  ep = _episode(3, True)
  full = skills.build_analysis_prompt(ep).text
  assert skills.build_analysis_prompt(ep, max_chars=len(full)).steps_cut == 0
  got = skills.build_analysis_prompt(ep, max_chars=len(full) - 1)
  assert "\n\n... (1 step omitted) ...\n\n" in got.text
  assert got.steps_cut == 1


def test_analysis_prompt_bad_args():
  with pytest.raises(ValueError, match="unknown analysis mode 'steps'"):
    skills.build_analysis_prompt(_episode(1, True), mode="steps")
  with pytest.raises(ValueError, match="max_critical_steps must be >= 1: 0"):
    skills.build_analysis_prompt(_episode(1, True), mode="episode_step",
                                 max_critical_steps=0)


# ------------------------------------------------------------ skill blocks --

_EP_BLOCK = ("**Episode-Level Skill**\nRefer to this episode-level skill when "
             "deciding what action to take in the current episode:\n"
             "[Check the drawers first.]")
_STEP = ("**Critical-Step Skill**\nUse this current-step skill for this "
         "decision only:\n[Push the box left now.]")

_HOUSEHOLD = (
    "You are an expert agent in a household. Your task is to: put a clean mug "
    "in sink\nPrior to this step, you have taken 2 steps.\n"
    "Your admissible actions are: [look, go to sink 1]\n"
    "Now it's your turn to take an action.\n")
_SOKOBAN = (
    "You are an expert agent in the Sokoban environment.\n\n"
    "Your goal is to push every box onto a target.\n\n"
    "Current observation:\n#####\n#P$.#\n#####\n\n"
    "Now it's your turn to take an action.")
_SEARCH = ("Answer the question with the search tool.\n"
           "Your question: who wrote Dune?\n"
           "Now it's your turn to answer.")


def test_skill_block_after_household_task_line():
  got = skills.build_skill_prompt(_HOUSEHOLD, "  Check the drawers first. ")
  assert got == (
      "You are an expert agent in a household. Your task is to: put a clean "
      "mug in sink\n\n" + _EP_BLOCK + "\n\n"
      "Prior to this step, you have taken 2 steps.\n"
      "Your admissible actions are: [look, go to sink 1]\n"
      "Now it's your turn to take an action.\n")


def test_skill_block_after_sokoban_goal_line_blank_lines_kept_single():
  got = skills.build_skill_prompt(_SOKOBAN, "Check the drawers first.")
  assert got == (
      "You are an expert agent in the Sokoban environment.\n\n"
      "Your goal is to push every box onto a target.\n\n" + _EP_BLOCK + "\n\n"
      "Current observation:\n#####\n#P$.#\n#####\n\n"
      "Now it's your turn to take an action.")


def test_skill_block_after_question_line():
  got = skills.build_skill_prompt(_SEARCH, "Check the drawers first.")
  assert got == ("Answer the question with the search tool.\n"
                 "Your question: who wrote Dune?\n\n" + _EP_BLOCK + "\n\n"
                 "Now it's your turn to answer.")


def test_skill_block_before_turn_line_without_task_line():
  prompt = "Observation: a room.\n\n\nNow it's your turn to act.\n"
  got = skills.build_skill_prompt(prompt, "Check the drawers first.")
  assert got == ("Observation: a room.\n\n" + _EP_BLOCK +
                 "\n\nNow it's your turn to act.\n")
  assert skills.build_skill_prompt(
      "Now it's your turn.", "Check the drawers first.") == (
          _EP_BLOCK + "\n\nNow it's your turn.")


def test_skill_block_appended_as_last_resort():
  got = skills.build_skill_prompt("Observation: a room.\n\n",
                                  "Check the drawers first.")
  assert got == "Observation: a room.\n\n" + _EP_BLOCK + "\n"
  assert skills.build_skill_prompt("", "Check the drawers first.") == _EP_BLOCK


def test_skill_block_task_line_last():
  got = skills.build_skill_prompt("Your task is to: heat an egg.",
                                  "Check the drawers first.")
  assert got == "Your task is to: heat an egg.\n\n" + _EP_BLOCK


def test_step_skill_blocks():
  got = skills.build_step_skill_prompt(_SEARCH, " Push the box left now.")
  assert got == ("Answer the question with the search tool.\n"
                 "Your question: who wrote Dune?\n\n" + _STEP + "\n\n"
                 "Now it's your turn to answer.")
  got = skills.build_skill_prompt(_SEARCH, "Check the drawers first.",
                                  step_skill="Push the box left now.")
  assert got == ("Answer the question with the search tool.\n"
                 "Your question: who wrote Dune?\n\n" + _EP_BLOCK + "\n\n" +
                 _STEP + "\n\nNow it's your turn to answer.")


def test_skill_with_braces_and_newlines_kept_verbatim():
  got = skills.build_skill_prompt("Now it's your turn.", "1) {look}\n2) go")
  assert "\n[1) {look}\n2) go]\n\nNow it's your turn." in got


def test_empty_skill_rejected():
  with pytest.raises(ValueError, match="skill must be non-empty"):
    skills.build_skill_prompt(_SEARCH, "  ")
  with pytest.raises(ValueError, match="skill must be non-empty"):
    skills.build_step_skill_prompt(_SEARCH, "")


# ------------------------------------------------------------------ parser --

_OK = Analysis("Took the mug.", "Search countertops first.")
_J = ('{"episode_summary": "Took the mug.", '
      '"episode_skill": "Search countertops first."}')

PARSE_CASES = [
    # (id, reply, expected Analysis or ParseError reason)
    ("plain", _J, _OK),
    ("fenced_json", f"```json\n{_J}\n```", _OK),
    ("fenced_bare", f"```\n{_J}\n```", _OK),
    ("fenced_with_prose", f"Here it is:\n```JSON\n{_J}\n```\nHope it helps.",
     _OK),
    ("prose_around", f"Sure! {_J} Let me know.", _OK),
    ("unclosed_fence", f"```json\n{_J}\n", _OK),
    ("trailing_comma", _J[:-1] + ",}", _OK),
    ("trailing_comma_newline", _J[:-1] + ",\n\n}", _OK),
    ("single_quotes",
     "{'episode_summary': 'Took the mug.', 'episode_skill': "
     "'Search countertops first.'}", _OK),
    ("single_quotes_apostrophe",
     "{'episode_summary': 'x', 'episode_skill': 'Don't loop; look first.'}",
     Analysis("x", "Don't loop; look first.")),
    ("single_quotes_inner_double",
     "{'episode_summary': 'x', 'episode_skill': 'Say \"go\" twice',}",
     Analysis("x", 'Say "go" twice')),
    ("bare_keys_python_literals",
     '{episode_summary: "x", episode_skill: "y", done: True, extra: None}',
     Analysis("x", "y")),
    ("whitespace_stripped",
     '{"episode_summary": "  x ", "episode_skill": "\\n y \\t"}',
     Analysis("x", "y")),
    ("missing_summary", '{"episode_skill": "y"}', Analysis("", "y")),
    ("key_case", '{"Episode_Summary": "x", " EPISODE_SKILL ": "y"}',
     Analysis("x", "y")),
    ("skill_list", '{"episode_summary": "x", "episode_skill": ["a.", " b."]}',
     Analysis("x", "a. b.")),
    ("first_lacks_skill",
     '{"episode_summary": "draft"} then {"episode_summary": "x", '
     '"episode_skill": "y"}', Analysis("x", "y")),
    ("first_with_skill_wins",
     '{"episode_skill": "first"}\n{"episode_skill": "second"}',
     Analysis("", "first")),
    ("first_empty_second_ok",
     '{"episode_skill": ""} {"episode_skill": "ok"}', Analysis("", "ok")),
    ("nested", '{"analysis": {"episode_summary": "x", "episode_skill": "y"}}',
     Analysis("x", "y")),
    ("in_array", '[{"episode_summary": "x", "episode_skill": "y"}]',
     Analysis("x", "y")),
    ("braces_in_strings",
     '{"episode_summary": "saw {a} }}", "episode_skill": "use {x} {"}',
     Analysis("saw {a} }}", "use {x} {")),
    ("stray_braces_around", '}} oops { {"episode_skill": "y"} }',
     Analysis("", "y")),
    ("unicode",
     '{"episode_summary": "拿杯子 ☕", "episode_skill": "先看台面 ✓"}',
     Analysis("拿杯子 ☕", "先看台面 ✓")),
    ("unicode_escapes", '{"episode_summary": "caf\\u00e9", '
     '"episode_skill": "\\ud83d\\ude00 go"}', Analysis("café", "😀 go")),
    ("raw_newline_in_string", '{"episode_summary": "a\nb", "episode_skill": '
     '"1. look\n2. take"}', Analysis("a\nb", "1. look\n2. take")),
    # The spec's order: a fenced block before the whole reply, even where the
    # whole reply decodes too (strict=False lets a fence sit in its string).
    ("fence_before_whole_reply",
     '{"episode_skill": "WHOLE\n```\n{\'episode_skill\': \'FENCE\'}\n```\n"}',
     Analysis("", "FENCE")),
    ("broken_fence_then_good",
     '```json\n{"episode_skill": \n```\nretry: {"episode_skill": "y"}',
     Analysis("", "y")),
    ("step_keys",
     '{"episode_summary": "x", "episode_skill": "y", "step_skills": '
     '{"step 3": "a", "4.0": "b", "Step_5": "c", "#6": "d", "first": "e", '
     '"3.5": "f", "-1": "g", "0": "h", "7": "", "step-8": "i",}}',
     Analysis("x", "y", {3: "a", 4: "b", 5: "c", 6: "d", 8: "i"})),
    ("step_keys_duplicate_first_wins",
     '{"episode_skill": "y", "step_skills": {"2": "a", "step 2": "b"}}',
     Analysis("", "y", {2: "a"})),
    ("step_skills_list",
     '{"episode_skill": "y", "step_skills": [{"step": "Step 2", "skill": "a"},'
     ' {"step": 4, "skill": "b"}, "junk"]}',
     Analysis("", "y", {2: "a", 4: "b"})),
    ("step_skills_not_a_mapping",
     '{"episode_skill": "y", "step_skills": "3: a"}', Analysis("", "y")),
    ("empty_skill", '{"episode_summary": "x", "episode_skill": ""}',
     "empty_skill"),
    ("blank_skill", '{"episode_summary": "x", "episode_skill": "   "}',
     "empty_skill"),
    ("null_skill", '{"episode_summary": "x", "episode_skill": null}',
     "empty_skill"),
    ("dict_skill", '{"episode_skill": {"a": 1}}', "empty_skill"),
    ("number_skill", '{"episode_skill": 5}', "empty_skill"),
    ("bool_skill", '{"episode_skill": true}', "empty_skill"),
    # A list skill is text only when every item is a string.
    ("bool_list_skill", '{"episode_skill": [true, false]}', "empty_skill"),
    ("number_list_skill", '{"episode_skill": [1, 2.5]}', "empty_skill"),
    ("mixed_list_skill", '{"episode_skill": ["a.", 2]}', "empty_skill"),
    ("python_bool_list_skill", "{'episode_skill': [True, None]}",
     "empty_skill"),
    ("non_text_lists_then_real",
     '{"episode_skill": [1, 2]} {"episode_summary": [true], '
     '"episode_skill": "y", "step_skills": {"1": [false], "2": [3], '
     '"3": ["b"]}}', Analysis("", "y", {3: "b"})),
    # The prompt's own shape echoed back is no analysis.
    ("placeholder_echoed", skills._SHAPE % "", "empty_skill"),
    ("placeholder_then_real",
     '{"episode_skill": " <Skill> ", "step_skills": {"1": "<skill>"}} '
     '{"episode_skill": "y", "step_skills": {"1": "<skill>", "2": "b"}}',
     Analysis("", "y", {2: "b"})),
    ("no_skill_key", '{"episode_summary": "x", "skill": "y"}', "missing_skill"),
    ("empty_object", "{}", "missing_skill"),
    ("repeated_braces", "{{{{{{}}}}}}", "missing_skill"),
    ("open_braces", "{{{{{{{{", "no_json"),
    ("no_json", "I could not analyze this episode.", "no_json"),
    ("empty", "", "no_json"),
    ("truncated", '{"episode_summary": "x", "episode_skill": "Search coun',
     "no_json"),
    ("truncated_fence", '```json\n{"episode_summary": "x", "episode_sk',
     "no_json"),
    ("json_list_of_strings", '["episode_skill", "y"]', "no_json"),
    ("json_string", '"episode_skill: y"', "no_json"),
    ("bad_bytes_like_text", "\x00\xff\ufffd{\x00}", "no_json"),
]


@pytest.mark.parametrize("reply,expected", [c[1:] for c in PARSE_CASES],
                         ids=[c[0] for c in PARSE_CASES])
def test_parse_analysis_cases(reply, expected):
  got = skills.parse_analysis(reply)
  if isinstance(expected, str):
    assert isinstance(got, ParseError), got
    assert got.reason == expected
  else:
    assert got == expected


def test_parse_case_count():
  assert len(PARSE_CASES) >= 30


def test_parse_non_text_inputs():
  assert skills.parse_analysis(None) == ParseError(
      "not_text", "expected str, got NoneType")
  assert skills.parse_analysis(_J.encode()) == _OK
  assert skills.parse_analysis(b"\xff\xfe{").reason == "no_json"


def test_parse_step_limits():
  reply = ('{"episode_skill": "y", "step_skills": '
           '{"9": "a", "2": "b", "3": "c", "1": "d"}}')
  got = skills.parse_analysis(reply, num_steps=5, max_step_skills=2)
  assert got.step_skills == {2: "b", 3: "c"}
  assert skills.parse_analysis(reply, max_step_skills=0).step_skills == {}


def test_parse_huge_and_deep_inputs_are_fast_and_safe():
  deep = "[" * 100_000 + "]" * 100_000
  assert skills.parse_analysis(deep).reason == "no_json"
  nested = "{" * 50_000 + _J + "}" * 50_000
  assert skills.parse_analysis(nested).reason in ("no_json", "missing_skill")
  assert skills.parse_analysis("x" * 1_000_000 + _J) == _OK


def test_analysis_to_dict_and_json_round_trip():
  a = Analysis("x", "é y", {3: "z"})
  assert a.to_dict() == {"episode_summary": "x", "episode_skill": "é y",
                         "step_skills": {"3": "z"}}
  assert a.to_json() == ('{"episode_summary": "x", "episode_skill": "é y", '
                         '"step_skills": {"3": "z"}}')
  assert skills.parse_analysis(a.to_json()) == a
  assert Analysis("x", "y").to_dict() == {"episode_summary": "x",
                                          "episode_skill": "y"}


def test_parse_stats():
  stats = skills.ParseStats()
  for reply in (_J, _J, "nope", '{"episode_skill": ""}', _J):
    stats.record(skills.parse_analysis(reply))
  assert stats.as_dict() == {"parsed": 3, "failed": 2, "parse_rate": 0.6,
                             "failed/empty_skill": 1, "failed/no_json": 1}
  assert skills.ParseStats().rate == 0.0


_JSONISH = st.lists(st.sampled_from(
    ["{", "}", "[", "]", '"', "'", ",", ":", "\\", "```", "```json\n", "\n",
     " ", "episode_skill", "episode_summary", "step_skills", "step 3", "True",
     "null", "1", "x", "é", "😀"]), max_size=60).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(), _JSONISH))
def test_parse_never_raises(text):
  got = skills.parse_analysis(text)
  assert isinstance(got, (Analysis, ParseError))
  if isinstance(got, Analysis):
    assert got.skill and got.skill == got.skill.strip()


@settings(max_examples=200, deadline=None)
@given(summary=st.text(), skill=st.text().filter(lambda s: s.strip()),
       ascii_only=st.booleans(),
       wrap=st.sampled_from(["none", "fence", "prose"]))
def test_parse_round_trips_json_dumps(summary, skill, ascii_only, wrap):
  text = json.dumps({"episode_summary": summary, "episode_skill": skill},
                    ensure_ascii=ascii_only)
  if wrap == "fence":
    text = f"```json\n{text}\n```"
  elif wrap == "prose":
    text = f"Here is the analysis:\n{text}\nDone."
  assert skills.parse_analysis(text) == Analysis(summary.strip(), skill.strip())


def test_a_reply_cut_at_its_budget_fails_as_truncated():
  whole = '{"episode_summary": "s", "episode_skill": "Open the fridge."}'
  got = skills.parse_analysis(whole[:30], truncated=True)
  assert isinstance(got, skills.ParseError) and got.reason == "truncated"
  assert skills.parse_analysis(whole[:30]).reason == "no_json"
  # Cut but complete enough: parsed as any reply.
  assert skills.parse_analysis(whole, truncated=True).skill == "Open the fridge."
  stats = skills.ParseStats()
  stats.record(skills.parse_analysis('{"episode_skill": ""', truncated=True))
  assert stats.as_dict()["failed/truncated"] == 1
