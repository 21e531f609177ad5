"""The application layer: one module per verb, each a typed call that prints nothing.

`trainwise.compare(...)` and `trainwise.open(...)` are these (docs/python-api.md); the CLI is a shell
over them: it turns options into the same calls and renders what they return.
"""
