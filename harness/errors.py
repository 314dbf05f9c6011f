"""Errors the harness reports to its users as one line."""


class ConfigError(ValueError):
    """A config, scenario or flag that no real system allows; names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
