"""NeMo RL GRPO with gym_bridge's native environment (way 2).

    python recipes/nemo_rl/run_grpo_native.py --config CONFIG.yaml [hydra overrides]

Registers `gym_bridge.nemo_rl.GymBridgeEnvironment` (env `gym_bridge`) and its data processor
(`gym_bridge_processor`) with NeMo RL, then runs NeMo RL's own `examples/run_grpo.py` unchanged.
NEMO_RL_DIR names the NeMo RL checkout (default: the current directory).
"""

import os
import runpy
import sys

import gym_bridge


def main() -> None:
    gym_bridge.nemo_rl.register()
    script = os.path.join(os.environ.get("NEMO_RL_DIR", "."), "examples", "run_grpo.py")
    sys.argv[0] = script
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
