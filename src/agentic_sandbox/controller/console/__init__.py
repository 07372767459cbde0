"""The web console at ``/console/``: a static page over the admin, A2A and PTY surfaces.

``assets`` (the built files, read once at start), ``routes`` (the page, the files and the policy
every response under ``/console`` carries). The page's own sources are ``console/src/`` at the top
of the repository; ``scripts/build-console.py`` builds them, with xterm.js from npm, into
``controller/console/build/``. :func:`install_console` registers it all on the app.
"""

from __future__ import annotations

from quart import Quart

from . import routes


def install_console(app: Quart) -> None:
    app.register_blueprint(routes.console)
    app.after_request(routes.secure)  # app-wide: a 405 under /console carries the policy too
