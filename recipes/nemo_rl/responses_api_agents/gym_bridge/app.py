"""NeMo Gym's entry point for `gym-bridge serve` (the `/run` agent server).

NeMo Gym starts it as `python app.py` in this folder (found through NEMO_GYM_EXTRA_ROOTS), in a venv
built from requirements.txt, with its global config in NEMO_GYM_CONFIG_DICT: this server's host and
port, the environments to serve (`envs`), and NeMo RL's vLLM URLs (`policy_base_url`).
"""

from gym_bridge.serve.agent_launch import main_from_nemo_gym

if __name__ == "__main__":
    main_from_nemo_gym()
