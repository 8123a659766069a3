"""Generate workplace_assistant task rows with ground-truth tool calls from a seeded world.

    python -m environments.workplace_assistant.generate_tasks --per-category 10 --seed 0 \
        --output environments/workplace_assistant/data/example.jsonl

Each template picks records of the world (seed `world_seed`) with a seeded random generator, writes
a request in plain words and the tool calls that carry it out. Requests name things the model must
look up (an email by sender and subject, a task by name), never ids. The same arguments always give
the same file; `gym-bridge data prepare workplace_assistant` calls `generate_rows`.
"""

from __future__ import annotations

import argparse
import json
import random
import sqlite3
from collections.abc import Callable
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from environments.workplace_assistant import world

Call = dict[str, str]
Template = Callable[[sqlite3.Connection, random.Random], tuple[str, list[Call]] | None]
AGENT_NAME = "workplace_assistant"
ME = world.address(world.EMPLOYEES[0])


def call(name: str, **arguments: str) -> Call:
    """A ground-truth call in NeMo Gym's form: arguments as JSON text."""
    return {"name": name, "arguments": json.dumps(arguments)}


def first(email: str) -> str:
    return email.split(".")[0].capitalize()


def full(email: str) -> str:
    return " ".join(part.capitalize() for part in email.split("@")[0].split("."))


def pick(db: sqlite3.Connection, rng: random.Random, sql: str, *params: Any) -> sqlite3.Row | None:
    rows = list(db.execute(sql, params))
    return rng.choice(rows) if rows else None


def day_words(day: str) -> str:
    """'Monday, May 20' for '2024-05-20'."""
    value = date.fromisoformat(day[:10])
    return f"{value:%A}, {value:%B} {value.day}"


def colleague(db: sqlite3.Connection, rng: random.Random, *, besides: tuple[str, ...] = ()) -> str:
    return rng.choice([r[0] for r in db.execute("SELECT email_address FROM directory") if r[0] != ME and r[0] not in besides])


# --- email -------------------------------------------------------------------------------------

REPLIES = ("Thanks, I will take a look tomorrow.", "Got it, thank you!", "Sounds good, let's discuss on Monday.",
           "Thanks for the update.", "Looks great, approved.")


def reply_to_latest(db, rng):
    email = pick(db, rng, 'SELECT * FROM emails WHERE "inbox/outbox" = \'inbox\'')
    latest = db.execute('SELECT email_id FROM emails WHERE "sender/recipient" = ? AND subject = ? ORDER BY sent_datetime DESC',
                        (email["sender/recipient"], email["subject"])).fetchone()[0]
    text = rng.choice(REPLIES)
    return (f"Reply to {first(email['sender/recipient'])}'s last email about '{email['subject']}' with '{text}'",
            [call("email_reply_email", email_id=latest, body=text)])


def forward_email(db, rng):
    email = pick(db, rng, 'SELECT * FROM emails WHERE "inbox/outbox" = \'inbox\'')
    latest = db.execute('SELECT email_id FROM emails WHERE "sender/recipient" = ? AND subject = ? ORDER BY sent_datetime DESC',
                        (email["sender/recipient"], email["subject"])).fetchone()[0]
    to = colleague(db, rng, besides=(email["sender/recipient"],))
    return (f"Forward {first(email['sender/recipient'])}'s latest email about '{email['subject']}' to {full(to)}",
            [call("email_forward_email", email_id=latest, recipient=to)])


def delete_emails_from(db, rng):
    sender = pick(db, rng, 'SELECT "sender/recipient" AS who FROM emails WHERE "inbox/outbox" = \'inbox\' AND subject LIKE \'Notes from%\'')
    if sender is None:
        return None
    ids = [r[0] for r in db.execute('SELECT email_id FROM emails WHERE "inbox/outbox" = \'inbox\' AND "sender/recipient" = ? '
                                    'AND subject LIKE \'Notes from%\' ORDER BY email_id', (sender["who"],))]
    return (f"Delete every meeting-notes email (subject starting with 'Notes from') that {full(sender['who'])} sent me",
            [call("email_delete_email", email_id=i) for i in ids])


# --- calendar ----------------------------------------------------------------------------------

MEETING_NAMES = ("Budget Review", "Client Kickoff", "Risk Workshop", "Hiring Sync", "Partner Briefing", "Demo Dry Run")


