"""Chat templating for token-in/token-out rollouts, in the order a template is used.

`render` renders a chat template as transformers would (without transformers), `profile` probes once
per template how it wants assistant turns, `chat_template` holds `ChatTemplate` (the prompt tokens and
each environment step's delta), `check` is the append-only check, `piece_encoder` tokenizes prompts
exactly and cached; `parsers/` reads tool calls and reasoning per model family.
"""
