"""How `gym-bridge serve` starts: `serve` (the port taken first, the app run on it), from the command line's options
(`settings_from_args`) or from the environment NeMo Gym starts its servers in (`from_nemo_gym_environ`: its
`NEMO_GYM_CONFIG_DICT` and `NEMO_GYM_CONFIG_PATH`; `main_from_nemo_gym` is what NeMo Gym's entry point,
`recipes/nemo_rl/responses_api_agents/gym_bridge/app.py`, runs). A journal is kept by default (`default_journal_dir`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gym_bridge.core.errors import ConfigError, MissingExtraError
from gym_bridge.serve.agent_server import AgentServerSettings, build_app
from gym_bridge.serve.listen import bind_socket, run_app
from gym_bridge.serve.request_limit import RequestLimit


def serve(settings: AgentServerSettings, *, host: str = "127.0.0.1", port: int = 9000,
          on_ready: Callable[[str], None] | None = None) -> None:
    """Serve until interrupted; `on_ready` gets `http://host:port` once bound. Past `max_concurrency`
    `/run`s in flight, a new one gets a 503 with `Retry-After` (NeMo Gym's client retries); `/health`
    and `/aggregate_metrics` are always answered, however busy the server is. With a journal, the model servers are
    asked first what they serve (`served_model_identity`): a journal of another model is refused (JournalError)."""
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise MissingExtraError("gym-bridge serve needs FastAPI and uvicorn: pip install 'gym-bridge[serve]'") from None

    sock = bind_socket(host, port)  # a busy port fails first, before the model servers are asked
    try:
        identity = None
        if settings.journal_dir:
            from gym_bridge.policies.discovery import served_model_identity

            identity = asyncio.run(served_model_identity(settings.model_base_urls, model=settings.model, api_key=settings.api_key))
        app = RequestLimit(build_app(settings, model_identity=identity), limit=settings.max_concurrency,
                           limited=lambda path: path == "/run", refusal=_busy)
    except BaseException:
        sock.close()
        raise
    run_app(app, sock, on_ready=on_ready, timeout_keep_alive=120)


def _busy(limit: int) -> dict[str, Any]:
    return {"detail": f"the server is running its limit of {limit} rollouts (--max-concurrency); retry later"}


def settings_from_args(envs: Sequence[str], base_urls: Sequence[str], **values: Any) -> AgentServerSettings:
    """Settings from the command line (`--model-base-url` may be repeated or comma-separated)."""
    urls = tuple(url.strip() for entry in base_urls for url in entry.split(",") if url.strip())
    return AgentServerSettings(envs=tuple(envs), model_base_urls=urls, **{k: v for k, v in values.items() if v is not None})


def default_journal_dir(port: int) -> str | None:
    """Where `serve` journals when not told: `<cache>/serve_journal/port-<port>` (a server restarted on its port finds
    it; `$GYM_BRIDGE_CACHE`, else `~/.cache/gym_bridge`); None for port 0, a new port at every start."""
    if port == 0:
        return None
    from gym_bridge.policies.embedded import cache_root

    return str(cache_root() / "serve_journal" / f"port-{port}")


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
