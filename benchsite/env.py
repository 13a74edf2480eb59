"""Typed reads of environment variables that fail loudly on bad values."""

from __future__ import annotations

import os


class ConfigError(RuntimeError):
    """A setting read from the environment has a value that cannot be used."""


def env_str(name: str, default: str = "") -> str:
    """The variable's value, or `default` when unset or empty."""
    return os.environ.get(name, "") or default


def env_bool(name: str, default: bool = False) -> bool:
    """Parse 1/0, true/false, yes/no, on/off (any case). Raises ConfigError otherwise."""
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int) -> int:
    """Parse an integer. Raises ConfigError naming the variable on a bad value."""
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None


def env_list(name: str, default: list[str]) -> list[str]:
    """Comma-separated list with blanks dropped."""
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    return [p.strip() for p in raw.split(",") if p.strip()]


def env_float(name: str, default: float) -> float:
    """Parse a finite float. Raises ConfigError naming the variable on a bad value."""
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ConfigError(f"{name}={raw!r} is not a finite number")
    return value


def env_nonneg_int(name: str, default: int) -> int:
    """Parse an integer >= 0. Raises ConfigError naming the variable on a bad value."""
    value = env_int(name, default)
    if value < 0:
        raise ConfigError(f"{name}={value} must be 0 or more")
    return value


def env_header(name: str) -> tuple[str, str] | None:
    """Parse `Header-Name: value` (e.g. `X-Forwarded-Proto: https`) into the pair Django's
    SECURE_PROXY_SSL_HEADER takes: (`HTTP_X_FORWARDED_PROTO`, `https`). None when unset.
    Raises ConfigError naming the variable when the text is not a header name and a value."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    header, sep, value = raw.partition(":")
    header, value = header.strip(), value.strip()
    if not sep or not value or not header or not all(c.isalnum() or c == "-" for c in header):
        raise ConfigError(f"{name}={raw!r} is not 'Header-Name: value' (e.g. 'X-Forwarded-Proto: https')")
    return "HTTP_" + header.upper().replace("-", "_"), value


def env_origins(name: str) -> list[str]:
    """Comma-separated origins, each `https://host[:port]` or `http://...` (Django's
    CSRF_TRUSTED_ORIGINS form). Raises ConfigError naming the variable on one without a scheme."""
    origins = env_list(name, [])
    bad = [o for o in origins if not o.startswith(("https://", "http://")) or o.rstrip("/").count("/") != 2]
    if bad:
        raise ConfigError(f"{name}: {bad} are not origins like https://draftboard.example.org")
    return origins
