"""Helpers shared by test modules (imported once, as `tests.support.*`)."""
