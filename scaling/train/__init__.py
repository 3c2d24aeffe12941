"""The lab's own training loop (loop.py), a client of the instrument like a user's job: how it
builds each backend's model and optimizer (backends/), its precision, a user's function under
`scaling run` (user_function.py) and the host-sync audit of its steps.
"""
