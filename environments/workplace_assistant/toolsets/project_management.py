"""The project management toolset: read, search, create, delete and update project tasks."""

from __future__ import annotations

from typing import Any

from gym_bridge import ToolError, tool

from environments.workplace_assistant import world
from environments.workplace_assistant.toolsets.common import TASK_FIELDS, WorkplaceTools, check_email, date_text
from environments.workplace_assistant.world import BOARDS, LISTS


class ProjectManagement(WorkplaceTools):
    """Read, search, create, delete and update project tasks."""

    def _task_value(self, field: str, value: str) -> str:
        if field == "list_name" and value not in LISTS:
            raise ToolError(f"list_name must be one of {', '.join(LISTS)}")
        if field == "board" and value not in BOARDS:
            raise ToolError(f"board must be one of {', '.join(BOARDS)}")
        if field == "assigned_to_email":
            value = check_email(value, field=field)
            if value not in self._staff():
                raise ToolError(f"{value} is not in the company directory")
        if field == "due_date":
            value = date_text(value, field=field)
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
