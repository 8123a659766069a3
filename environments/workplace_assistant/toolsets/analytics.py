"""The web analytics toolset: visitors, visit counts per day, session lengths, plots."""

from __future__ import annotations

import sqlite3
from typing import Any

from gym_bridge import ToolError, tool

from environments.workplace_assistant.toolsets.common import WorkplaceTools, date_text
from environments.workplace_assistant.world import PLOT_TYPES, PLOT_VALUES


class Analytics(WorkplaceTools):
    """Visitors, visit counts per day, session lengths, plots."""

    def _visits(self, time_min: str, time_max: str) -> list[sqlite3.Row]:
        low = date_text(time_min, field="time_min") if time_min.strip() else "0000"
        high = date_text(time_max, field="time_max") if time_max.strip() else "9999"
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
        low, high = date_text(time_min, field="time_min"), date_text(time_max, field="time_max")
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
