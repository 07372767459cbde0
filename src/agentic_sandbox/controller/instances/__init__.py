"""The instance catalog and everything an instance is made of, behind services that know no HTTP.

``service`` (catalog, reconciliation with hostd, lifecycle), ``provisioning`` (making instances:
cold, warm pool, fork, restore) with ``launch`` (reading a request's launch intent), ``pools``
(warm pools), ``checkpoints``, ``sessions`` (PTY sessions on hostd), ``runtimes``, ``images``,
``watch`` (hostd's instance exits and session changes, followed).
"""
