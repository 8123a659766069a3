"""Dialects: every conversion between the conversation and the wire formats gym_bridge speaks.

Each module owns one format in both directions (parse and build, request and answer), like
pydantic-ai's one module per API: `completions` the `/v1/completions` format training runs on,
`chat` the chat-completions format (its messages, tool schemas, request bodies, answers, streamed
chunks, error answers), `responses` Responses items and the Responses API's requests and answers
(one converter from a Responses `input` to the conversation), `responses_api` the `/v1/responses`
endpoint served from a chat-completions one, `template_view` the chat template's view of a
conversation, and `nemo_gym` NeMo Gym's `/run` results and `/aggregate_metrics`. The conversation
itself is `gym_bridge.core.conversation`. Trainer-free and server-free.
"""
