"""`gym-bridge serve` started by NeMo Gym: the settings of one agent server read from the environment NeMo Gym
starts its servers in (`NEMO_GYM_CONFIG_DICT`, `NEMO_GYM_CONFIG_PATH`), then `serve` on the port NeMo Gym gave it.
`recipes/nemo_rl/responses_api_agents/gym_bridge/app.py` (NeMo Gym's entry point for this server) runs
`main_from_nemo_gym`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gym_bridge.core.errors import ConfigError
from gym_bridge.serve.agent_server import AgentServerSettings, default_journal_dir, serve


@dataclass(frozen=True)
class NemoGymLaunch:
    """Where and what to serve when NeMo Gym starts this server (see `from_nemo_gym_environ`)."""

    settings: AgentServerSettings
    host: str
    port: int
    extra: dict[str, Any] = field(default_factory=dict)


_SETTING_KEYS = {
    "max_turns": int, "max_new_tokens": int, "max_completion_tokens": int, "deadline_s": float,
    "max_concurrency": int, "max_request_bytes": int, "request_timeout_s": float, "max_retries": int,
}


def from_nemo_gym_environ(environ: Mapping[str, str] | None = None) -> NemoGymLaunch:
    """Settings from the environment NeMo Gym starts a server in: `NEMO_GYM_CONFIG_DICT` (the global
    config as YAML) and `NEMO_GYM_CONFIG_PATH` (this server's top-level name). The server's own
    entry (`<name>.responses_api_agents.<any>`) gives `host`, `port`, optional `envs` (default: the
    name) and any `AgentServerSettings` number; `policy_base_url` and `policy_model_name`, which NeMo
    RL puts in the global config (`nemo_rl/environments/nemo_gym.py::NemoGym._spinup`), give the
    model servers. Raises GymBridgeError naming what is missing."""
    import yaml

    environ = os.environ if environ is None else environ
    raw, name = environ.get("NEMO_GYM_CONFIG_DICT"), environ.get("NEMO_GYM_CONFIG_PATH")
    if not raw or not name:
        raise ConfigError("NEMO_GYM_CONFIG_DICT and NEMO_GYM_CONFIG_PATH are not set: this entry point is started by NeMo Gym")
    config = yaml.safe_load(raw)
    try:
        entry = next(iter(next(iter(config[name].values())).values()))
    except (KeyError, StopIteration, AttributeError, TypeError):
        raise ConfigError(f"NeMo Gym's config has no server entry {name}.<server type>.<server name>") from None
    urls = config.get("policy_base_url")
    urls = [urls] if isinstance(urls, str) else list(urls or [])
    if not urls:
        raise ConfigError("NeMo Gym's config has no policy_base_url (NeMo RL sets it to its vLLM servers' URLs)")
    if entry.get("host") is None or entry.get("port") is None:
        raise ConfigError(f"the server entry {name} has no host and port")
    envs = entry.get("envs") or [name]
    numbers = {key: cast(entry[key]) for key, cast in _SETTING_KEYS.items() if entry.get(key) is not None}
    journal = entry.get("journal_dir", default_journal_dir(int(entry["port"])))  # null in the entry: no journal
    settings = AgentServerSettings(envs=tuple(envs), model_base_urls=tuple(str(url) for url in urls),
                                   model=config.get("policy_model_name"), api_key=config.get("policy_api_key"),
                                   journal_dir=None if journal is None else str(journal), **numbers)
    return NemoGymLaunch(settings=settings, host=str(entry["host"]), port=int(entry["port"]))


def main_from_nemo_gym(environ: Mapping[str, str] | None = None) -> None:
    """What the NeMo Gym entry point (`recipes/nemo_rl/responses_api_agents/gym_bridge/app.py`) runs."""
    launch = from_nemo_gym_environ(environ)
    serve(launch.settings, host="0.0.0.0", port=launch.port,
          on_ready=lambda url: print(f"gym-bridge serve: {', '.join(launch.settings.envs)} at {url}", flush=True))
