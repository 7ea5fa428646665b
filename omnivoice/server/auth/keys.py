"""API keys: where they come from (OMNIVOICE_API_KEY, `auth.api_key_file`), how a presented token is
matched (constant time), the label logs use instead of a key, and the loopback rule for a server that
has none."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from omnivoice.config import AuthConfig

ENV_VAR = "OMNIVOICE_API_KEY"
ANONYMOUS = "anonymous"  # the principal of every request when no key is configured


class KeyConfigError(ValueError):
    """The keys cannot be loaded (unreadable or empty key file, a key with blanks)."""


class ApiKeys:
    """The server's API keys. Falsy when there are none (then every request is anonymous)."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        unique = dict.fromkeys(keys)  # keeps order, drops repeats
        for key in unique:
            if not key or any(c.isspace() for c in key) or "," in key:
                raise KeyConfigError("an API key is empty or holds blanks or commas")
        self._keys = tuple((k.encode(), key_id(k)) for k in unique)

    @classmethod
    def load(cls, config: AuthConfig, environ: Mapping[str, str] = os.environ) -> ApiKeys:
        """The keys of `$OMNIVOICE_API_KEY` (comma-separated) and of `config.api_key_file`."""
        keys = [k.strip() for k in environ.get(ENV_VAR, "").split(",") if k.strip()]
        if config.api_key_file:
            path = Path(config.api_key_file).expanduser()
            try:
                text = path.read_text()
            except OSError as e:
                raise KeyConfigError(f"auth.api_key_file: cannot read {path}: {e.strerror}") from None
            in_file = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
            in_file = [k for k in in_file if k]
            if not in_file:
                raise KeyConfigError(f"auth.api_key_file: {path} holds no key (one per line, # comments)")
            keys += in_file
        return cls(keys)

    def __bool__(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:  # never the keys themselves
        return f"ApiKeys({len(self._keys)} keys)"

    def match(self, token: str) -> str | None:
        """The id of the key `token` is, or None. Every key is compared, each in constant time."""
        presented = token.encode()
        found = None
        for key, kid in self._keys:
            if hmac.compare_digest(key, presented):
                found = kid
        return found

    def owners(self) -> tuple[str, ...]:
        """Every principal requests can have: each key's id, and `anonymous` (no key configured)."""
        return (*(kid for _, kid in self._keys), ANONYMOUS)

    def secrets(self) -> tuple[str, ...]:
        """The keys themselves: only for redacting them from logs."""
        return tuple(k.decode() for k, _ in self._keys)


def key_id(key: str) -> str:
    """How logs and limits name a key: `key-` and 8 hex digits of its SHA-256 (not reversible)."""
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:8]


def is_loopback(host: str) -> bool:
    """Whether binding `host` serves this machine only (`localhost`, 127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # another host name: it may resolve to any interface


class UnsafeBind(Exception):
    """A non-loopback bind without any API key, not explicitly allowed."""


def check_bind(host: str, keys: ApiKeys, config: AuthConfig, insecure: bool = False) -> None:
    """Refuse (UnsafeBind) to serve other machines with no key, unless explicitly allowed."""
    if keys or is_loopback(host) or insecure or config.allow_unauthenticated_remote:
        return
    raise UnsafeBind(
        f"refusing to listen on {host} without an API key: anyone who reaches it could use the model. "
        f"Set {ENV_VAR}=<key> (several: comma-separated) or auth.api_key_file in the profile, "
        "or listen on 127.0.0.1; --insecure-no-auth (or auth.allow_unauthenticated_remote: true) "
        "serves it open anyway"
    )
