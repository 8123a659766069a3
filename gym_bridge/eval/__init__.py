"""The back ends of `gym-bridge eval`, `verify` and `env check` (the commands' options live in gym_bridge/cli).

`run` picks the tasks, runs them through the engine and writes records and metrics, telling an
observer (`progress`: the progress bar and its ETA) as it goes; `env_check` exercises an
environment's tools and verifier without a model.
"""
