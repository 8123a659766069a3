"""The workplace tools by concept, one toolset per tool-name prefix (see `common` for what they share)."""

from environments.workplace_assistant.toolsets.analytics import Analytics
from environments.workplace_assistant.toolsets.calendar import Calendar
from environments.workplace_assistant.toolsets.customer_relationship_manager import CustomerRelationshipManager
from environments.workplace_assistant.toolsets.directory import Directory
from environments.workplace_assistant.toolsets.email import Email
from environments.workplace_assistant.toolsets.project_management import ProjectManagement

__all__ = ["Analytics", "Calendar", "CustomerRelationshipManager", "Directory", "Email", "ProjectManagement"]
