"""Household task generation: rooms, object tables, seen/unseen splits.

A task is generated from a seed alone (pure Python `random.Random(seed)`), so
every member of a group, every run and every machine sees the same world.

Seen/unseen rule (the ALFWorld "unseen" split stands in for new rooms and new
object placements; ours is deterministic and checkable):
  * a task's combination is (object type, target type), where the target type
    is the receptacle type it must end in, or "desklamp" for look_at_in_light;
    UNSEEN_COMBOS lists the combinations reserved for the unseen split;
  * a layout is the room plus its receptacle counts, e.g.
    "kitchen:cabinet=3,countertop=2,..."; it is unseen iff
    zlib.crc32(layout) % 4 == 0.
Train and eval_seen tasks use only seen combinations AND seen layouts;
eval_unseen tasks use only unseen combinations AND unseen layouts.
"""

from __future__ import annotations

import dataclasses
import random
import zlib

from seed_jax.envs import base

FAMILIES = ("pick", "clean", "heat", "cool", "look_at_in_light", "pick_two")

OPENABLE = frozenset({"cabinet", "drawer", "fridge", "microwave", "safe"})
# Appliance each processing family must use, and its verb.
APPLIANCE = {"clean": "sinkbasin", "heat": "microwave", "cool": "fridge"}
PROCESSED = {"clean": "clean", "heat": "hot", "cool": "cool"}

# Room -> (receptacle type -> (min, max) count, object types found there).
ROOMS: dict[str, tuple[dict[str, tuple[int, int]], tuple[str, ...]]] = {
    "kitchen": ({"cabinet": (2, 4), "coffeemachine": (1, 1),
                 "countertop": (1, 2), "diningtable": (0, 1),
                 "drawer": (1, 3), "fridge": (1, 1), "garbagecan": (1, 1),
                 "microwave": (1, 1), "shelf": (0, 2), "sinkbasin": (1, 1),
                 "stoveburner": (1, 2)},
                ("apple", "bread", "cup", "dishsponge", "egg", "fork", "knife",
                 "lettuce", "mug", "pan", "peppershaker", "plate", "pot",
                 "potato", "saltshaker", "spoon", "tomato", "winebottle")),
    "bathroom": ({"bathtubbasin": (1, 1), "cabinet": (2, 4),
                  "countertop": (1, 1), "drawer": (1, 2), "garbagecan": (1, 1),
                  "shelf": (0, 2), "sinkbasin": (1, 1), "toilet": (1, 1)},
                 ("candle", "cloth", "soapbar", "soapbottle", "spraybottle",
                  "toiletpaper")),
    "bedroom": ({"bed": (1, 1), "desk": (1, 1), "drawer": (2, 3),
                 "dresser": (1, 1), "garbagecan": (1, 1), "safe": (0, 1),
                 "shelf": (1, 2), "sidetable": (1, 2)},
                ("alarmclock", "book", "cd", "cellphone", "creditcard",
                 "keychain", "laptop", "pen", "pencil", "pillow")),
    "livingroom": ({"armchair": (0, 1), "cabinet": (0, 2),
                    "coffeetable": (1, 1), "drawer": (1, 2),
                    "garbagecan": (1, 1), "shelf": (1, 2), "sidetable": (1, 2),
                    "sofa": (1, 1)},
                   ("creditcard", "keychain", "laptop", "newspaper", "pillow",
                    "remotecontrol", "statue", "vase", "watch")),
}

