"""Loadouts: what an instance runs (``service``: the built-in ones in ``builtin/`` as YAML
manifests, and the ones operators create in the state dir)."""
