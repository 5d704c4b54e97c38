"""Secrets in the ranks' environment: which values are secret, and how they are shown.

A value is secret when the user says so (launch_secret_env) or when it holds a URL with
credentials (``http://user:password@proxy:3128``, ``https://TOKEN@index``). Secret values
never reach the plan, the report or a command line; where such a URL is shown, its
credentials are replaced by ``***``. Everything here is pure.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from torchfleet.errors import InventoryError
from torchfleet.ranks import RANK_ENV_NAMES

# scheme://userinfo@ ; userinfo runs to the last @ before the host (a password may hold an
# unescaped @), and never spans whitespace, a path or a query.
URL_CREDENTIALS = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]*)@")
MASK = "***"
# How a launch_secret_env value is shown: only its name is.
HIDDEN = "<secret>"
# A secret reaches a rank through a shell that sources a file, so its name must be one a
# shell accepts.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def redact(text: Any) -> str:
    """``text`` with the credentials of every URL in it replaced by ``***``."""
    return URL_CREDENTIALS.sub(lambda m: f"{m['scheme']}{MASK}@" if m["userinfo"] else m[0], str(text))


def has_credentials(text: Any) -> bool:
    """Whether ``text`` holds a URL with a user, a password or a token before its host."""
    return any(m["userinfo"] for m in URL_CREDENTIALS.finditer(str(text)))


def check_env(env: Mapping[str, Any] | None, secret: Mapping[str, Any] | None = None,
              host: str | None = None) -> None:
    """Refuse secret names a rank could not get: each secret reaches a rank through a shell
    that sources a file, so its name must be a shell variable's, and it may not also be set
    in the open. The message names the host and the variable, never a value."""
    env, secret = dict(env or {}), dict(secret or {})
    for name in secret:
        if not ENV_NAME.match(str(name)):
            raise InventoryError(f"launch_secret_env name {name!r} is not an environment variable name",
                                 host, "launch_secret_env")
        if name in RANK_ENV_NAMES:
            raise InventoryError(f"launch_secret_env may not override {name}", host, "launch_secret_env")
        if name in env:
            raise InventoryError(f"{name} is set both in launch_secret_env and in the open environment "
                                 "(launch_extra_env or launch_proxy_env); set it in one place", host,
                                 "launch_secret_env")
    for name, value in env.items():
        if has_credentials(value) and not ENV_NAME.match(str(name)):
            raise InventoryError(f"{name!r} holds credentials in a URL, so it is passed as a secret, but it is "
                                 "not an environment variable name", host, "launch_extra_env")


def split_env(env: Mapping[str, Any] | None, secret: Mapping[str, Any] | None = None) -> dict[str, dict[str, str]]:
    """Split a rank environment into what may be passed and shown openly, and what is secret.

    ``env`` is the ordinary environment (proxies, launch_extra_env); a value of it that holds
    a URL with credentials moves to the secret part. ``secret`` (launch_secret_env) is secret
    whole. Returns ``public`` and ``secret`` (name -> value) and ``shown`` (every name, as
    the plan and the report may show it). check_env says whether the names are usable.
    """
    public, hidden, shown = {}, {}, {}
    for name, value in (env or {}).items():
        name, value = str(name), str(value)
        if has_credentials(value):
            hidden[name], shown[name] = value, redact(value)
        else:
            public[name], shown[name] = value, value
    for name, value in (secret or {}).items():
        hidden[str(name)], shown[str(name)] = str(value), HIDDEN
    return {"public": public, "secret": hidden, "shown": shown}
