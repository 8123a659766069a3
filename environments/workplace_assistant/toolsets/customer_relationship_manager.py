"""The customer relationship manager toolset: search, update, add and delete customers."""

from __future__ import annotations

from typing import Any

from gym_bridge import ToolError, tool

from environments.workplace_assistant import world
from environments.workplace_assistant.toolsets.common import CUSTOMER_FIELDS, WorkplaceTools, check_email, date_text, page_of
from environments.workplace_assistant.world import PRODUCTS, STATUSES


class CustomerRelationshipManager(WorkplaceTools):
    """Search, update, add and delete customers."""

    def _customer_value(self, field: str, value: str) -> str | None:
        value = value.strip()
        if not value:
            return None
        if field == "status" and value not in STATUSES:
            raise ToolError(f"status must be one of {', '.join(STATUSES)}")
        if field == "product_interest" and value not in PRODUCTS:
            raise ToolError(f"product_interest must be one of {', '.join(PRODUCTS)}")
        if field in ("customer_email", "assigned_to_email"):
            value = check_email(value, field=field)
        if field in ("last_contact_date", "follow_up_by"):
            value = date_text(value, field=field)
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
        bounds = {key: date_text(value, field=f"{key[0]}_{key[1]}") for key, value in ranges.items() if value.strip()}
        found = []
        for record in self.db.execute("SELECT * FROM customers ORDER BY customer_id"):
            if not all(value.strip().lower() in (record[column] or "").lower() for column, value in texts.items()):
                continue
            day = {column: (record[column] or "")[:10] for column in ("last_contact_date", "follow_up_by")}
            if all((day[column] >= bound) if side == "min" else (day[column] <= bound) for (column, side), bound in bounds.items()):
                found.append(dict(record))
        return page_of(found, page, page_size, "customers")

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
