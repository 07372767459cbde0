"""End-to-end scenarios run on the controller tests' live fixtures: a real hostd process and a real
controller on a loopback port (see ``tests/controller/conftest.py``)."""

from tests.controller.conftest import admin, anon, controller, hostd, operator, short_dir

__all__ = ["admin", "anon", "controller", "hostd", "operator", "short_dir"]
