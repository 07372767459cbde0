"""A2A tasks: what a message to an instance starts, keeps and ends (no HTTP here).

``model`` (the v1.0 input shapes), ``hub`` (wake-ups for waiters), ``service`` (send, get, list,
cancel, follow-ups), ``runner`` (one task's exec on hostd: its output as artifact updates, its end
as the final status), ``agentio`` (what the agent gets and the control-channel protocol).
"""

from .service import TaskService

__all__ = ["TaskService"]
