"""The command-line clients people type; they import ``proto`` only, never ``hostd`` or ``controller``.

- ``agentic-hostctl`` (:mod:`cli.hostctl`): the operator CLI over hostd's socket; its ``attach``
  is :mod:`cli.hostattach`, what it prints :mod:`cli.output`.

No module here creates a process (``tests/test_spawn_fence.py`` checks it).
"""