def rename_last_event(db, rng):
    event = pick(db, rng, "SELECT * FROM calendar_events WHERE event_start > ?", world.NOW)
    latest = db.execute("SELECT event_id FROM calendar_events WHERE substr(event_start, 1, 10) = ? ORDER BY event_start DESC",
                        (event["event_start"][:10],)).fetchone()[0]
    name = rng.choice(MEETING_NAMES)
    return (f"Change the name of the last event on {day_words(event['event_start'])} to {name}",
            [call("calendar_update_event", event_id=latest, field="event_name", new_value=name)])


def _unique_event(db, rng):
    for _ in range(20):
        event = pick(db, rng, "SELECT * FROM calendar_events WHERE event_start > ?", world.NOW)
        same = db.execute("SELECT COUNT(*) FROM calendar_events WHERE event_name = ? AND substr(event_start, 1, 10) = ?",
                          (event["event_name"], event["event_start"][:10])).fetchone()[0]
        if same == 1:
            return event
    return None


def cancel_event(db, rng):
    event = _unique_event(db, rng)
    if event is None:
        return None
    return (f"Cancel the {event['event_name']} on {day_words(event['event_start'])}",
            [call("calendar_delete_event", event_id=event["event_id"])])


def move_event(db, rng):
    event = _unique_event(db, rng)
    if event is None:
        return None
    hour = rng.choice([h for h in (9, 10, 11, 13, 14, 15, 16) if h != int(event["event_start"][11:13])])
    start = f"{event['event_start'][:10]} {hour:02d}:00:00"
    return (f"Move the {event['event_name']} on {day_words(event['event_start'])} to {hour if hour <= 12 else hour - 12}"
            f"{'am' if hour < 12 else 'pm'} the same day",
            [call("calendar_update_event", event_id=event["event_id"], field="event_start", new_value=start)])


def schedule_meeting(db, rng):
    who = colleague(db, rng)
    day = datetime.fromisoformat(world.NOW).date() + timedelta(days=rng.randrange(3, 20))
    while day.weekday() >= 5:
        day += timedelta(days=1)
    hour, minutes = rng.choice((9, 10, 11, 14, 15, 16)), rng.choice((30, 45, 60))
    name = rng.choice(MEETING_NAMES)
    return (f"Schedule a {minutes}-minute meeting called '{name}' with {full(who)} on {day.isoformat()} at {hour:02d}:00",
            [call("calendar_create_event", event_name=name, participant_email=who, event_start=f"{day.isoformat()} {hour:02d}:00:00",
                  duration=str(minutes))])


# --- analytics ---------------------------------------------------------------------------------

METRIC_WORDS = {"total_visits": "total visits", "session_duration_seconds": "session duration", "user_engaged": "engaged users",
                "visits_direct": "direct visits", "visits_referral": "referral visits", "visits_search_engine": "search engine visits",
                "visits_social_media": "social media visits"}


def _range(rng):
    end = datetime.fromisoformat(world.NOW).date() - timedelta(days=rng.randrange(0, 10))
    return (end - timedelta(days=rng.choice((6, 13, 20)))).isoformat(), end.isoformat()


def one_plot(db, rng):
    low, high = _range(rng)
    metric, kind = rng.choice(list(METRIC_WORDS)), rng.choice(world.PLOT_TYPES)
    return (f"Make a {kind} chart of {METRIC_WORDS[metric]} from {low} to {high}",
            [call("analytics_create_plot", time_min=low, time_max=high, value_to_plot=metric, plot_type=kind)])


def two_plots(db, rng):
    low, high = _range(rng)
    first_metric, second_metric = rng.sample(list(METRIC_WORDS), 2)
    return (f"For {low} to {high}, I need a line chart of {METRIC_WORDS[first_metric]} and a bar chart of {METRIC_WORDS[second_metric]}",
            [call("analytics_create_plot", time_min=low, time_max=high, value_to_plot=first_metric, plot_type="line"),
             call("analytics_create_plot", time_min=low, time_max=high, value_to_plot=second_metric, plot_type="bar")])


# --- project management --------------------------------------------------------------------------


def move_task(db, rng):
    task = pick(db, rng, "SELECT * FROM project_tasks")
    target = rng.choice([name for name in world.LISTS if name != task["list_name"]])
    return (f"Move the task '{task['task_name']}' to {target}",
            [call("project_management_update_task", task_id=task["task_id"], field="list_name", new_value=target)])


def reassign_task(db, rng):
    task = pick(db, rng, "SELECT * FROM project_tasks")
    to = colleague(db, rng, besides=(task["assigned_to_email"],))
    return (f"Reassign '{task['task_name']}' to {full(to)}",
            [call("project_management_update_task", task_id=task["task_id"], field="assigned_to_email", new_value=to)])


