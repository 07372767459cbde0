"""hostd: the host supervisor daemon that owns every process tree and PTY on the host.

Only the modules listed in :data:`SPAWNING_MODULES` may fork, exec or open PTYs; a test
(``tests/test_spawn_fence.py``) checks that no other module of hostd, proto, the controller or
the CLIs (``cli/``) does.
"""

SPAWNING_MODULES = ("agentic_sandbox.hostd.ptyspawn", "agentic_sandbox.hostd.procspawn")
