"""The company directory toolset: find employees' email addresses."""

from __future__ import annotations

from gym_bridge import ToolError, tool

from environments.workplace_assistant.toolsets.common import WorkplaceTools


class Directory(WorkplaceTools):
    """Find employees' email addresses."""

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
