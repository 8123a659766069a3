"""Code that must not hold a rollout up: bounded calls, worker processes, a deadline that can be parked.

`call` runs environment code (setup, tools, verify, close) under a timeout off the event loop, `offload`
runs CPU-heavy or possibly hanging functions in worker processes, `isolation` puts an environment's code
in a worker process, `deadline` is a rollout's deadline, held while an async trainer parks a model call.
"""
