"""The application layer: one module per verb, each a typed call that shows its progress through a `Render`
(api/render.py: on stderr by default, nothing with `render=None`) and prints nothing itself.

`trainwise.compare(...)` and `trainwise.open(...)` are these (docs/python-api.md); the CLI is a shell
over them: it turns options into the same calls and renders what they return.
"""
