"""The command-line clients people type; they import ``proto`` only, never ``hostd`` or ``controller``.

- ``agentic-hostctl`` (:mod:`cli.hostctl`): the operator CLI over hostd's socket; its ``attach``
  is :mod:`cli.hostattach`, what it prints :mod:`cli.output`.
- :mod:`cli.terminal`: the raw-mode terminal every attach command uses (keys, output, window
  size, signals, detach keys, the cursor file); it knows no transport.

No module here creates a process (``tests/test_spawn_fence.py`` checks it).
"""