_DESK_SMALL = ("desk", "drawer", "dresser", "shelf", "sidetable", "coffeetable")
# Object type -> receptacle types it can lie in (spawn places and task targets).
PLACES: dict[str, tuple[str, ...]] = {
    "apple": ("countertop", "diningtable", "fridge", "garbagecan", "microwave"),
    "bread": ("cabinet", "countertop", "diningtable", "fridge"),
    "cup": ("cabinet", "countertop", "diningtable", "fridge", "microwave",
            "shelf", "sinkbasin"),
    "dishsponge": ("cabinet", "countertop", "drawer", "sinkbasin"),
    "egg": ("countertop", "fridge", "garbagecan", "microwave", "sinkbasin"),
    "fork": ("countertop", "diningtable", "drawer", "sinkbasin"),
    "knife": ("countertop", "diningtable", "drawer", "sinkbasin"),
    "lettuce": ("countertop", "diningtable", "fridge", "sinkbasin"),
    "mug": ("cabinet", "coffeemachine", "countertop", "microwave", "shelf",
            "sinkbasin"),
    "pan": ("cabinet", "countertop", "diningtable", "stoveburner"),
    "peppershaker": ("cabinet", "countertop", "diningtable", "drawer", "shelf"),
    "plate": ("cabinet", "countertop", "diningtable", "fridge", "shelf"),
    "pot": ("cabinet", "countertop", "diningtable", "fridge", "stoveburner"),
    "potato": ("countertop", "diningtable", "fridge", "garbagecan",
               "microwave"),
    "saltshaker": ("cabinet", "countertop", "diningtable", "drawer", "shelf"),
    "spoon": ("countertop", "diningtable", "drawer", "sinkbasin"),
    "tomato": ("countertop", "diningtable", "fridge", "garbagecan",
               "microwave"),
    "winebottle": ("cabinet", "countertop", "diningtable", "fridge", "shelf"),
    "candle": ("cabinet", "countertop", "drawer", "shelf", "toilet"),
    "cloth": ("bathtubbasin", "cabinet", "countertop", "drawer", "sinkbasin"),
    "soapbar": ("bathtubbasin", "cabinet", "countertop", "garbagecan",
                "sinkbasin", "toilet"),
    "soapbottle": ("cabinet", "countertop", "shelf", "toilet"),
    "spraybottle": ("cabinet", "countertop", "drawer", "shelf", "toilet"),
    "toiletpaper": ("cabinet", "countertop", "drawer", "garbagecan", "shelf",
                    "toilet"),
    "alarmclock": ("desk", "dresser", "shelf", "sidetable"),
    "book": ("bed", "coffeetable", "desk", "drawer", "dresser", "shelf",
             "sidetable", "sofa"),
    "cd": ("desk", "drawer", "dresser", "garbagecan", "safe", "shelf",
           "sidetable"),
    "cellphone": ("armchair", "bed", "coffeetable", "desk", "drawer",
                  "dresser", "safe", "sidetable", "sofa"),
    "creditcard": ("armchair", "sofa") + _DESK_SMALL,
    "keychain": ("armchair", "safe", "sofa") + _DESK_SMALL,
    "laptop": ("armchair", "bed", "coffeetable", "desk", "dresser", "sofa"),
    "newspaper": ("armchair", "coffeetable", "drawer", "garbagecan",
                  "sidetable", "sofa"),
    "pen": ("desk", "drawer", "dresser", "garbagecan", "shelf", "sidetable"),
    "pencil": ("desk", "drawer", "dresser", "garbagecan", "shelf", "sidetable"),
    "pillow": ("armchair", "bed", "sofa"),
    "remotecontrol": ("armchair", "cabinet", "coffeetable", "drawer",
                      "sidetable", "sofa"),
    "statue": ("cabinet", "coffeetable", "dresser", "shelf", "sidetable"),
    "vase": ("cabinet", "coffeetable", "shelf", "sidetable"),
    "watch": ("coffeetable", "drawer", "dresser", "safe", "shelf",
              "sidetable"),
}

# Which object types a family may ask for, and in which rooms.
FAMILY_OBJECTS = {
    "clean": frozenset({"apple", "cloth", "cup", "dishsponge", "egg", "fork",
                        "knife", "lettuce", "mug", "pan", "plate", "pot",
                        "potato", "soapbar", "spoon", "tomato"}),
    "heat": frozenset({"apple", "bread", "cup", "egg", "mug", "plate",
                       "potato", "tomato"}),
    "cool": frozenset({"apple", "bread", "cup", "egg", "lettuce", "mug", "pan",
                       "plate", "pot", "potato", "tomato", "winebottle"}),
    "look_at_in_light": frozenset({"alarmclock", "book", "cd", "cellphone",
                                   "creditcard", "keychain", "newspaper", "pen",
                                   "pencil", "remotecontrol", "statue", "vase",
                                   "watch"}),
}
FAMILY_ROOMS = {
    "pick": tuple(ROOMS), "pick_two": tuple(ROOMS),
    "clean": ("kitchen", "bathroom"), "heat": ("kitchen",),
    "cool": ("kitchen",), "look_at_in_light": ("bedroom", "livingroom"),
}
# Rooms with a desk lamp, and the receptacle types it may stand on.
LAMP_PLACES = {"bedroom": ("desk", "sidetable"), "livingroom": ("sidetable",)}

