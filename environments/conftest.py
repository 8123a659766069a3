"""Fixtures for environment tests: the same real tokenizer, chat template and scripted turns as tests/."""

from tests.conftest import smol_template, smol_tokenizer, turn  # noqa: F401
