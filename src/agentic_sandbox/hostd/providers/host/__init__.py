"""The host runtime: an instance is a working directory, an environment, a cgroup and optionally a
supervised main process on the host itself (``provider``; its directory and env: ``directory``)."""
