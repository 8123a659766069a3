"""gym_bridge's HTTP servers: `serve-model` (a model) and the `/run` agent server behind `gym-bridge serve` (environments).

`model_server` serves a transformers policy over an OpenAI-compatible API (for `eval --base-url`; NeMo RL's token
prefix rule in `prefix_splice`), `agent_server` serves environments as NeMo Gym agent servers (POST /run, for NeMo
RL; started by `agent_launch`, from the command line or NeMo Gym). What both share: `listen` (the port taken first,
the app run on it), `request_limit` (requests in flight, health always answered) and `disconnect` (work cancelled
when the client goes).
"""