def create_task(db, rng):
    who = colleague(db, rng)
    feature = rng.choice(("a settings page", "SSO login", "an invoice generator", "bulk import", "a status page", "usage alerts"))
    board = rng.choice(world.BOARDS)
    due = (datetime.fromisoformat(world.NOW).date() + timedelta(days=rng.randrange(7, 40))).isoformat()
    name = f"Build {feature}"
    return (f"Create a task '{name}' on the {board} board for {full(who)}, due {due}, and put it in the Backlog",
            [call("project_management_create_task", task_name=name, assigned_to_email=who, list_name="Backlog", due_date=due, board=board)])


def delay_tasks(db, rng):
    person = pick(db, rng, "SELECT assigned_to_email AS who FROM project_tasks WHERE list_name = 'In Review'")
    tasks = list(db.execute("SELECT * FROM project_tasks WHERE list_name = 'In Review' AND assigned_to_email = ? ORDER BY task_id", (person["who"],)))
    due = (datetime.fromisoformat(world.NOW).date() + timedelta(days=rng.randrange(5, 15))).isoformat()
    return (f"Push the due date of every task {full(person['who'])} has In Review to {due}",
            [call("project_management_update_task", task_id=t["task_id"], field="due_date", new_value=due) for t in tasks])


def delete_task(db, rng):
    task = pick(db, rng, "SELECT * FROM project_tasks WHERE list_name = 'Completed'")
    return (f"Delete the completed task '{task['task_name']}'", [call("project_management_delete_task", task_id=task["task_id"])])


# --- customers ---------------------------------------------------------------------------------


def customer_status(db, rng):
    customer = pick(db, rng, "SELECT * FROM customers")
    status = rng.choice([s for s in world.STATUSES if s != customer["status"]])
    return (f"Set {customer['customer_name']}'s status to {status} in the CRM",
            [call("customer_relationship_manager_update_customer", customer_id=customer["customer_id"], field="status", new_value=status)])


def add_customer(db, rng):
    owner = colleague(db, rng)
    name = rng.choice(("Morgan Blake", "Jess Alvarez", "Chris Nakamura", "Pat Delgado", "Robin Seo", "Terry Osei"))
    company = rng.choice(world.CUSTOMER_COMPANIES)
    email = f"{name.lower().replace(' ', '.')}@{company}.com"
    product = rng.choice(world.PRODUCTS)
    return (f"Add {name} ({email}) to the CRM as a new Lead interested in {product}, assigned to {full(owner)}",
            [call("customer_relationship_manager_add_customer", customer_name=name, assigned_to_email=owner, status="Lead",
                  customer_email=email, product_interest=product)])


def reassign_customers(db, rng):
    pair = pick(db, rng, "SELECT assigned_to_email AS who, product_interest AS product FROM customers")
    customers = list(db.execute("SELECT customer_id FROM customers WHERE assigned_to_email = ? AND product_interest = ? ORDER BY customer_id",
                                (pair["who"], pair["product"])))
    to = colleague(db, rng, besides=(pair["who"],))
    return (f"{first(to)} is taking over all of {first(pair['who'])}'s customers interested in {pair['product']}. Reassign them in the CRM.",
            [call("customer_relationship_manager_update_customer", customer_id=c[0], field="assigned_to_email", new_value=to) for c in customers])


def delete_lost(db, rng):
    owner = pick(db, rng, "SELECT assigned_to_email AS who FROM customers WHERE status = 'Lost'")
    customers = list(db.execute("SELECT customer_id FROM customers WHERE assigned_to_email = ? AND status = 'Lost' ORDER BY customer_id", (owner["who"],)))
    return (f"Delete all of {first(owner['who'])}'s Lost customers from the CRM",
            [call("customer_relationship_manager_delete_customer", customer_id=c[0]) for c in customers])


def customer_phone(db, rng):
    customer = pick(db, rng, "SELECT * FROM customers")
    phone = f"555-{rng.randrange(100, 1000)}-{rng.randrange(1000, 10000)}"
    return (f"Update {customer['customer_name']}'s phone number to {phone}",
            [call("customer_relationship_manager_update_customer", customer_id=customer["customer_id"], field="customer_phone", new_value=phone)])


# --- company directory and several domains -------------------------------------------------------

