"""The one exception type for bad user input.

Anything raised as `ConfigError` is printed by the CLI as a single line and exits with code 2;
it is raised at the edge (config, strategy parsing, data and model resolution) before any model
is built or any file is written.
"""


class ConfigError(ValueError):
    """Bad input from the user: the message says what is wrong and what to do instead."""
