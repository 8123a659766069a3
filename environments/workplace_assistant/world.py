"""The workplace world: a company's directory, mailbox, calendar, web analytics, project tasks and CRM.

The world is an in-memory SQLite database. `world_bytes(seed)` builds it from a seeded random
generator (or, for NeMo Gym's own rows, from NeMo Gym's `csv_data` folder) once per process and
returns it serialized; every rollout and every replay opens a fresh copy with `open_world`.
Column names follow NeMo Gym's workplace tables, so records look the same to a model.
`snapshot` gives the normalised state that the verifier compares.
"""

from __future__ import annotations

import csv
import random
import sqlite3
from datetime import date, datetime, timedelta
from functools import lru_cache
from pathlib import Path

NOW = "2024-05-17 17:00:00"
"""The current time in generated worlds (a Friday); sent emails carry it."""
NEMO_GYM_NOW = "2023-11-30 23:59:00"
"""The current time in NeMo Gym's workplace data."""
LISTS = ("Backlog", "In Progress", "In Review", "Completed")
BOARDS = ("Back end", "Front end", "Design")
STATUSES = ("Qualified", "Won", "Lost", "Lead", "Proposal")
PRODUCTS = ("Software", "Hardware", "Services", "Consulting", "Training")
TRAFFIC_SOURCES = ("direct", "referral", "search engine", "social media")
PLOT_VALUES = ("total_visits", "session_duration_seconds", "user_engaged", "visits_direct", "visits_referral",
               "visits_search_engine", "visits_social_media")
PLOT_TYPES = ("bar", "line", "scatter", "histogram")

SCHEMA = """
CREATE TABLE directory (email_address TEXT);
CREATE TABLE emails (email_id TEXT PRIMARY KEY, "inbox/outbox" TEXT, "sender/recipient" TEXT, subject TEXT,
                     sent_datetime TEXT, body TEXT);
CREATE TABLE calendar_events (event_id TEXT PRIMARY KEY, event_name TEXT, participant_email TEXT, event_start TEXT,
                              duration TEXT);
CREATE TABLE analytics (date_of_visit TEXT, visitor_id TEXT, page_views INTEGER, session_duration_seconds REAL,
                        traffic_source TEXT, user_engaged INTEGER);
CREATE TABLE plots (file_path TEXT);
CREATE TABLE project_tasks (task_id TEXT PRIMARY KEY, task_name TEXT, assigned_to_email TEXT, list_name TEXT,
                            due_date TEXT, board TEXT);
CREATE TABLE customers (customer_id TEXT PRIMARY KEY, assigned_to_email TEXT, customer_name TEXT, customer_email TEXT,
                        customer_phone TEXT, last_contact_date TEXT, product_interest TEXT, status TEXT,
                        follow_up_by TEXT, notes TEXT);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
"""

ID_COLUMNS = {"emails": "email_id", "calendar_events": "event_id", "project_tasks": "task_id", "customers": "customer_id"}
"""Tables whose records get a new 8-digit id when created, and the id column."""
COMPARED_TABLES = ("emails", "calendar_events", "plots", "project_tasks", "customers")
"""The tables tools can change: the state the verifier compares."""
CASE_SENSITIVE_COLUMNS = frozenset({"status", "list_name", "board"})

EMPLOYEES = (
    "Jordan Lee", "Amara Okafor", "Bruno Costa", "Chloe Martin", "Dev Sharma", "Elena Petrova", "Felix Wagner",
    "Grace Kim", "Hiro Tanaka", "Isla Murphy", "Jonas Berg", "Keira Walsh", "Luca Romano", "Maya Cohen",
    "Nikhil Rao", "Olga Novak",
)
"""Staff of the generated company; the first is the user the assistant works for."""
DOMAIN = "orbitech.com"
CUSTOMER_NAMES = (
    "Alex Rivera", "Blake Turner", "Casey Morgan", "Drew Patel", "Emery Brooks", "Finley Ward", "Harper Quinn",
    "Jamie Foster", "Kendall Hayes", "Logan Price", "Morgan Ellis", "Noel Grant", "Parker Reed", "Quinn Bailey",
    "Riley Sutton", "Sawyer Cole", "Taylor Dunn", "Avery Lane", "Rowan Fisher", "Skyler Moss", "Dana Whitfield",
    "Reese Holloway", "Jesse Carver", "Robin Ashby", "Sam Oduya", "Toni Marsh", "Lee Branson", "Kai Winters",
    "Jordan Pike", "Ari Castell", "Devon Shaw", "Elliot Crane", "Frankie Doyle", "Gale Horton", "Hollis Vance",
    "Indy Marlow",
)
CUSTOMER_COMPANIES = ("bluepeak", "nimbuscore", "ferrotech", "quantaloop", "silverline", "greenforge", "helixa", "northgate")
FEATURES = ("search filters", "dark mode", "export to CSV", "login rate limiting", "audit logging", "image upload",
            "password reset", "billing page", "onboarding tour", "API pagination", "cache layer", "push notifications",
            "report builder", "user roles", "data backup", "error dashboard")
