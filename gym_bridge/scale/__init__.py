"""Past one machine: rollouts on Ray actors, a replica router with episode affinity, and admission
checks that state every hop's concurrency. Only this package (and the adapters) import Ray, lazily.
"""
