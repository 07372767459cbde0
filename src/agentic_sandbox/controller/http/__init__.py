"""The HTTP edge every surface shares: response helpers, request decoding into problems, the rules
every route keeps, the connection class, and the one translation of service errors to problem+json.

Services never import from here; surfaces (``admin/``, ``a2a/``, ``pty/``, ``console/``, ``v1``,
``observability``) do.
"""
