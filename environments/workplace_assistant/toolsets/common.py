"""What every workplace toolset shares: the session's database and "now", record helpers, value checks.

`WorkplaceTools` is the common base of the toolsets; its attributes are the session state that
`WorkplaceAssistantEnvironment.setup` sets, and its helpers become the environment's own methods.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime
from typing import Any

from gym_bridge import Toolset, ToolError

EMAIL_FIELDS = ("email_id", "inbox/outbox", "sender/recipient", "subject", "sent_datetime", "body")
EVENT_FIELDS = ("event_id", "event_name", "participant_email", "event_start", "duration")
TASK_FIELDS = ("task_id", "task_name", "assigned_to_email", "list_name", "due_date", "board")
CUSTOMER_FIELDS = ("customer_id", "customer_name", "assigned_to_email", "customer_email", "customer_phone",
                   "last_contact_date", "product_interest", "status", "notes", "follow_up_by")


def datetime_text(value: str, *, field: str) -> str:
    """`YYYY-MM-DD HH:MM:SS` for any ISO date-time; ToolError naming the field otherwise."""
    try:
        return datetime.fromisoformat(value.strip()).strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise ToolError(f"{field} must be a date and time like 2024-05-20 14:30:00, got {value!r}") from None


def date_text(value: str, *, field: str) -> str:
    """`YYYY-MM-DD` for an ISO date (a time part is dropped); ToolError naming the field otherwise."""
    try:
        return datetime.fromisoformat(value.strip()).date().isoformat()
    except ValueError:
        raise ToolError(f"{field} must be a date like 2024-05-20, got {value!r}") from None


def check_email(value: str, *, field: str) -> str:
    value = value.strip().lower()
    if "@" not in value or "." not in value.split("@")[-1]:
        raise ToolError(f"{field} must be an email address, got {value!r}")
    return value


def page_of(records: list[dict[str, Any]], page: int, page_size: int, key: str) -> dict[str, Any]:
    if page_size < 1:
        raise ToolError("page_size must be at least 1")
    pages = max(1, -(-len(records) // page_size))
    page = min(max(1, page), pages)
    chosen = records[(page - 1) * page_size: page * page_size]
    return {key: chosen, "pagination": {f"total_{key}": len(records), "page": page, "page_size": page_size, "total_pages": pages}}


class WorkplaceTools(Toolset):
    """The session state and helpers the workplace toolsets share."""

    db: sqlite3.Connection
    """The session's private copy of the world."""
    now: str
    """The world's current date and time, YYYY-MM-DD HH:MM:SS."""

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