TASK_VERBS = ("Implement", "Design", "Fix bugs in", "Write tests for", "Review", "Refactor")
MEETINGS = ("Sprint planning", "Design review", "Budget check-in", "Roadmap sync", "Hiring panel", "Quarterly review",
            "Security briefing", "Product demo", "Team retro", "Vendor call", "Architecture deep dive", "Launch prep")
EMAIL_TOPICS = ("the quarterly report", "the offsite agenda", "the new pricing", "the vendor contract", "the hiring plan",
                "the launch checklist", "the customer survey", "the security audit")


def address(name: str) -> str:
    """`first.last@orbitech.com` for an employee's name."""
    return f"{name.lower().replace(' ', '.')}@{DOMAIN}"


def _id(number: int) -> str:
    return f"{number:08d}"


def _generate(connection: sqlite3.Connection, seed: int) -> None:
    """Fill the tables of a generated world; everything follows from `seed`."""
    rng = random.Random(seed)
    today = datetime.fromisoformat(NOW)
    staff = [address(name) for name in EMPLOYEES]
    colleagues = staff[1:]  # staff[0] is the user
    connection.executemany("INSERT INTO directory VALUES (?)", [(email,) for email in staff])

    tasks = []
    for number, feature in enumerate(rng.sample(FEATURES, len(FEATURES)) * 3, start=1):
        due = date(2024, 5, 1) + timedelta(days=rng.randrange(0, 50))
        name = f"{rng.choice(TASK_VERBS)} {feature}"
        tasks.append((_id(number), name, rng.choice(colleagues), rng.choice(LISTS), due.isoformat(), rng.choice(BOARDS)))
    seen: set[str] = set()
    tasks = [task for task in tasks if not (task[1] in seen or seen.add(task[1]))][:40]  # type: ignore[func-returns-value]
    connection.executemany("INSERT INTO project_tasks VALUES (?, ?, ?, ?, ?, ?)", tasks)

    emails = []
    for number in range(1, 81):
        sent = today - timedelta(days=rng.randrange(0, 45), hours=rng.randrange(0, 8), minutes=rng.randrange(0, 60))
        other = rng.choice(colleagues)
        first = other.split(".")[0].capitalize()
        kind = rng.randrange(3)
        if kind == 0:
            task = rng.choice(tasks)
            subject, body = f"Task update on {task[1]}", f"Hi Jordan, I finished a first pass on '{task[1]}'. Could you take a look? Thanks, {first}"
        elif kind == 1:
            topic = rng.choice(EMAIL_TOPICS)
            subject, body = f"Question about {topic}", f"Hi Jordan, quick question about {topic}: can we go over it this week? {first}"
        else:
            meeting = rng.choice(MEETINGS)
            subject, body = f"Notes from {meeting}", f"Hi Jordan, here are my notes from the {meeting.lower()}. Best, {first}"
        box = "inbox" if rng.random() < 0.75 else "outbox"
        if box == "outbox":
            body = f"Hi {first}, following up on this. Jordan"
        emails.append((_id(number), box, other, subject, sent.strftime("%Y-%m-%d %H:%M:%S"), body))
    connection.executemany("INSERT INTO emails VALUES (?, ?, ?, ?, ?, ?)", emails)

    events = []
    for number in range(1, 61):
        day = date(2024, 4, 29) + timedelta(days=rng.randrange(0, 42))
        while day.weekday() >= 5:
            day += timedelta(days=1)
        start = datetime(day.year, day.month, day.day, rng.randrange(9, 17), rng.choice((0, 30)))
        events.append((_id(number), rng.choice(MEETINGS), rng.choice(colleagues), start.strftime("%Y-%m-%d %H:%M:%S"),
                       str(rng.choice((30, 45, 60)))))
    connection.executemany("INSERT INTO calendar_events VALUES (?, ?, ?, ?, ?)", events)

    visits = []
    for _ in range(300):
        day = today.date() - timedelta(days=rng.randrange(0, 30))
        visits.append((day.isoformat(), f"{rng.randrange(10000):04d}", rng.randrange(1, 13), float(rng.randrange(5, 600)),
                       rng.choice(TRAFFIC_SOURCES), int(rng.random() < 0.4)))
    connection.executemany("INSERT INTO analytics VALUES (?, ?, ?, ?, ?, ?)", visits)

    customers = []
    for number, name in enumerate(CUSTOMER_NAMES, start=1):
        company = rng.choice(CUSTOMER_COMPANIES)
        contacted = today.date() - timedelta(days=rng.randrange(1, 60))
        customers.append((_id(number), rng.choice(colleagues[:8]), name, f"{name.lower().replace(' ', '.')}@{company}.com",
                          f"555-{rng.randrange(100, 1000)}-{rng.randrange(1000, 10000)}", contacted.isoformat(),
                          rng.choice(PRODUCTS), rng.choice(STATUSES), (contacted + timedelta(days=rng.randrange(7, 40))).isoformat(),
                          f"{contacted.isoformat()}: {rng.choice(('Had a call.', 'Sent a quote.', 'Saw the demo.'))}"))
    connection.executemany("INSERT INTO customers VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", customers)
    connection.execute("INSERT INTO meta VALUES ('now', ?)", (NOW,))


