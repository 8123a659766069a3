"""Generated user_sim scenarios: a desk, a user with a request, and the facts the user reveals when asked.

Four desks (hotel, restaurant, clinic, taxi) each need three or four details. A scenario draws
the user's name and request values from a seeded generator and writes the persona (for a
policy-driven user), the scripted facts with the keywords that trigger them, and the expected
submission. A hash of the scenario picks its split (`gym_bridge.core.split`), so splits never
overlap. `python -m environments.user_sim.generate` rewrites data/example.jsonl.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from gym_bridge import draw_split

FIRST = ["Ada", "Alan", "Grace", "Edsger", "Barbara", "Donald", "Frances", "John", "Margaret", "Tim", "Radia", "Ken"]
LAST = ["Lovelace", "Turing", "Hopper", "Dijkstra", "Liskov", "Knuth", "Allen", "McCarthy", "Hamilton", "Berners-Lee", "Perlman", "Thompson"]
STREETS = ["Elm Street", "Harbour Road", "Mill Lane", "Station Square", "Oak Avenue", "Bridge Street"]

SUBMIT_TOOL = {
    "type": "function",
    "name": "submit_request",
    "description": "File the user's request once you know every detail.",
    "parameters": {
        "type": "object",
        "properties": {
            "fields": {
                "type": "object",
                "additionalProperties": {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "number"}]},
                "description": 'Each detail of the request by its field name, e.g. {"guest_name": "Ada Lovelace"}.',
            }
        },
        "required": ["fields"],
        "additionalProperties": False,
    },
    "strict": False,
}


def _date(rng: random.Random) -> str:
    return f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _desk(rng: random.Random) -> dict[str, Any]:
    name = f"{rng.choice(FIRST)} {rng.choice(LAST)}"
    kind = rng.choice(["hotel", "restaurant", "clinic", "taxi"])
    if kind == "hotel":
        nights, date = rng.randint(1, 7), _date(rng)
        return {
            "kind": "hotel", "desk": "the front desk of Hotel Aurora", "goal": "book a room", "opening": "Hello, I'd like to book a room.",
            "fields": {"guest_name": name, "check_in": date, "nights": str(nights)},
            "facts": [
                (["name"], f"My name is {name}."),
                (["date", "when", "check-in", "check in", "arriv"], f"I'll arrive on {date}."),
                (["night", "how long", "stay"], f"{nights} night{'s' * (nights > 1)}, please."),
            ],
            "persona": f"You are {name}. You want a room at Hotel Aurora from {date} for {nights} night(s).",
        }
    if kind == "restaurant":
        people, date, time = rng.randint(2, 8), _date(rng), f"{rng.randint(17, 21)}:{rng.choice(['00', '30'])}"
        return {
            "kind": "restaurant", "desk": "the reservations line of Trattoria Roma", "goal": "reserve a table", "opening": "Hi! Can I reserve a table?",
            "fields": {"guest_name": name, "date": date, "time": time, "party_size": str(people)},
            "facts": [
                (["name"], f"It's {name}."),
                (["date", "day", "when"], f"On {date}."),
                (["time", "what hour", "o'clock"], f"At {time}."),
                (["how many", "people", "party", "guests", "size"], f"We'll be {people}."),
            ],
            "persona": f"You are {name}. You want a table for {people} at Trattoria Roma on {date} at {time}.",
        }
    if kind == "clinic":
        date, reason = _date(rng), rng.choice(["a check-up", "a flu shot", "a sore knee", "a blood test"])
        born = f"19{rng.randint(50, 99)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        return {
            "kind": "clinic", "desk": "the appointment desk of Riverside Clinic", "goal": "book an appointment", "opening": "Hello, I need an appointment.",
            "fields": {"patient_name": name, "date_of_birth": born, "date": date, "reason": reason},
            "facts": [
                (["name"], f"I'm {name}."),
                (["birth", "born", "date of birth"], f"I was born on {born}."),
                (["which day", "when", "appointment date", "what date"], f"Could it be on {date}?"),
                (["reason", "why", "what for", "problem", "symptom"], f"It's for {reason}."),
            ],
            "persona": f"You are {name}, born {born}. You want an appointment at Riverside Clinic on {date} for {reason}.",
        }
    pickup, time, destination = f"{rng.randint(1, 99)} {rng.choice(STREETS)}", f"{rng.randint(6, 22):02d}:{rng.choice(['00', '15', '30', '45'])}", rng.choice(["the airport", "the central station", "the city museum"])
    return {
        "kind": "taxi", "desk": "the dispatch line of City Cabs", "goal": "order a taxi", "opening": "Hi, I need a taxi.",
        "fields": {"passenger_name": name, "pickup_address": pickup, "pickup_time": time, "destination": destination},
        "facts": [
            (["name"], f"The name is {name}."),
            (["pick", "address", "where are you", "where should"], f"Pick me up at {pickup}."),
            (["time", "when"], f"At {time}."),
            (["destination", "where to", "going", "drop"], f"I'm going to {destination}."),
        ],
        "persona": f"You are {name}. You want a taxi from {pickup} at {time} to {destination}.",
    }


def scenario_row(rng: random.Random, split: str) -> dict[str, Any]:
    desk = _desk(rng)
    fields = ", ".join(desk["fields"])
    system = (
        f"You are {desk['desk']}. Help the user {desk['goal']}. You need these details: {fields}. "
        "Ask the user for what you do not know, one question at a time. When you know every detail, call "
        "submit_request with all of them (dates as YYYY-MM-DD), then confirm to the user."
    )
    return {
        "responses_create_params": {
            "input": [{"role": "system", "content": system}, {"role": "user", "content": desk["opening"]}],
            "tools": [SUBMIT_TOOL],
        },
        "agent_ref": {"type": "responses_api_agents", "name": "user_sim"},
        "user_sim": {
            "persona": desk["persona"] + " Answer only what you are asked; do not give all details at once.",
            "facts": [{"keywords": keywords, "reply": reply} for keywords, reply in desk["facts"]],
            "fallback": f"Sorry, I'm not sure what you need. I'd just like to {desk['goal']}.",
            "max_user_turns": len(desk["facts"]) + 2,
        },
        "expected_request": desk["fields"],
        "scenario": desk["kind"],
        "split": split,
    }


def prepare_user_sim_rows(*, split: str, size: int, seed: int) -> list[dict[str, Any]]:
    """`size` distinct scenarios of `split` (`train` or `validation`), the same for the same seed."""
    return draw_split(
        lambda rng: scenario_row(rng, split), lambda row: json.dumps(row["expected_request"], sort_keys=True),
        split=split, size=size, seed=seed,
    )


if __name__ == "__main__":
    path = Path(__file__).parent / "data" / "example.jsonl"
    with path.open("w", encoding="utf-8") as handle:
        rows = prepare_user_sim_rows(split="validation", size=40, seed=0)
        for kind in ("hotel", "restaurant", "clinic", "taxi"):
            for row in [row for row in rows if row["scenario"] == kind][:2]:
                handle.write(json.dumps(row) + "\n")
    print(f"wrote {path}")
