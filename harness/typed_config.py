"""Build a registered, dataclass-configured component from a config node.

Every configurable building block (task, advantage estimator, policy loss, rollout strategy) is a
class registered by name whose knobs are dataclass fields (either the class itself is a dataclass
or it has a nested ``Config`` dataclass). ``build`` looks the name up, checks every key of the
node against those fields (a typo or a wrong type fails naming the full key path and the valid
keys) and instantiates it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from harness.registry import Registry


class ConfigError(ValueError):
    """A config value that is wrong; the message names the key."""


def schema_of(cls: type) -> type:
    schema = getattr(cls, "Config", cls)
    if not dataclasses.is_dataclass(schema):
        raise TypeError(f"{cls!r} has no dataclass schema (a dataclass or a nested Config)")
    return schema


def validate(schema: type, node: Any, path: str) -> Any:
    """Merge ``node`` (dict or DictConfig, without ``name``) into ``schema``; return the typed
    dataclass instance. Unknown keys and wrong types raise :class:`ConfigError` naming ``path``."""
    if node is None:
        node = {}
    if isinstance(node, DictConfig):
        node = OmegaConf.to_container(node, resolve=True)
    node = {k: v for k, v in dict(node).items() if k != "name"}
    check_keys(schema, node, path)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", "") or ""
        raise ConfigError(f"bad value for {path}.{key}: {exc.msg}") from None
    missing = sorted(OmegaConf.missing_keys(merged))
    if missing:
        raise ConfigError(f"missing required config key {path}.{missing[0]}")
    return OmegaConf.to_object(merged)


def check_keys(schema: type, node: dict[str, Any], path: str) -> None:
    """Reject keys the schema does not declare, at any depth of nested dataclasses."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key, value in node.items():
        if key not in fields:
            raise ConfigError(
                f"unknown config key {path}.{key} for {schema.__name__}; "
                f"valid keys under {path}: {', '.join(fields)}"
            )
        sub_schema = _dataclass_type(fields[key])
        if sub_schema is not None and isinstance(value, dict):
            check_keys(sub_schema, value, f"{path}.{key}")


def _dataclass_type(f: dataclasses.Field) -> type | None:
    if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        default = f.default_factory()  # type: ignore[misc]
        return type(default) if dataclasses.is_dataclass(default) else None
    return type(f.default) if dataclasses.is_dataclass(f.default) else None


def build(registry: Registry, node: Any, path: str, **extra: Any) -> Any:
    """Instantiate ``registry[node.name]`` with the validated knobs of ``node``."""
    if node is None or "name" not in node:
        raise ConfigError(f"{path}.name is required (one of: {', '.join(registry.names())})")
    name = node["name"]
    cls = registry.get(name)
    params = validate(schema_of(cls), node, path)
    if getattr(cls, "Config", None) is not None:
        try:
            return cls(params, **extra)
        except ConfigError:
            raise
        except ValueError as exc:  # a component rejecting its own config: bad input, exit 2
            raise ConfigError(str(exc)) from exc
    return params if not extra else dataclasses.replace(params, **extra)
