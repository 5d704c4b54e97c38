"""Errors that name the host and the variable a user has to fix."""

from __future__ import annotations


class InventoryError(ValueError):
    """Bad inventory input, found before any node is touched."""

    def __init__(self, message: str, host: str | None = None, variable: str | None = None):
        self.host = host
        self.variable = variable
        prefix = f"host {host}: " if host else ""
        super().__init__(f"{prefix}{message}")
