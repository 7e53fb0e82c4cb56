"""Golden tests for rollout prompts and the text -> action projection."""

import pytest

from seed_jax import envs
from seed_jax import prompts

INSTRUCTION = (
    "You should first reason step-by-step about the current situation. This "
    "reasoning process MUST be enclosed within <think> </think> tags. Once "
    "you've finished your reasoning, you should choose an admissible action "
    "for current step and present it within <action> </action> tags.")
ROOM = ("You are in the middle of a room. Looking quickly around you, you see "
        "a fridge 1.")


def test_household_prompt_first_step():
  got = prompts.household_prompt(
      "put a mug in fridge", [],
      ROOM + "\n\nYour task is to: put a mug in fridge.",
      ["go to fridge 1", "inventory", "look"])
  assert got == (
      "You are an expert agent operating in the ALFRED Embodied Environment.\n"
      "Your task is to: put a mug in fridge.\n"
      f"Your current observation is: {ROOM}\n"
      "Your admissible actions of the current situation are: ['go to fridge "
      "1', 'inventory', 'look'].\n"
      f"{INSTRUCTION}\n"
      "Now it's your turn to take an action.")


def test_household_prompt_with_history():
  history = [(ROOM + "\n\nYour task is to: put a mug in fridge.", "look"),
             (ROOM, "go to fridge 1"),
             ("You arrive at fridge 1. The fridge 1 is closed.",
              "open fridge 1")]
  got = prompts.household_prompt(
      "put a mug in fridge", history,
      "You open the fridge 1. The fridge 1 is open. In it, you see nothing.",
      ["close fridge 1"], history_length=2)
  assert got == (
      "You are an expert agent operating in the ALFRED Embodied Environment.\n"
      "Your task is to: put a mug in fridge.\n"
      "Prior to this step, you have already taken 3 step(s). Below are the "
      "most recent 2 observations and the corresponding actions you took:\n"
      f"[Observation 2: '{ROOM}', Action 2: 'go to fridge 1']\n"
      "[Observation 3: 'You arrive at fridge 1. The fridge 1 is closed.', "
      "Action 3: 'open fridge 1']\n"
      "You are now at step 4 and your current observation is: You open the "
      "fridge 1. The fridge 1 is open. In it, you see nothing.\n"
      "Your admissible actions of the current situation are: ['close fridge "
      "1'].\n"
      f"{INSTRUCTION}\n"
      "Now it's your turn to take an action.")


def test_sokoban_prompt():
  got = prompts.sokoban_prompt(
      "push every box (X) onto a target (O)", [("####\n#PXO\n####", "left")],
      "####\n#PXO\n####", ["up", "down", "left", "right"], history_length=5)
  assert got == (
      "You are an expert agent operating in the Sokoban environment.\n"
      "Symbols: # wall, _ floor, O target, X box, √ box on target, P player, "
      "S player on target.\n"
      "Your goal is to push every box (X) onto a target (O).\n"
      "Rules: you can only push boxes, never pull them, and not into walls. "
      "Never push a box into a corner or against a wall where it cannot reach "
      "a target.\n"
      "Prior to this step, you have already taken 1 step(s). Below are the "
      "most recent 1 observations and the corresponding actions you took:\n"
      "[Observation 1:\n####\n#PXO\n####\nAction 1: 'left']\n"
      "You are now at step 2 and your current observation is:\n"
      "####\n#PXO\n####\n"
      'Your admissible actions are ["up", "down", "left", "right"].\n'
      f"{INSTRUCTION}\n"
      "Now it's your turn to make a move (choose ONE action only for the "
      "current step).")


@pytest.mark.parametrize("name,task_line", [("household", "Your task is to: "),
                                            ("sokoban", "Your goal is to ")])
def test_build_prompt_shape_for_real_episodes(name, task_line):
  env = envs.make(name)
  obs, info = env.reset(5)
  history = []
  for _ in range(4):
    prompt = prompts.build_prompt(name, env.task, history, obs,
                                  info["admissible_actions"])
    lines = prompt.split("\n")
    assert lines[-1].startswith("Now it's your turn")
    assert sum(l.startswith(task_line) for l in lines) == 1
    assert f"{task_line}{env.task}." in lines
    action = info["admissible_actions"][-1]
    new_obs, _, _, info = env.step(action)
    history.append((obs, action))
    obs = new_obs
  assert "Observation 3:" in prompt and "Observation 1:" not in prompt


def test_build_prompt_unknown_env():
  with pytest.raises(ValueError, match="household"):
    prompts.build_prompt("webshop", "t", [], "o", [])


