"""Bad input becomes one line on stderr and exit status 2; interrupts become 128 + signal.

Every message names the key, path or value at fault and what would work. Hydra's and OmegaConf's
multi-line errors are rewritten here into that form (:func:`hydra_message`).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable
from typing import Any, NoReturn


def fail(message: str, code: int = 2) -> NoReturn:
    line = " ".join(str(message).split())  # one line, whatever the source's layout
    print(f"rlbench: error: {line}", file=sys.stderr)
    raise SystemExit(code)


def guarded(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn``; bad input -> :func:`fail`, an interrupted run -> exit 128 + signal."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from harness.registry import RegistryError
    from harness.run_status import RunInterrupted
    from harness.typed_config import ConfigError

    try:
        return fn(*args)
    except (ConfigError, RegistryError, FileNotFoundError) as exc:
        fail(str(exc))
    except (HydraException, OmegaConfBaseException) as exc:
        fail(hydra_message(exc))
    except RunInterrupted as exc:
        print(f"rlbench: {exc}; the MLflow run is marked KILLED", file=sys.stderr)
        raise SystemExit(128 + int(exc.signum)) from None
    return None


def _cause_with(exc: BaseException, attr: str) -> Any:
    seen = exc
    while seen is not None:
        if getattr(seen, attr, None):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _first_line(text: str) -> str:
    return str(text).strip().splitlines()[0] if str(text).strip() else ""


def _valid_keys(full_key: str, overrides: list[str]) -> list[str]:
    """The keys that exist beside ``full_key`` in the config composed without the bad key."""
    from omegaconf import DictConfig, OmegaConf

    from harness.config import compose_config

    parent = full_key.rpartition(".")[0]
    kept = [o for o in overrides if not o.lstrip("+~").startswith(full_key)
            and "," not in o.partition("=")[2]]  # sweep values do not compose
    try:
        cfg = compose_config(kept)
    except Exception:  # the other overrides are bad too: no list then
        return []
    node = OmegaConf.select(cfg, parent) if parent else cfg
    return list(node.keys()) if isinstance(node, DictConfig) else []


def hydra_message(exc: BaseException, overrides: list[str] | None = None) -> str:
    """One line for a Hydra / OmegaConf composition error, naming the key and what works."""
    from hydra.errors import MissingConfigException, OverrideParseException

    overrides = overrides or []
    if isinstance(exc, MissingConfigException):
        missing = (exc.missing_cfg_file or "").strip("/")
        group, _, name = missing.rpartition("/")
        options = list(exc.options or [])
        close = difflib.get_close_matches(name, options, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        if group:
            return (f"{group}={name}: no such option in group {group!r}.{hint} "
                    f"Options: {', '.join(options) or '(none)'}")
        return _first_line(str(exc))
    if isinstance(exc, OverrideParseException):
        bad = _first_line(str(exc))
        return (f"cannot parse the override {bad!r}: overrides are key=value (a sweep: "
                "key=a,b); flags: --cfg job|hydra|all, --help")
    typed = _cause_with(exc, "full_key")
    if typed is not None:
        key, msg = typed.full_key, _first_line(typed.msg or str(typed))
        if "not in" in msg or "not in struct" in msg:
            name = key.rpartition(".")[2]
            valid = _valid_keys(key, overrides)
            close = difflib.get_close_matches(name, valid, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            where = f" under {key.rpartition('.')[0]}" if "." in key else ""
            listing = f" Valid keys{where}: {', '.join(valid)}" if valid else ""
            return f"unknown config key {key}.{hint}{listing}"
        value = getattr(typed, "value", None)
        shown = f"={value!r}" if value is not None else ""
        return f"{key}{shown}: {msg}"
    text = str(exc)
    if text.startswith("Ambiguous value for argument"):
        arg = text.split("'")[1] if "'" in text else text
        return (f"{arg}: a comma-separated value sweeps; sweep with `rlbench sweep {arg}`, "
                "or give a list as key=[a,b]")
    return _first_line(text)
