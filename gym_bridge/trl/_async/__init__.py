"""gym_bridge as TRL's async rollout worker, split by role (public names resolve from `gym_bridge.trl`).

`worker` is the `RolloutWorkerProtocol` surface TRL calls and the loop's thread; `settings` how it generates;
`admission` when a group may start and which version its rows carry; `rows` records -> training rows and
advantages; `buffer` the rows the trainer takes; `progress`, `ledger` and `checkpoint` the trainer's checkpoints and
the journal; `weights`, `cpu` and `seams` TRL's transfer, its CPU trainer and the one import of TRL's async classes.
"""
