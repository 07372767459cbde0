"""Surface 2: every instance an A2A v1.0 agent under ``/agents/{instance_id}``.

The service layer knows no HTTP: ``service`` (each A2A operation, once, built with what it uses),
``caller`` (who a request comes from), ``streams`` (the bodies of task streams), ``views`` (tasks as
v1.0 JSON), ``card`` (the AgentCard and its signature), ``idempotencycache`` (idempotency/v1's
memory), ``tenancy``, ``hitl``, ``ptyext`` (the extensions' card entries and rules), ``errors`` (the
A2A error body and its one translation from the domain family).

The surface: ``surface`` (the blueprint, from ``blueprint``, with its routes registered), ``edge``
(token, instance, version and extension rules every request passes), ``discovery`` (card and JWKS
routes), ``rest`` (the HTTP+JSON binding, at the standard and the ``/v1/`` paths), ``jsonrpc`` (the
JSON-RPC 2.0 binding at the base URL), ``sse`` (stream responses), ``idempotency`` (the guard around
sends), ``v1hitl`` (the v1 hitl paths). This init imports nothing, so the services beside it do not
pull the web framework in.
"""
