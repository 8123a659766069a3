"""The email toolset: read, search, send, delete, forward and reply to the mailbox's emails."""

from __future__ import annotations

from typing import Any

from gym_bridge import ToolError, tool

from environments.workplace_assistant import world
from environments.workplace_assistant.toolsets.common import EMAIL_FIELDS, WorkplaceTools, check_email, date_text, page_of


class Email(WorkplaceTools):
    """Read, search, send, delete, forward and reply to the mailbox's emails."""

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
        low = date_text(date_min, field="date_min") if date_min.strip() else "0000"
        high = date_text(date_max, field="date_max") if date_max.strip() else "9999"
        words = query.lower().split()
        found = []
        for record in self.db.execute("SELECT * FROM emails ORDER BY sent_datetime DESC"):
            text = f"{record['subject']} {record['body']} {record['sender/recipient']}".lower()
            if all(word in text for word in words) and low <= record["sent_datetime"][:10] <= high:
                found.append(dict(record))
        return page_of(found, page, page_size, "emails")

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
        return {"email_id": self._send(check_email(recipient, field="recipient"), subject, body), "status": "sent"}

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
        recipient = check_email(recipient, field="recipient")
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
