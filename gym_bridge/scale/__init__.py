"""Past one machine: rollouts on Ray actors, and admission checks that state every hop's concurrency
(the replica router that spreads model calls over servers is `gym_bridge.policies.router`). Only this
package (and the adapters) import Ray, lazily.
"""
