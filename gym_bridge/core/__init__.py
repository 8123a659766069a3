"""The trainer-free core: tasks, items, the environment API, templating, parsers, the agent loop and the rollout engine.

Nothing here imports torch, transformers, a trainer, vLLM or Ray (ruff's banned-api rules enforce it).
"""
