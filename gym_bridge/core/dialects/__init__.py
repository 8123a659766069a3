"""Dialects: every conversion between the conversation formats gym_bridge speaks.

`responses` owns Responses items (the text of an item; items <-> chat messages), `chat` owns the
chat-completions wire format (its messages, tool schemas, request bodies, streamed chunks and
error answers), `responses_api` owns the `/v1/responses` wire format (its request model, response
object and stream events, built from and onto the chat-completions form), and `template_view` owns
the chat template's view of a conversation (messages and tool schemas as a chat template is given
them). Trainer-free and server-free: plain dicts and pydantic models only.
"""