UNSEEN_COMBOS = frozenset({
    ("apple", "diningtable"), ("cup", "shelf"), ("tomato", "countertop"),
    ("plate", "cabinet"), ("knife", "drawer"), ("winebottle", "shelf"),
    ("pan", "stoveburner"), ("soapbar", "countertop"),
    ("spraybottle", "toilet"), ("book", "bed"), ("keychain", "sidetable"),
    ("remotecontrol", "sofa"), ("cd", "desklamp"), ("watch", "desklamp"),
    ("pencil", "desklamp"),
})
_IN_TYPES = OPENABLE | {"bathtubbasin", "coffeemachine", "garbagecan",
                        "sinkbasin"}


def layout_is_unseen(layout: str) -> bool:
  """The layout rule of the unseen split (see module docstring)."""
  return zlib.crc32(layout.encode()) % 4 == 0


def combo_is_unseen(obj_type: str, target_type: str) -> bool:
  return (obj_type, target_type) in UNSEEN_COMBOS


@dataclasses.dataclass
class World:
  """Full (hidden) state of one household task."""
  seed: int
  room: str
  layout: str
  family: str
  obj_type: str
  target_type: str  # receptacle type, or "desklamp" for look_at_in_light
  receptacles: list[str]  # "cabinet 1", ... sorted by type then number
  contents: dict[str, list[str]]  # receptacle -> objects in it, in order
  closed: set[str]
  lamp_at: str | None = None  # receptacle holding "desklamp 1"
  lamp_on: bool = False
  location: str | None = None  # None: the middle of the room
  holding: str | None = None
  states: dict[str, set[str]] = dataclasses.field(
      default_factory=lambda: {"clean": set(), "hot": set(), "cool": set()})
  # What the agent did, for ground truth.
  visited: list[str] = dataclasses.field(default_factory=list)
  opened: list[str] = dataclasses.field(default_factory=list)
  taken: list[str] = dataclasses.field(default_factory=list)
  used: list[str] = dataclasses.field(default_factory=list)  # "heat microwave 1"
  # (verb, object, appliance) per processing: ("heat", "mug 1", "microwave 1").
  processed: list[tuple[str, str, str]] = dataclasses.field(
      default_factory=list)
  moved: list[tuple[str, str]] = dataclasses.field(default_factory=list)

  def copy(self) -> "World":
    """An independent copy (containers copied, strings shared)."""
    return dataclasses.replace(
        self, receptacles=list(self.receptacles),
        contents={r: list(objs) for r, objs in self.contents.items()},
        closed=set(self.closed),
        states={k: set(v) for k, v in self.states.items()},
        visited=list(self.visited), opened=list(self.opened),
        taken=list(self.taken), used=list(self.used),
        processed=list(self.processed), moved=list(self.moved))

  @property
  def task(self) -> str:
    """e.g. "put a clean mug in coffeemachine" (no final period)."""
    t, r = self.obj_type, self.target_type
    if self.family == "look_at_in_light":
      return f"look at {t} under the desklamp"
    prep = "in" if r in _IN_TYPES else "on"
    adjective = {"clean": "clean ", "heat": "hot ", "cool": "cool "}
    if self.family == "pick_two":
      return f"put two {t} {prep} {r}"
    return f"put a {adjective.get(self.family, '')}{t} {prep} {r}"

  def where(self, obj: str) -> str | None:
    for r, objs in self.contents.items():
      if obj in objs:
        return r
    return None

  def instances(self, obj_type: str) -> list[str]:
    """Objects of a type anywhere (held included), sorted by number."""
    found = [o for objs in self.contents.values() for o in objs
             if kind(o) == obj_type]
    if self.holding and kind(self.holding) == obj_type:
      found.append(self.holding)
    return sorted(found, key=name_key)

  def goal_met(self) -> bool:
    """Whether the task is accomplished (pick_two: both in one receptacle)."""
    t, fam = self.obj_type, self.family
    if fam == "look_at_in_light":
      return (self.holding is not None and kind(self.holding) == t
              and self.lamp_on and self.location == self.lamp_at)
    targets = [r for r in self.receptacles if kind(r) == self.target_type]
    need = PROCESSED.get(fam)
    for r in targets:
      good = [o for o in self.contents[r] if kind(o) == t
              and (need is None or o in self.states[need])]
      if len(good) >= (2 if fam == "pick_two" else 1):
        return True
    return False


