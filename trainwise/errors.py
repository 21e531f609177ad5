"""The exception types the CLI turns into one line: bad user input (exit 2) and work that failed (exit 1).

Anything raised as `ConfigError` is printed by the CLI as a single line and exits with code 2;
it is raised at the edge (config, strategy parsing, data and model resolution) before any model
is built or any file is written.
"""


class ConfigError(ValueError):
    """Bad input from the user: the message says what is wrong and what to do instead."""


class RunFailed(RuntimeError):
    """The input was fine but the work failed as a whole (every trial of a study, or training ranks that
    died): the CLI prints the message as one line and exits with code 1."""
