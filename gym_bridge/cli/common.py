"""What several `gym-bridge` commands share: exit codes, the help formatter, the module-path options
(`--no-module-paths`, `--allow-module`) and the `TrustSettings` a command's options make (passed down for its
run), URL checks, JSON-object options, and the checks and CPU-thread choice of a local model
(`eval --model`, `serve-model --model`)."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from gym_bridge.core.errors import ConfigError, SetupError
from gym_bridge.core.trust import TrustSettings

_T = TypeVar("_T")

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"

EXIT_OK = 0
EXIT_CRASH = 1
EXIT_BAD_INPUT = 2
EXIT_TOO_MANY_FAILED = 3
EXIT_INTERRUPTED = 130


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help that keeps the epilog's layout and shows each option's default where it has one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        empty = action.default is None or action.default is False or action.default == [] or action.default == argparse.SUPPRESS
        if empty or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


def whole_number(minimum: int) -> Callable[[str], int]:
    """An argparse `type`: an integer of at least `minimum`. A bad value stops the command at parse time (exit 2,
    naming the flag), before a model loads or a file is touched."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def number(*, above: float | None = None, at_least: float | None = None, at_most: float | None = None) -> Callable[[str], float]:
    """An argparse `type`: a number within the bounds given (`above` excludes its bound); as `whole_number`."""
    bounds = [f"above {above:g}" if above is not None else "", f"at least {at_least:g}" if at_least is not None else "",
              f"at most {at_most:g}" if at_most is not None else ""]
    wanted = " and ".join(bound for bound in bounds if bound)

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
        low_ok = (above is None or value > above) and (at_least is None or value >= at_least)
        if not (low_ok and (at_most is None or value <= at_most)):  # written so that NaN fails too
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text}")
        return value

    return parse


def _json_object(text: str) -> dict[str, Any]:
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _module_path_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-module-paths", action="store_true",
                   help="refuse environments that data rows name by module path (`pkg.mod:Class`): importing a module "
                        "runs its code, so such data files are code, like pickles (--env module paths stay allowed)")
    p.add_argument("--allow-module", action="append", default=[], metavar="PREFIX",
                   help="allow only module paths under this package (repeatable; implies --no-module-paths for the rest)")


def trust_settings(args: argparse.Namespace) -> TrustSettings:
    """The `TrustSettings` a command's options ask for (`--no-module-paths`, `--allow-module`, `--allow-row-commands`),
    which the command passes down to what routes its rows and runs its rollouts; the `--env` module paths given stay
    trusted. Raises ConfigError for --allow-row-commands with limited module paths: those are the settings for shared data."""
    limited = bool(getattr(args, "no_module_paths", False) or getattr(args, "allow_module", None))
    row_commands = bool(getattr(args, "allow_row_commands", False))
    if limited and row_commands:
        raise ConfigError("--allow-row-commands cannot be combined with --no-module-paths or --allow-module: those are the "
                          "settings for shared data, and a row's harness command runs with your permissions")
    if not limited:
        return TrustSettings(row_commands=row_commands)
    names = getattr(args, "env", None) or []
    trusted = [name.partition(":")[0] for name in ([names] if isinstance(names, str) else names) if ":" in name or "." in name]
    return TrustSettings.limited_to([*args.allow_module, *trusted])


def check_urls(urls: Sequence[str], *, flag: str) -> None:
    """Raise GymBridgeError naming `flag` for a URL that is not `http(s)://host[:port][/path]` (a missing scheme)."""
    from urllib.parse import urlsplit

    for url in urls:
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"{flag} {url!r} is not an http(s) URL; write it with its scheme, e.g. http://{url.split('://')[-1]}")
        try:
            parts.port
        except ValueError as error:
            raise ConfigError(f"{flag} {url!r}: {error}") from None


def check_hosts_resolve(urls: Sequence[str], *, flag: str) -> None:
    """Raise GymBridgeError naming `flag` for a URL whose host name does not resolve (a typo; a server that is
    not up yet is fine)."""
    import socket
    from urllib.parse import urlsplit

    for url in urls:
        host = urlsplit(url.strip()).hostname or ""
        try:
            socket.getaddrinfo(host, None)
        except (socket.gaierror, UnicodeError) as error:
            raise ConfigError(f"{flag} {url!r}: host {host!r} does not resolve ({error}); check the URL") from None


def torch_threads(requested: int | None, *, default: int, cores: int, load: float | None) -> int:
    """CPU threads of one generation (serve-model, and eval's local model): `requested`, else `default` unless the machine is already at
    least as busy as it has cores (1-minute load average), then 1. torch's threads wait for each other at
    every operation; on a loaded 2-core machine 2 threads generated 10-20x slower than 1."""
    if requested is not None:
        if requested < 1:
            raise ConfigError(f"--threads must be at least 1, got {requested}")
        return requested
    return 1 if load is not None and load >= cores else default


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:  # not available on this system
        return None


_HUB_ID = re.compile(r"[A-Za-z0-9_][\w.-]*(/[A-Za-z0-9_][\w.-]*)?")
"""What a Hugging Face hub id looks like (`name` or `namespace/name`)."""


def check_local_model(model: str | None) -> None:
    """Refuse a local `--model` (eval's without --base-url, serve-model's) that cannot be a model before anything
    is written or bound: a path that does not exist, a file, or a folder with no `config.json`. A name shaped like
    a hub id that is not a local path is left to transformers (`model_flag_errors` says what it answers). None
    (the embedded model) passes. Raises ConfigError naming the flag and the path."""
    if model is None:
        return
    path = Path(model).expanduser()
    usage = ("give the folder of a transformers model (the one `save_pretrained` writes, with its config.json), "
             "a hub id, or no --model for the embedded model")
    if not path.exists():
        if _HUB_ID.fullmatch(model):
            return
        raise ConfigError(f"--model {model}: no such file or folder; {usage}")
    if not path.is_dir():
        raise ConfigError(f"--model {model} is a file, not a model folder; {usage}")
    if not (path / "config.json").is_file():
        raise ConfigError(f"--model {model} is not a model folder (it has no config.json); {usage}")


def model_flag_errors(model: str | None, load: Callable[..., _T], *arguments: Any) -> _T:
    """`load(*arguments)`, with what transformers raises for a `--model` it cannot load (OSError: a hub id not in the
    cache offline, a folder without weights; ValueError: one without a tokenizer) said as a SetupError naming the flag."""
    try:
        return load(*arguments)
    except (OSError, ValueError) as error:
        if model is None:
            raise
        raise SetupError(f"--model {model} cannot be loaded: {error}") from None