ADMISSIBLE = ["look", "go to desk 1", "move pen 1 to desk 1"]


@pytest.mark.parametrize("text,expected", [
    ("<think>the pen goes there</think><action>go to desk 1</action>",
     ("go to desk 1", True)),
    ("<THINK>x</THINK>\n<Action> Go  to DESK 1 </Action>",
     ("go to desk 1", True)),  # upper case, extra spaces
    ("<think>x</think><action>go to desk 1</action><action>look</action>",
     ("go to desk 1", True)),  # two actions: the first counts
    ("<think>x</think><action>go to desk 1, look</action>",
     ("look", False)),  # two actions in one tag
    ("<think>x</think> go to desk 1", ("look", False)),  # missing action tags
    ("<think>x</think><action>go to desk 1", ("look", False)),  # unclosed
    ("<action>go to desk 1</action>", ("look", False)),  # missing think
    ("<think>x<action>go to desk 1</action>", ("look", False)),  # no </think>
    ("", ("look", False)),
    ("<think></think><action></action>", ("look", False)),  # empty action
    ("<think>x</think><action>go to desk 2</action>",
     ("look", False)),  # not admissible
    ("<think>x</think><action>put pen 1 in/on desk 1</action>",
     ("move pen 1 to desk 1", True)),  # ALFWorld's older wording
    ("<think>" + "hmm " * 50_000 + "</think><action>look</action>",
     ("look", True)),  # very long reasoning
    ("<think>x</think><action>" + "go " * 400 + "</action>",
     ("look", False)),  # very long action
])
def test_project_action(text, expected):
  assert prompts.project_action(text, ADMISSIBLE) == expected


def test_project_action_fallbacks():
  bad = "no tags at all"
  assert prompts.project_action(bad, ["up", "down"]) == ("up", False)
  assert prompts.project_action(bad, []) == ("", False)
  assert prompts.project_action(bad, ["up"], fallback="still") == (
      "still", False)
  assert prompts.project_action(None, ["up"]) == ("up", False)
  free = "<think>x</think><action>anything at all</action>"
  assert prompts.project_action(free, []) == ("anything at all", True)
  assert prompts.project("household", bad, ["go to desk 1"]) == (
      "look", False)
  assert prompts.project("sokoban", bad, ["up"]) == ("still", False)
  tried = "<think>t</think><action>go to bed 1</action>"
  assert prompts.project("household", tried, ["go to desk 1"]) == (
      "look", False)
  assert prompts.project("household", tried, ["go to desk 1"],
                         invalid_action="as_written") == ("go to bed 1", False)
  assert prompts.project("household", bad, ["go to desk 1"],
                         invalid_action="as_written") == ("look", False)
  with pytest.raises(ValueError, match="invalid_action must be one of"):
    prompts.project("household", tried, ["go to desk 1"],
                    invalid_action="nothing")
  # An environment of the user's own falls back to its own no-op.
  assert prompts.project("mine", bad, ["go north", "wait"], no_op="wait") == (
      "wait", False)
  assert prompts.project("mine", bad, ["go north", "wait"]) == (
      "go north", False)
  assert prompts.project("sokoban", "<think>t</think><action>Up</action>",
                         ["up", "down", "left", "right"]) == ("up", True)


def test_twx_prompt_names_its_game_and_keeps_the_task_punctuation():
  text = prompts.build_prompt(
      "twx", "You are hungry! Let's cook a delicious meal. Once done, enjoy "
      "your meal!", [], "You are in the kitchen.", ["look around"])
  lines = text.splitlines()
  assert lines[0] == ("You are an expert agent operating in a TextWorldExpress "
                      "text game.")
  assert lines[1].endswith("enjoy your meal!")
  household = prompts.build_prompt("household", "put a mug in desk", [],
                                   "You are in a room.", ["look"])
  assert household.splitlines()[:2] == [
      "You are an expert agent operating in the ALFRED Embodied Environment.",
      "Your task is to: put a mug in desk."]


def test_attempted_action_is_what_the_reply_asked_for():
  assert prompts.attempted_action(
      "<think>x</think><action> Take  MUG 1 from desk 1 </action>") == (
          "take mug 1 from desk 1")
  # Without a <think> block the reply is invalid, yet it tried the action.
  assert prompts.attempted_action("<action>go to desk 1</action>") == (
      "go to desk 1")
  assert prompts.project_action("<action>go to desk 1</action>",
                                ["look", "go to desk 1"]) == ("look", False)
  for reply in ("", None, "go to desk 1", "<action>go to desk 1",
                "<action></action>"):
    assert prompts.attempted_action(reply) == ""
