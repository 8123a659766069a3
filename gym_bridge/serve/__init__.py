"""gym_bridge's HTTP servers: `serve-model` (a model) and the `/run` agent server behind `gym-bridge serve` (environments).

`model_server` serves a transformers policy over an OpenAI-compatible API (for `eval --base-url`),
`agent_server` serves environments as NeMo Gym agent servers (POST /run, for NeMo RL); what both
share: `request_limit` (requests in flight, health always answered) and `disconnect` (a request's work
cancelled when its client goes).
"""
