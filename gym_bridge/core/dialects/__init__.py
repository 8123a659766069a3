"""Dialects: every conversion between the conversation formats gym_bridge speaks.

`responses` owns Responses items (the text of an item; items <-> chat messages), `chat` owns the
chat-completions wire format (its messages, tool schemas, request bodies and error answers), and
`template_view` owns the chat template's view of a conversation (messages and tool schemas as a
chat template is given them). Trainer-free and server-free: plain dicts and pydantic models only.
"""
