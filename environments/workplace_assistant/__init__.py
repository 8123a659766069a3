"""workplace_assistant: office tasks over 27 tools, scored by the state they leave behind.

Each rollout gets a fresh copy of a seeded in-memory company (directory, mailbox, calendar, web
analytics, project tasks, customers; see `world.py`). The tools and their parameters are those
of NeMo Gym's `workplace_assistant` server, so its rows load as they are. Verification replays
the model's tool calls and the row's `ground_truth` calls, each on a fresh copy of the initial
world, and gives 1.0 iff the two resulting states are equal after normalisation (README.md).
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

import pydantic

from gym_bridge import Environment, Item, RowProblem, Task, ToolError, VerifyResult, tool

from environments.workplace_assistant import world
from environments.workplace_assistant.world import BOARDS, LISTS, PLOT_TYPES, PLOT_VALUES, PRODUCTS, STATUSES

CSV_FOLDER_VARIABLE = "GYM_BRIDGE_WORKPLACE_CSV_DIR"
"""Environment variable naming NeMo Gym's workplace `csv_data` folder, for NeMo Gym's own rows."""
EMAIL_FIELDS = ("email_id", "inbox/outbox", "sender/recipient", "subject", "sent_datetime", "body")
EVENT_FIELDS = ("event_id", "event_name", "participant_email", "event_start", "duration")
TASK_FIELDS = ("task_id", "task_name", "assigned_to_email", "list_name", "due_date", "board")
CUSTOMER_FIELDS = ("customer_id", "customer_name", "assigned_to_email", "customer_email", "customer_phone",
                   "last_contact_date", "product_interest", "status", "notes", "follow_up_by")


@dataclass(frozen=True)
class ReplayResult:
    """The normalised state after replaying tool calls, and how many of them failed."""

    state: dict[str, list[tuple[Any, ...]]]
    failed_calls: int


class GroundTruthCall(pydantic.BaseModel):
    name: str
    arguments: str | dict[str, Any]
    """A JSON object, as text (NeMo Gym's rows) or as an object."""


class WorkplaceRow(pydantic.BaseModel):
    """The verifier fields of a workplace row (other fields are allowed and ignored)."""

    model_config = pydantic.ConfigDict(extra="allow")
    ground_truth: list[GroundTruthCall]
    world_seed: int | None = None
    """Seed of the generated world; absent in NeMo Gym's rows, which use its CSV data."""


def _datetime_text(value: str, *, field: str) -> str:
    """`YYYY-MM-DD HH:MM:SS` for any ISO date-time; ToolError naming the field otherwise."""
    try:
        return datetime.fromisoformat(value.strip()).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise ToolError(f"{field} must be a date and time like 2024-05-20 14:30:00, got {value!r}") from None


def _date_text(value: str, *, field: str) -> str:
    """`YYYY-MM-DD` for an ISO date (a time part is dropped); ToolError naming the field otherwise."""
    try:
        return datetime.fromisoformat(value.strip()).date().isoformat()
    except ValueError:
        raise ToolError(f"{field} must be a date like 2024-05-20, got {value!r}") from None


def _check_email(value: str, *, field: str) -> str:
    value = value.strip().lower()
    if "@" not in value or "." not in value.split("@")[-1]:
        raise ToolError(f"{field} must be an email address, got {value!r}")
    return value


def _page(records: list[dict[str, Any]], page: int, page_size: int, key: str) -> dict[str, Any]:
    if page_size < 1:
        raise ToolError("page_size must be at least 1")
    pages = max(1, -(-len(records) // page_size))
    page = min(max(1, page), pages)
    chosen = records[(page - 1) * page_size: page * page_size]
    return {key: chosen, "pagination": {f"total_{key}": len(records), "page": page, "page_size": page_size, "total_pages": pages}}


class WorkplaceAssistantEnvironment(Environment):
    name = "workplace_assistant"
    aliases = ("workplace_assistant_simple_agent",)
    description = "Office tasks with 27 tools (email, calendar, analytics, projects, CRM); reward 1 if the final state matches the ground truth's."
    example_data = Path(__file__).parent / "data" / "example.jsonl"
    inline_sync_tools = True  # quick queries on an in-memory database
    row_schema = WorkplaceRow
    csv_folder: ClassVar[str | None] = None
    """NeMo Gym's `csv_data` folder for rows without `world_seed` (default: $GYM_BRIDGE_WORKPLACE_CSV_DIR)."""

    db: sqlite3.Connection

    @classmethod
    def world_source(cls, row: dict[str, Any]) -> tuple[int | None, str | None]:
        """(seed, CSV folder) of the world a row plays in; raises ValueError for a NeMo Gym row
        (no `world_seed`) when no CSV folder is configured."""
        if row.get("world_seed") is not None:
            return int(row["world_seed"]), None
        folder = cls.csv_folder or os.environ.get(CSV_FOLDER_VARIABLE)
        if not folder:
            raise ValueError(
                f"this row has no world_seed, so it is a NeMo Gym row, which plays in NeMo Gym's data: set "
                f"{CSV_FOLDER_VARIABLE} to NeMo Gym's resources_servers/workplace_assistant/csv_data folder, or add world_seed"
            )
        return None, str(Path(folder).resolve())

    @classmethod
    def validate_row(cls, row: dict[str, Any]) -> list[RowProblem]:
        problems = super().validate_row(row)
        if problems:
            return problems
        try:
            cls.world_source(row)
        except ValueError as error:
            problems.append(RowProblem("world_seed", str(error)))
        specs = cls.tool_specs()
        for position, call in enumerate(row["ground_truth"]):
            field = f"ground_truth[{position}]"
            if call["name"] not in specs:
                problems.append(RowProblem(f"{field}.name", f"unknown tool {call['name']!r}"))
                continue
            arguments = call["arguments"]
            try:
                arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
                specs[call["name"]].arguments_model.model_validate(arguments)
            except (ValueError, pydantic.ValidationError) as error:
                problems.append(RowProblem(f"{field}.arguments", f"not valid arguments for {call['name']}: {error}".splitlines()[0]))
        return problems

    @classmethod
    def prepare_rows(cls, *, split: str, size: int, seed: int) -> list[dict[str, Any]]:
        """`size` generated tasks over all domains; `train` plays in world 0, `validation` in world 1,
        so the two splits share no records."""
        from environments.workplace_assistant.generate_tasks import TEMPLATES, generate_rows

        per_category = -(-size // len(TEMPLATES))
        return generate_rows(per_category=per_category, seed=seed, world_seed=0 if split == "train" else 1)[:size]

    def setup(self, task: Task) -> None:
        seed, folder = self.world_source(task.row)
        self.db = world.open_world(seed, folder)
        self.now = self.db.execute("SELECT value FROM meta WHERE key = 'now'").fetchone()[0]

    def close(self) -> None:
        if getattr(self, "db", None) is not None:
            self.db.close()

    # --- helpers -------------------------------------------------------------------------------

    def _one(self, table: str, id_column: str, record_id: str, what: str) -> dict[str, Any]:
        record = self.db.execute(f"SELECT * FROM {table} WHERE {id_column} = ?", (record_id.strip(),)).fetchone()
        if record is None:
            raise ToolError(f"{what} {record_id!r} not found")
        return dict(record)

    def _field(self, record: dict[str, Any], field: str, fields: tuple[str, ...]) -> dict[str, Any]:
        if field not in fields:
            raise ToolError(f"unknown field {field!r}; fields: {', '.join(fields)}")
        return {field: record[field]}

    def _staff(self) -> list[str]:
        return [row[0] for row in self.db.execute("SELECT email_address FROM directory")]

    def _delete(self, table: str, id_column: str, record_id: str, what: str) -> dict[str, str]:
        self._one(table, id_column, record_id, what)
        self.db.execute(f"DELETE FROM {table} WHERE {id_column} = ?", (record_id.strip(),))
        return {id_column: record_id.strip(), "status": "deleted"}

    def _insert(self, table: str, record: dict[str, Any]) -> None:
        columns = ", ".join(f'"{column}"' for column in record)
        self.db.execute(f"INSERT INTO {table} ({columns}) VALUES ({', '.join('?' * len(record))})", list(record.values()))

    # --- company directory ---------------------------------------------------------------------

    @tool
    def company_directory_find_email_address(self, name: str = "") -> list[str]:
        """Find the email addresses of employees whose address contains a name (case-insensitive).

        Args:
            name: A first name, last name or part of one.
        """
        if not name.strip():
            raise ToolError("name not provided")
        needle = name.strip().lower().replace(" ", ".")
        return [email for email in self._staff() if needle in email.lower()]

    # --- email ---------------------------------------------------------------------------------

    @tool
    def email_get_email_information_by_id(self, email_id: str, field: str) -> dict[str, Any]:
        """Get one field of an email.

        Args:
            email_id: The email's 8-digit id.
            field: One of 'email_id', 'inbox/outbox', 'sender/recipient', 'subject', 'sent_datetime', 'body'.
        """
        return self._field(self._one("emails", "email_id", email_id, "email"), field, EMAIL_FIELDS)

    @tool
    def email_search_emails(self, query: str = "", date_min: str = "", date_max: str = "", page: int = 1, page_size: int = 5) -> dict[str, Any]:
        """Search emails, newest first: every word of the query must appear in the subject, body or sender/recipient.

        Args:
            query: Words to look for (empty: all emails).
            date_min: Earliest sent date, inclusive, YYYY-MM-DD.
            date_max: Latest sent date, inclusive, YYYY-MM-DD.
            page: Page of results, from 1.
            page_size: Emails per page.
        """
        low = _date_text(date_min, field="date_min") if date_min.strip() else "0000"
        high = _date_text(date_max, field="date_max") if date_max.strip() else "9999"
        words = query.lower().split()
        found = []
        for record in self.db.execute("SELECT * FROM emails ORDER BY sent_datetime DESC"):
            text = f"{record['subject']} {record['body']} {record['sender/recipient']}".lower()
            if all(word in text for word in words) and low <= record["sent_datetime"][:10] <= high:
                found.append(dict(record))
        return _page(found, page, page_size, "emails")

    def _send(self, recipient: str, subject: str, body: str) -> str:
        email_id = world.next_id(self.db, "emails")
        self._insert("emails", {"email_id": email_id, "inbox/outbox": "outbox", "sender/recipient": recipient,
                                "subject": subject, "sent_datetime": self.now, "body": body})
        return email_id

    @tool
    def email_send_email(self, recipient: str, subject: str, body: str) -> dict[str, str]:
        """Send an email.

        Args:
            recipient: The recipient's email address.
            subject: The subject line.
            body: The message.
        """
        if not subject.strip() or not body.strip():
            raise ToolError("subject and body must not be empty")
        return {"email_id": self._send(_check_email(recipient, field="recipient"), subject, body), "status": "sent"}

    @tool
    def email_delete_email(self, email_id: str) -> dict[str, str]:
        """Delete an email.

        Args:
            email_id: The email's 8-digit id.
        """
        return self._delete("emails", "email_id", email_id, "email")

    @tool
    def email_forward_email(self, email_id: str, recipient: str) -> dict[str, str]:
        """Forward an email to someone.

        Args:
            email_id: The email's 8-digit id.
            recipient: The email address to forward it to.
        """
        original = self._one("emails", "email_id", email_id, "email")
        recipient = _check_email(recipient, field="recipient")
        return {"email_id": self._send(recipient, f"FW: {original['subject']}", original["body"]), "status": "forwarded"}

    @tool
    def email_reply_email(self, email_id: str, body: str) -> dict[str, str]:
        """Reply to an email (to its sender, or to its recipient for an email you sent).

        Args:
            email_id: The email's 8-digit id.
            body: The reply.
        """
        original = self._one("emails", "email_id", email_id, "email")
        if not body.strip():
            raise ToolError("body must not be empty")
        return {"email_id": self._send(original["sender/recipient"], f"RE: {original['subject']}", body), "status": "sent"}

    # --- calendar ------------------------------------------------------------------------------

    @tool
    def calendar_get_event_information_by_id(self, event_id: str, field: str) -> dict[str, Any]:
        """Get one field of a calendar event.

        Args:
            event_id: The event's 8-digit id.
            field: One of 'event_id', 'event_name', 'participant_email', 'event_start', 'duration'.
        """
        return self._field(self._one("calendar_events", "event_id", event_id, "event"), field, EVENT_FIELDS)

    @tool
    def calendar_search_events(self, query: str = "", time_min: str = "", time_max: str = "", page: int = 1, page_size: int = 5) -> dict[str, Any]:
        """Search calendar events by name or participant, latest first.

        Args:
            query: Text to find in the event name or participant email (empty: all events).
            time_min: Earliest start, inclusive, YYYY-MM-DD HH:MM:SS.
            time_max: Latest start, inclusive, YYYY-MM-DD HH:MM:SS.
            page: Page of results, from 1.
            page_size: Events per page.
        """
        low = _datetime_text(time_min, field="time_min") if time_min.strip() else "0000"
        high = _datetime_text(time_max, field="time_max") if time_max.strip() else "9999"
        needle = query.strip().lower()
        found = [dict(record) for record in self.db.execute("SELECT * FROM calendar_events ORDER BY event_start DESC")
                 if (needle in record["event_name"].lower() or needle in record["participant_email"].lower())
                 and low <= record["event_start"] <= high]
        return _page(found, page, page_size, "events")

    @staticmethod
    def _duration(value: str) -> str:
        try:
            minutes = int(str(value).strip())
        except ValueError:
            raise ToolError(f"duration must be a whole number of minutes, got {value!r}") from None
        if minutes <= 0:
            raise ToolError("duration must be a positive number of minutes")
        return str(minutes)

    @tool
    def calendar_create_event(self, event_name: str, participant_email: str, event_start: str, duration: str) -> dict[str, str]:
        """Create a calendar event.

        Args:
            event_name: Name of the event.
            participant_email: Email address of the participant.
            event_start: Start, YYYY-MM-DD HH:MM:SS.
            duration: Length in minutes, e.g. "30".
        """
        if not event_name.strip():
            raise ToolError("event_name must not be empty")
        record = {"event_id": world.next_id(self.db, "calendar_events"), "event_name": event_name,
                  "participant_email": _check_email(participant_email, field="participant_email"),
                  "event_start": _datetime_text(event_start, field="event_start"), "duration": self._duration(duration)}
        self._insert("calendar_events", record)
        return {"event_id": record["event_id"], "status": "created"}

    @tool
    def calendar_delete_event(self, event_id: str) -> dict[str, str]:
        """Delete a calendar event.

        Args:
            event_id: The event's 8-digit id.
        """
        return self._delete("calendar_events", "event_id", event_id, "event")

    @tool
    def calendar_update_event(self, event_id: str, field: str, new_value: str) -> dict[str, str]:
        """Change one field of a calendar event.

        Args:
            event_id: The event's 8-digit id.
            field: One of 'event_name', 'participant_email', 'event_start', 'duration'.
            new_value: The new value.
        """
        self._one("calendar_events", "event_id", event_id, "event")
        if field == "event_start":
            new_value = _datetime_text(new_value, field="event_start")
        elif field == "duration":
            new_value = self._duration(new_value)
        elif field == "participant_email":
            new_value = _check_email(new_value, field="new_value")
        elif field != "event_name":
            raise ToolError(f"unknown field {field!r}; fields: event_name, participant_email, event_start, duration")
        if not new_value.strip():
            raise ToolError("new_value must not be empty")
        self.db.execute(f"UPDATE calendar_events SET {field} = ? WHERE event_id = ?", (new_value, event_id.strip()))
        return {"event_id": event_id.strip(), "status": "updated"}

    # --- analytics -----------------------------------------------------------------------------

    def _visits(self, time_min: str, time_max: str) -> list[sqlite3.Row]:
        low = _date_text(time_min, field="time_min") if time_min.strip() else "0000"
        high = _date_text(time_max, field="time_max") if time_max.strip() else "9999"
        return list(self.db.execute("SELECT * FROM analytics WHERE date_of_visit BETWEEN ? AND ? ORDER BY date_of_visit", (low, high)))

    @staticmethod
    def _per_day(visits: list[sqlite3.Row], value: Any) -> dict[str, Any]:
        totals: dict[str, Any] = {}
        for visit in visits:
            totals[visit["date_of_visit"]] = totals.get(visit["date_of_visit"], 0) + value(visit)
        return totals

    @tool
    def analytics_get_visitor_information_by_id(self, visitor_id: str) -> list[dict[str, Any]]:
        """Get the website visits of one visitor.

        Args:
            visitor_id: The visitor's 4-digit id.
        """
        visits = [dict(v) | {"user_engaged": bool(v["user_engaged"])}
                  for v in self.db.execute("SELECT * FROM analytics WHERE visitor_id = ?", (visitor_id.strip(),))]
        if not visits:
            raise ToolError(f"visitor {visitor_id!r} not found")
        return visits

    @tool
    def analytics_create_plot(self, time_min: str, time_max: str, value_to_plot: str, plot_type: str) -> dict[str, str]:
        """Plot a website metric over a date range; returns the plot's file path.

        Args:
            time_min: First day, YYYY-MM-DD.
            time_max: Last day, YYYY-MM-DD.
            value_to_plot: One of 'total_visits', 'session_duration_seconds', 'user_engaged', 'visits_direct', 'visits_referral', 'visits_search_engine', 'visits_social_media'.
            plot_type: One of 'bar', 'line', 'scatter', 'histogram'.
        """
        low, high = _date_text(time_min, field="time_min"), _date_text(time_max, field="time_max")
        if value_to_plot not in PLOT_VALUES:
            raise ToolError(f"value_to_plot must be one of {', '.join(PLOT_VALUES)}")
        if plot_type not in PLOT_TYPES:
            raise ToolError(f"plot_type must be one of {', '.join(PLOT_TYPES)}")
        file_path = f"plots/{low}_{high}_{value_to_plot}_{plot_type}.png"
        self.db.execute("INSERT INTO plots VALUES (?)", (file_path,))
        return {"file_path": file_path}

    @tool
    def analytics_total_visits_count(self, time_min: str = "", time_max: str = "") -> dict[str, int]:
        """Number of website visits per day in a date range.

        Args:
            time_min: First day, YYYY-MM-DD (empty: from the start).
            time_max: Last day, YYYY-MM-DD (empty: to the end).
        """
        return self._per_day(self._visits(time_min, time_max), lambda visit: 1)

    @tool
    def analytics_engaged_users_count(self, time_min: str = "", time_max: str = "") -> dict[str, int]:
        """Number of engaged visitors per day in a date range.

        Args:
            time_min: First day, YYYY-MM-DD (empty: from the start).
            time_max: Last day, YYYY-MM-DD (empty: to the end).
        """
        return self._per_day(self._visits(time_min, time_max), lambda visit: int(visit["user_engaged"]))

    @tool
    def analytics_traffic_source_count(self, time_min: str = "", time_max: str = "", traffic_source: str = "") -> dict[str, int]:
        """Number of visits per day from one traffic source (empty: all sources) in a date range.

        Args:
            time_min: First day, YYYY-MM-DD (empty: from the start).
            time_max: Last day, YYYY-MM-DD (empty: to the end).
            traffic_source: One of 'direct', 'referral', 'search engine', 'social media'.
        """
        source = traffic_source.strip().lower()
        return self._per_day(self._visits(time_min, time_max), lambda visit: int(not source or visit["traffic_source"] == source))

    @tool
    def analytics_get_average_session_duration(self, time_min: str = "", time_max: str = "") -> dict[str, float]:
        """Average session length in seconds per day in a date range.

        Args:
            time_min: First day, YYYY-MM-DD (empty: from the start).
            time_max: Last day, YYYY-MM-DD (empty: to the end).
        """
        visits = self._visits(time_min, time_max)
        totals, counts = self._per_day(visits, lambda v: v["session_duration_seconds"]), self._per_day(visits, lambda v: 1)
        return {day: round(totals[day] / counts[day], 2) for day in totals}

    # --- project management --------------------------------------------------------------------

    def _task_value(self, field: str, value: str) -> str:
        if field == "list_name" and value not in LISTS:
            raise ToolError(f"list_name must be one of {', '.join(LISTS)}")
        if field == "board" and value not in BOARDS:
            raise ToolError(f"board must be one of {', '.join(BOARDS)}")
        if field == "assigned_to_email":
            value = _check_email(value, field=field)
            if value not in self._staff():
                raise ToolError(f"{value} is not in the company directory")
        if field == "due_date":
            value = _date_text(value, field=field)
        if not value.strip():
            raise ToolError(f"{field} must not be empty")
        return value

    @tool
    def project_management_get_task_information_by_id(self, task_id: str, field: str) -> dict[str, Any]:
        """Get one field of a project task.

        Args:
            task_id: The task's 8-digit id.
            field: One of 'task_id', 'task_name', 'assigned_to_email', 'list_name', 'due_date', 'board'.
        """
        return self._field(self._one("project_tasks", "task_id", task_id, "task"), field, TASK_FIELDS)

    @tool
    def project_management_search_tasks(self, task_name: str = "", assigned_to_email: str = "", list_name: str = "", due_date: str = "",
                                        board: str = "") -> list[dict[str, Any]]:
        """Find project tasks; every given filter must match (text filters match parts, case-insensitive).

        Args:
            task_name: Part of the task's name.
            assigned_to_email: The assignee's exact email address.
            list_name: The list: 'Backlog', 'In Progress', 'In Review' or 'Completed'.
            due_date: The due date, YYYY-MM-DD.
            board: The board: 'Back end', 'Front end' or 'Design'.
        """
        filters = {"task_name": task_name, "list_name": list_name, "due_date": due_date, "board": board}
        if not any(value.strip() for value in (*filters.values(), assigned_to_email)):
            raise ToolError("give at least one filter")
        found = []
        for record in self.db.execute("SELECT * FROM project_tasks ORDER BY task_id"):
            if assigned_to_email.strip() and record["assigned_to_email"].lower() != assigned_to_email.strip().lower():
                continue
            if all(value.strip().lower() in record[column].lower() for column, value in filters.items()):
                found.append(dict(record))
        return found

    @tool
    def project_management_create_task(self, task_name: str, assigned_to_email: str, list_name: str, due_date: str, board: str) -> dict[str, str]:
        """Create a project task.

        Args:
            task_name: Name of the task.
            assigned_to_email: Email address of the assignee (someone in the company directory).
            list_name: One of 'Backlog', 'In Progress', 'In Review', 'Completed'.
            due_date: Due date, YYYY-MM-DD.
            board: One of 'Back end', 'Front end', 'Design'.
        """
        record = {"task_id": "", "task_name": self._task_value("task_name", task_name)}
        for field, value in (("assigned_to_email", assigned_to_email), ("list_name", list_name), ("due_date", due_date), ("board", board)):
            record[field] = self._task_value(field, value)
        record["task_id"] = world.next_id(self.db, "project_tasks")
        self._insert("project_tasks", record)
        return {"task_id": record["task_id"], "status": "created"}

    @tool
    def project_management_delete_task(self, task_id: str) -> dict[str, str]:
        """Delete a project task.

        Args:
            task_id: The task's 8-digit id.
        """
        return self._delete("project_tasks", "task_id", task_id, "task")

    @tool
    def project_management_update_task(self, task_id: str, field: str, new_value: str) -> dict[str, str]:
        """Change one field of a project task.

        Args:
            task_id: The task's 8-digit id.
            field: One of 'task_name', 'assigned_to_email', 'list_name', 'due_date', 'board'.
            new_value: The new value.
        """
        self._one("project_tasks", "task_id", task_id, "task")
        if field not in TASK_FIELDS[1:]:
            raise ToolError(f"unknown field {field!r}; fields: {', '.join(TASK_FIELDS[1:])}")
        self.db.execute(f"UPDATE project_tasks SET {field} = ? WHERE task_id = ?", (self._task_value(field, new_value), task_id.strip()))
        return {"task_id": task_id.strip(), "status": "updated"}

    # --- customer relationship manager ---------------------------------------------------------

    def _customer_value(self, field: str, value: str) -> str | None:
        value = value.strip()
        if not value:
            return None
        if field == "status" and value not in STATUSES:
            raise ToolError(f"status must be one of {', '.join(STATUSES)}")
        if field == "product_interest" and value not in PRODUCTS:
            raise ToolError(f"product_interest must be one of {', '.join(PRODUCTS)}")
        if field in ("customer_email", "assigned_to_email"):
            value = _check_email(value, field=field)
        if field in ("last_contact_date", "follow_up_by"):
            value = _date_text(value, field=field)
        return value

    @tool
    def customer_relationship_manager_search_customers(
        self, customer_name: str = "", customer_email: str = "", product_interest: str = "", status: str = "",
        assigned_to_email: str = "", last_contact_date_min: str = "", last_contact_date_max: str = "",
        follow_up_by_min: str = "", follow_up_by_max: str = "", page: int = 1, page_size: int = 5,
    ) -> dict[str, Any]:
        """Find customers; every given filter must match (text filters match parts, case-insensitive).

        Args:
            customer_name: Part of the customer's name.
            customer_email: Part of the customer's email address.
            product_interest: 'Software', 'Hardware', 'Services', 'Consulting' or 'Training'.
            status: 'Qualified', 'Won', 'Lost', 'Lead' or 'Proposal'.
            assigned_to_email: Email address of the employee who owns the customer.
            last_contact_date_min: Earliest last contact date, YYYY-MM-DD.
            last_contact_date_max: Latest last contact date, YYYY-MM-DD.
            follow_up_by_min: Earliest follow-up date, YYYY-MM-DD.
            follow_up_by_max: Latest follow-up date, YYYY-MM-DD.
            page: Page of results, from 1.
            page_size: Customers per page.
        """
        texts = {"customer_name": customer_name, "customer_email": customer_email, "product_interest": product_interest,
                 "status": status, "assigned_to_email": assigned_to_email}
        ranges = {("last_contact_date", "min"): last_contact_date_min, ("last_contact_date", "max"): last_contact_date_max,
                  ("follow_up_by", "min"): follow_up_by_min, ("follow_up_by", "max"): follow_up_by_max}
        if not any(value.strip() for value in (*texts.values(), *ranges.values())):
            raise ToolError("give at least one filter")
        bounds = {key: _date_text(value, field=f"{key[0]}_{key[1]}") for key, value in ranges.items() if value.strip()}
        found = []
        for record in self.db.execute("SELECT * FROM customers ORDER BY customer_id"):
            if not all(value.strip().lower() in (record[column] or "").lower() for column, value in texts.items()):
                continue
            day = {column: (record[column] or "")[:10] for column in ("last_contact_date", "follow_up_by")}
            if all((day[column] >= bound) if side == "min" else (day[column] <= bound) for (column, side), bound in bounds.items()):
                found.append(dict(record))
        return _page(found, page, page_size, "customers")

    @tool
    def customer_relationship_manager_update_customer(self, customer_id: str, field: str, new_value: str) -> dict[str, str]:
        """Change one field of a customer record.

        Args:
            customer_id: The customer's 8-digit id.
            field: One of 'customer_name', 'assigned_to_email', 'customer_email', 'customer_phone', 'last_contact_date', 'product_interest', 'status', 'notes', 'follow_up_by'.
            new_value: The new value.
        """
        self._one("customers", "customer_id", customer_id, "customer")
        if field not in CUSTOMER_FIELDS[1:]:
            raise ToolError(f"unknown field {field!r}; fields: {', '.join(CUSTOMER_FIELDS[1:])}")
        value = self._customer_value(field, new_value)
        if value is None:
            raise ToolError("new_value must not be empty")
        self.db.execute(f"UPDATE customers SET {field} = ? WHERE customer_id = ?", (value, customer_id.strip()))
        return {"customer_id": customer_id.strip(), "status": "updated"}

    @tool
    def customer_relationship_manager_add_customer(
        self, customer_name: str, assigned_to_email: str, status: str, customer_email: str = "", customer_phone: str = "",
        last_contact_date: str = "", product_interest: str = "", notes: str = "", follow_up_by: str = "",
    ) -> dict[str, str]:
        """Add a customer record.

        Args:
            customer_name: The customer's name.
            assigned_to_email: Email address of the employee who owns the customer.
            status: One of 'Qualified', 'Won', 'Lost', 'Lead', 'Proposal'.
            customer_email: The customer's email address.
            customer_phone: The customer's phone number.
            last_contact_date: Last contact date, YYYY-MM-DD.
            product_interest: One of 'Software', 'Hardware', 'Services', 'Consulting', 'Training'.
            notes: Free-text notes.
            follow_up_by: Next follow-up date, YYYY-MM-DD.
        """
        given = {"customer_name": customer_name, "assigned_to_email": assigned_to_email, "status": status, "customer_email": customer_email,
                 "customer_phone": customer_phone, "last_contact_date": last_contact_date, "product_interest": product_interest,
                 "notes": notes, "follow_up_by": follow_up_by}
        record: dict[str, Any] = {field: self._customer_value(field, value) for field, value in given.items()}
        for required in ("customer_name", "assigned_to_email", "status"):
            if record[required] is None:
                raise ToolError(f"{required} must not be empty")
        record["customer_id"] = world.next_id(self.db, "customers")
        self._insert("customers", record)
        return {"customer_id": record["customer_id"], "status": "created"}

    @tool
    def customer_relationship_manager_delete_customer(self, customer_id: str) -> dict[str, str]:
        """Delete a customer record.

        Args:
            customer_id: The customer's 8-digit id.
        """
        return self._delete("customers", "customer_id", customer_id, "customer")

    # --- verification --------------------------------------------------------------------------

    @classmethod
    def replay(cls, task: Task, calls: list[tuple[str, str | dict[str, Any]]]) -> ReplayResult:
        """Run tool calls on a fresh copy of the task's initial world; calls that fail (unknown
        tool, bad arguments, a ToolError) change nothing and are counted, as in the rollout."""
        env = cls()
        env.setup(task)
        try:
            specs = cls.tool_specs()
            offered = {schema["name"] for schema in task.tools} if task.tools is not None else set(specs)
            failed = 0
            for name, arguments in calls:
                if name not in specs or name not in offered:
                    failed += 1
                    continue
                try:
                    model = specs[name].arguments_model
                    parsed = model.model_validate_json(arguments) if isinstance(arguments, str) else model.model_validate(arguments)
                    getattr(env, name)(**parsed.model_dump())
                except (pydantic.ValidationError, ToolError):
                    failed += 1
            return ReplayResult(state=world.snapshot(env.db), failed_calls=failed)
        finally:
            env.close()

    def verify(self, task: Task, output: list[Item]) -> VerifyResult:
        try:
            truth = [(call.name, call.arguments) for call in WorkplaceRow.model_validate(task.row).ground_truth]
            self.world_source(task.row)
        except (pydantic.ValidationError, ValueError) as error:
            return VerifyResult(reward=0.0, mask_sample=True, failure_kind="verifier", failure_reason=f"bad row: {error}".splitlines()[0])
        calls = [(item["name"], item["arguments"]) for item in output if item["type"] == "function_call"]
        predicted, expected = self.replay(task, calls), self.replay(task, truth)
        initial = self.replay(task, [])
        correct = predicted.state == expected.state
        return VerifyResult(
            reward=float(correct),
            reward_components={"state_match": float(correct)},
            metrics={
                "tool_calls": len(calls),
                "failed_tool_calls": predicted.failed_calls,
                "changed_state": predicted.state != initial.state,
                "tables_differing": sorted(t for t in world.COMPARED_TABLES if predicted.state[t] != expected.state[t]),
            },
        )