def _load_nemo_gym_csv(connection: sqlite3.Connection, folder: Path) -> None:
    """Fill the tables from NeMo Gym's workplace `csv_data` folder (`processed/*.csv`, `raw/email_addresses.csv`)."""
    def rows(name: str) -> list[dict[str, str]]:
        with (folder / "processed" / name).open(encoding="utf-8", newline="") as handle:
            return list(csv.DictReader(handle))

    with (folder / "raw" / "email_addresses.csv").open(encoding="utf-8", newline="") as handle:
        connection.executemany("INSERT INTO directory VALUES (?)", [(line[0],) for line in csv.reader(handle) if line])
    for table, file_name in (("emails", "emails.csv"), ("calendar_events", "calendar_events.csv"),
                             ("project_tasks", "project_tasks.csv"), ("customers", "customer_relationship_manager_data.csv")):
        records = rows(file_name)
        columns = list(records[0])
        quoted = ", ".join(f'"{column}"' for column in columns)
        connection.executemany(f"INSERT INTO {table} ({quoted}) VALUES ({', '.join('?' * len(columns))})",
                               [[record[c] or None for c in columns] for record in records])
    connection.executemany(
        "INSERT INTO analytics VALUES (?, ?, ?, ?, ?, ?)",
        [(r["date_of_visit"], r["visitor_id"], int(r["page_views"]), float(r["session_duration_seconds"]), r["traffic_source"],
          int(r["user_engaged"] == "True")) for r in rows("analytics_data.csv")],
    )
    connection.execute("INSERT INTO meta VALUES ('now', ?)", (NEMO_GYM_NOW,))


def _new_connection() -> sqlite3.Connection:
    connection = sqlite3.connect(":memory:", check_same_thread=False)
    connection.row_factory = sqlite3.Row
    return connection


@lru_cache(maxsize=8)
def world_bytes(seed: int | None, csv_folder: str | None = None) -> bytes:
    """The serialized database of the world for `seed` (or of NeMo Gym's CSV folder), built once per process."""
    connection = _new_connection()
    connection.executescript(SCHEMA)
    if csv_folder is not None:
        _load_nemo_gym_csv(connection, Path(csv_folder))
    else:
        _generate(connection, 0 if seed is None else seed)
    for table, column in ID_COLUMNS.items():
        largest = connection.execute(f"SELECT MAX(CAST({column} AS INTEGER)) FROM {table}").fetchone()[0] or 0
        connection.execute("INSERT INTO meta VALUES (?, ?)", (f"next_{table}", str(largest + 1)))
        connection.execute("INSERT INTO meta VALUES (?, ?)", (f"first_new_{table}", str(largest + 1)))
    connection.commit()
    data = connection.serialize()
    connection.close()
    return data


def open_world(seed: int | None, csv_folder: str | None = None) -> sqlite3.Connection:
    """A fresh, private copy of a world's database."""
    connection = _new_connection()
    connection.deserialize(world_bytes(seed, csv_folder))
    return connection


def open_bytes(data: bytes) -> sqlite3.Connection:
    """A private database holding `data` (what `sqlite3.Connection.serialize` returned: a session's snapshot)."""
    connection = _new_connection()
    connection.deserialize(data)
    return connection


def next_id(connection: sqlite3.Connection, table: str) -> str:
    """A new 8-digit id for `table`; ids are never reused, even after a delete."""
    number = int(connection.execute("SELECT value FROM meta WHERE key = ?", (f"next_{table}",)).fetchone()[0])
    connection.execute("UPDATE meta SET value = ? WHERE key = ?", (str(number + 1), f"next_{table}"))
    return _id(number)


def normalize_value(column: str, value: object) -> object:
    """A value as compared: text with whitespace runs collapsed and stripped, lower-cased except
    in `status`, `list_name` and `board`; empty text is None; numbers as they are."""
    if isinstance(value, str):
        value = " ".join(value.split())
        if not value:
            return None
        return value if column in CASE_SENSITIVE_COLUMNS else value.lower()
    return value


def snapshot(connection: sqlite3.Connection) -> dict[str, list[tuple[object, ...]]]:
    """The normalised state of the tables tools can change, for comparison.

    Each table becomes a sorted list of normalised rows. The ids of records created during the
    episode are replaced by "<new>", so creations that do not depend on each other may happen
    in any order.
    """
    state: dict[str, list[tuple[object, ...]]] = {}
    for table in COMPARED_TABLES:
        id_column = ID_COLUMNS.get(table)
        first_new = 0
        if id_column:
            first_new = int(connection.execute("SELECT value FROM meta WHERE key = ?", (f"first_new_{table}",)).fetchone()[0])
        rows = []
        for record in connection.execute(f"SELECT * FROM {table}"):
            values = []
            for column in record.keys():
                value = record[column]
                if column == id_column and value is not None and value.isdigit() and int(value) >= first_new:
                    value = "<new>"
                values.append(normalize_value(column, value))
            rows.append(tuple(values))
        state[table] = sorted(rows, key=repr)
    return state
