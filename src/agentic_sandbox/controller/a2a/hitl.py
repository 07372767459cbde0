"""hitl-prompt/v1 on the A2A surface: its card entry and who sees prompts.

The work is in :mod:`controller.tasks.prompts` (envelopes, answers). Here: the card declares the
extension ``required: false`` (left out: the card holds no ``false`` outside the capability flags)
with empty ``params`` as its spec says (an empty object is left out too, see
:func:`controller.a2a.card.check_signable`); a request activates it with ``A2A-Extensions``, which
both shows the prompt envelope on the Tasks and events it gets and lets it answer a prompt
(:attr:`controller.a2a.edge.Caller.sees_prompts`).

The deprecated v1 path ``/api/v1/hitl/{task_id}`` is :mod:`controller.a2a.v1hitl`.
"""

from __future__ import annotations

from typing import Any

from ..tasks.prompts import HITL_EXTENSION


def card_extension() -> dict[str, Any]:
    return {
        "uri": HITL_EXTENSION,
        "description": (
            "An agent may ask a human: the task goes to TASK_STATE_INPUT_REQUIRED with a prompt envelope "
            "(prompt_id, prompt, response_schema) in its status message's metadata; answer with a message to "
            "the task whose metadata.hitl_response_for is {prompt_id, payload}. Activate it to see and answer prompts."
        ),
    }