SUBJECTS = (("Lunch on Friday", "Are you free for lunch on Friday?"), ("Welcome aboard", "Welcome to the team! Let me know if you need anything."),
            ("Slides for Monday", "Could you send me your slides before Monday?"), ("Quick favor", "Can you review my draft today?"))


def email_by_name(db, rng):
    to = colleague(db, rng)
    subject, body = rng.choice(SUBJECTS)
    return (f"Send an email to {full(to)} with the subject '{subject}' saying '{body}'",
            [call("email_send_email", recipient=to, subject=subject, body=body)])


def meeting_by_first_name(db, rng):
    prompt, calls = schedule_meeting(db, rng)
    who = json.loads(calls[0]["arguments"])["participant_email"]
    return prompt.replace(full(who), first(who)), calls


def reply_and_complete(db, rng):
    email = pick(db, rng, "SELECT * FROM emails WHERE \"inbox/outbox\" = 'inbox' AND subject LIKE 'Task update on %'")
    name = email["subject"].removeprefix("Task update on ")
    task = db.execute("SELECT task_id FROM project_tasks WHERE task_name = ?", (name,)).fetchone()
    latest = db.execute('SELECT email_id FROM emails WHERE "sender/recipient" = ? AND subject = ? ORDER BY sent_datetime DESC',
                        (email["sender/recipient"], email["subject"])).fetchone()[0]
    return (f"Reply 'Approved, thanks!' to {first(email['sender/recipient'])}'s latest update on '{name}', and move that task to Completed",
            [call("email_reply_email", email_id=latest, body="Approved, thanks!"),
             call("project_management_update_task", task_id=task[0], field="list_name", new_value="Completed")])


def won_and_thank(db, rng):
    customer = pick(db, rng, "SELECT * FROM customers WHERE status = 'Proposal'")
    return (f"{customer['customer_name']} accepted our proposal: mark them as Won and email them (subject 'Thank you', body "
            f"'Thank you for choosing Orbitech!')",
            [call("customer_relationship_manager_update_customer", customer_id=customer["customer_id"], field="status", new_value="Won"),
             call("email_send_email", recipient=customer["customer_email"], subject="Thank you", body="Thank you for choosing Orbitech!")])


TEMPLATES: dict[str, tuple[Template, ...]] = {
    "email": (reply_to_latest, forward_email, delete_emails_from),
    "calendar": (rename_last_event, cancel_event, move_event, schedule_meeting),
    "analytics": (one_plot, two_plots),
    "project_management": (move_task, reassign_task, create_task, delay_tasks, delete_task),
    "customer_relationship_manager": (customer_status, add_customer, reassign_customers, delete_lost, customer_phone),
    "company_directory": (email_by_name, meeting_by_first_name),
    "multi_domain": (reply_and_complete, won_and_thank),
}


def system_prompt(now: str) -> str:
    moment = datetime.fromisoformat(now)
    return (f"Today is {moment:%A}, {moment:%Y-%m-%d}, and the time is {moment:%H:%M:%S}. You are the assistant of "
            f"{world.EMPLOYEES[0]} ({ME}). Carry out the request with the tools: look up ids with the search tools first, "
            "then make exactly the changes asked for. Meetings run between 9am and 6pm.")


def generate_rows(*, per_category: int, seed: int, world_seed: int = 0) -> list[dict[str, Any]]:
    """`per_category` rows for each category, from templates in turn; equal arguments give equal rows."""
    rng = random.Random(seed)
    db = world.open_world(world_seed)
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for category, templates in TEMPLATES.items():
        made, attempts = 0, 0
        while made < per_category and attempts < per_category * 50:
            attempts += 1
            result = templates[attempts % len(templates)](db, rng)
            if result is None or not result[1] or result[0] in seen:
                continue
            prompt, calls = result
            seen.add(prompt)
            made += 1
            rows.append({
                "id": len(rows),
                "responses_create_params": {"input": [{"role": "system", "content": system_prompt(world.NOW)},
                                                      {"role": "user", "content": prompt}],
                                            "parallel_tool_calls": False},
                "ground_truth": calls,
                "category": f"workplace_assistant_{category}",
                "world_seed": world_seed,
                "agent_ref": {"type": "responses_api_agents", "name": AGENT_NAME},
            })
    db.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-category", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--world-seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "data" / "example.jsonl")
    args = parser.parse_args()
    rows = generate_rows(per_category=args.per_category, seed=args.seed, world_seed=args.world_seed)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    print(f"wrote {len(rows)} rows to {args.output}")


if __name__ == "__main__":
    main()
