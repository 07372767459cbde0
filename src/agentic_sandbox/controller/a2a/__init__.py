"""Surface 2: every instance an A2A v1.0 agent under ``/agents/{instance_id}``.

The service layer knows no HTTP: ``service`` (each A2A operation, once, built with what it uses),
``caller`` (who a request comes from), ``streams`` (the bodies of task streams), ``views`` (tasks as
v1.0 JSON), ``card`` (the AgentCard and its signature), ``idempotencycache`` (idempotency/v1's
memory), ``tenancy``, ``hitl``, ``ptyext`` (the extensions' card entries and rules), ``errors`` (the
A2A error body and its one translation from the domain family). A2A 0.3, translated at the edges
only: ``wire03`` (0.3 JSON to and from the 1.0 JSON the service speaks), ``proto03`` (0.3's
protobuf JSON, through a2a-sdk's compat layer), ``card03`` (the card's 0.3 fields and signatures).

The surface: ``surface`` (the blueprint, from ``blueprint``, with its routes registered), ``edge``
(token, instance, version and extension rules every request passes), ``discovery`` (card and JWKS
routes), ``rest`` (the HTTP+JSON binding, at the standard and the ``/v1/`` paths, with ``rest03``
choosing and making a 0.3 answer), ``jsonrpc`` (the JSON-RPC 2.0 binding at the base URL, with
``rpcframing``, its envelopes and frames, and ``rpc03``, 0.3's methods), ``sse`` (stream
responses), ``idempotency`` (the guard around sends), ``v1hitl`` (the v1 hitl paths),
``grpcbinding`` (the gRPC binding, on its own port; with
``grpcbridge``, its server's threads bridged to the trio loop, and ``grpcwire``, protobuf and
``google.rpc.Status`` for the A2A JSON and errors, neither of which touches a request). This init
imports nothing, so the services beside it do not pull the web framework in.
"""