def kind(name: str) -> str:
  """Type of a named thing: kind("cabinet 3") == "cabinet"."""
  return name.rsplit(" ", 1)[0]


def name_key(name: str) -> tuple[str, int]:
  """Sort key that orders "cabinet 2" before "cabinet 10"."""
  t, n = name.rsplit(" ", 1)
  return t, int(n)


def generate(seed: int, *, unseen: bool = False,
             families: tuple[str, ...] = FAMILIES) -> World:
  """Generates the task world of a seed.

  Args:
    seed: task seed.
    unseen: draw from the unseen split (unseen combination and layout).
    families: families to draw from; the family is families[seed % len].

  Returns:
    A World whose goal is not met yet.

  Raises:
    ValueError: a negative seed, no families or an unknown one.
  """
  base.check_seed(seed)
  if not families:
    raise ValueError("families is empty")
  for f in families:
    if f not in FAMILIES:
      raise ValueError(f"unknown family {f!r}; known: {FAMILIES}")
  family = families[seed % len(families)]
  rng = random.Random(seed * 2 + int(unseen))
  for _ in range(1000):
    world = _try_generate(rng, seed, family, unseen)
    if world is not None:
      return world
  raise RuntimeError(f"no household task for seed {seed} ({family})")


def layout_receptacles(layout: str) -> list[str]:
  """The receptacles a layout names, by type then number, as a world lists
  them: layout_receptacles("kitchen:fridge=1,cabinet=2") == ["cabinet 1",
  "cabinet 2", "fridge 1"]."""
  _, _, spec = layout.partition(":")
  counts = dict(part.split("=") for part in spec.split(",") if part)
  return [f"{t} {i}" for t in sorted(counts)
          for i in range(1, int(counts[t]) + 1)]


def _pick_layout(rng: random.Random, room: str, unseen: bool
                 ) -> tuple[str, dict[str, int]]:
  spec = ROOMS[room][0]
  while True:
    counts = {t: rng.randint(lo, hi) for t, (lo, hi) in spec.items()}
    layout = room + ":" + ",".join(f"{t}={n}" for t, n in counts.items() if n)
    if layout_is_unseen(layout) == unseen:
      return layout, counts


def _try_generate(rng: random.Random, seed: int, family: str,
                  unseen: bool) -> World | None:
  room = rng.choice(FAMILY_ROOMS[family])
  layout, counts = _pick_layout(rng, room, unseen)
  receptacles = layout_receptacles(layout)
  room_objects = ROOMS[room][1]
  candidates = [o for o in room_objects
                if o in FAMILY_OBJECTS.get(family, room_objects)]
  obj_type = rng.choice(candidates)
  places = [t for t in PLACES[obj_type] if t in counts and counts[t]]
  if family == "look_at_in_light":
    target_type = "desklamp"
  else:
    targets = [t for t in places if t != APPLIANCE.get(family)]
    if not targets:
      return None
    target_type = rng.choice(targets)
  if combo_is_unseen(obj_type, target_type) != unseen:
    return None
  spawn = [r for r in receptacles if kind(r) in places
           and kind(r) != target_type]
  if not spawn:
    return None
  contents: dict[str, list[str]] = {r: [] for r in receptacles}
  numbers: dict[str, int] = {}

  def place(t: str, where: list[str]) -> None:
    numbers[t] = numbers.get(t, 0) + 1
    contents[rng.choice(where)].append(f"{t} {numbers[t]}")

  for _ in range(rng.randint(2, 3) if family == "pick_two"
                 else rng.randint(1, 2)):
    place(obj_type, spawn)
  for t in rng.sample([o for o in room_objects if o != obj_type],
                      rng.randint(3, 5)):
    where = [r for r in receptacles if kind(r) in PLACES[t]]
    if where:
      place(t, where)
  lamp_at = None
  if room in LAMP_PLACES:
    lamp_at = rng.choice([r for r in receptacles
                          if kind(r) in LAMP_PLACES[room]])
  for objs in contents.values():
    rng.shuffle(objs)
  closed = {r for r in receptacles if kind(r) in OPENABLE}
  return World(seed=seed, room=room, layout=layout, family=family,
               obj_type=obj_type, target_type=target_type,
               receptacles=receptacles, contents=contents, closed=closed,
               lamp_at=lamp_at)
