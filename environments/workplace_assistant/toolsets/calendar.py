"""The calendar toolset: read, search, create, delete and update calendar events."""

from __future__ import annotations

from typing import Any

from gym_bridge import ToolError, tool

from environments.workplace_assistant import world
from environments.workplace_assistant.toolsets.common import EVENT_FIELDS, WorkplaceTools, check_email, datetime_text, page_of


class Calendar(WorkplaceTools):
    """Read, search, create, delete and update calendar events."""

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
        low = datetime_text(time_min, field="time_min") if time_min.strip() else "0000"
        high = datetime_text(time_max, field="time_max") if time_max.strip() else "9999"
        needle = query.strip().lower()
        found = [dict(record) for record in self.db.execute("SELECT * FROM calendar_events ORDER BY event_start DESC")
                 if (needle in record["event_name"].lower() or needle in record["participant_email"].lower())
                 and low <= record["event_start"] <= high]
        return page_of(found, page, page_size, "events")

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
                  "participant_email": check_email(participant_email, field="participant_email"),
                  "event_start": datetime_text(event_start, field="event_start"), "duration": self._duration(duration)}
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
            new_value = datetime_text(new_value, field="event_start")
        elif field == "duration":
            new_value = self._duration(new_value)
        elif field == "participant_email":
            new_value = check_email(new_value, field="new_value")
        elif field != "event_name":
            raise ToolError(f"unknown field {field!r}; fields: event_name, participant_email, event_start, duration")
        if not new_value.strip():
            raise ToolError("new_value must not be empty")
        self.db.execute(f"UPDATE calendar_events SET {field} = ? WHERE event_id = ?", (new_value, event_id.strip()))
        return {"event_id": event_id.strip(), "status": "updated"}
