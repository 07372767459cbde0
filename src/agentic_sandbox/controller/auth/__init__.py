"""Who may call: operator and instance bearer tokens (``tokens``), and each instance's own
credentials, its A2A token and AgentCard signing key (``credentials``). No HTTP here: the routes'
role check is :mod:`agentic_sandbox.controller.http.roles`.
"""
