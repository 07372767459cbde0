"""How a provision request wants its instance made: the ``runtime_options`` launch intent.

The contract's ``InstanceProvisionRequest.runtime_options`` (``LoadoutRuntimeOptions``) carries a
provider-neutral ``launch_strategy``; :func:`plan_launch` reads it into a :class:`LaunchPlan`:

* ``cold`` (also no strategy and no warm pool for the loadout): make the instance from scratch.
* no strategy, but ``AIWG_WARM_POOLS`` keeps a pool of the request's loadout: take a ready slot
  from it, else make it cold (a miss, counted by hostd). The request is the same either way.
* ``warm_pool``: take a slot of the pool ``asset_ref``; none ready fails the operation
  (``warm_pool.empty``) unless ``constraints.fallback_mode`` is ``cold``.
* ``restore``: restore the checkpoint ``asset_ref`` as the instance (``qemu`` only).
* ``fork``: copy the running instance ``asset_ref`` (id or name) into the new one.

As the contract says, ``kind`` must match ``runtime`` and ``provider`` the top-level provider, a
non-cold strategy needs ``asset_ref`` and takes none of the cold-only fields (``loadout``,
``profile``, ``image``, ``agentshare``, ``mounts``, ``labels``, ``working_dir``, ``ssh_key``; here
also ``resources``): the asset decides what the instance is. Unsupported runtime/mode
combinations are 422 naming the field. Pure: no I/O here.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Literal

import msgspec

from ..errors import ValidationFailed
from ..models import ProvisionRequest

Mode = Literal["cold", "warm_pool", "restore", "fork"]
#: Admin runtime -> the launch modes it offers besides ``cold``.
MODES: dict[str, tuple[str, ...]] = {"qemu": ("warm_pool", "restore", "fork"), "docker": ("warm_pool", "fork")}
COLD_ONLY = ("loadout", "profile", "image", "agentshare", "mounts", "labels", "working_dir", "ssh_key", "resources")


class LaunchPlan(msgspec.Struct, frozen=True, kw_only=True):
    mode: Mode
    #: The pool, checkpoint or source instance the mode names.
    asset: str | None = None
    #: ``warm_pool``: make the instance cold when the pool has no ready slot.
    fallback_cold: bool = False
    #: The pool was chosen by configuration, not asked for (``runtime_options`` named no strategy).
    implicit: bool = False


def _invalid(field: str, message: str) -> ValidationFailed:
    return ValidationFailed([{"field": f"runtime_options.{field}", "message": message}])


def _given(req: ProvisionRequest, field: str) -> bool:
    value = getattr(req, field)
    return value not in (None, False, [], {})


def plan_launch(req: ProvisionRequest, runtime: str, provider: str, pools: Container[str]) -> LaunchPlan:
    """The launch plan of ``req`` for the admin ``runtime`` (aliases resolved) served by hostd's
    ``provider``; ``pools``: the loadouts with a warm pool ready to hand out slots."""
    options = req.runtime_options
    strategy = options.launch_strategy if options is not None else None
    if options is not None and options.provider is not None:
        if req.provider is not None and options.provider != req.provider:
            raise _invalid("provider", f"must match provider {req.provider!r}")
        if options.provider != provider:
            raise _invalid("provider", f"runtime {req.runtime!r} is served by {provider!r}")
    if strategy is None:
        if req.loadout is not None and req.loadout in pools:
            return LaunchPlan(mode="warm_pool", asset=req.loadout, fallback_cold=True, implicit=True)
        return LaunchPlan(mode="cold")
    if strategy.mode == "cold":
        return LaunchPlan(mode="cold")
    if strategy.mode not in MODES.get(runtime, ()):
        offered = ", ".join(("cold", *MODES.get(runtime, ())))
        raise _invalid("launch_strategy.mode", f"runtime {req.runtime!r} offers {offered}")
    if not strategy.asset_ref:
        raise _invalid("launch_strategy.asset_ref", f"launch mode {strategy.mode!r} names its asset here")
    for field in COLD_ONLY:
        if _given(req, field):
            raise ValidationFailed(
                [{"field": field, "message": f"not with launch mode {strategy.mode!r}: the asset decides it"}]
            )
    fallback = options is not None and options.constraints is not None and options.constraints.fallback_mode == "cold"
    return LaunchPlan(mode=strategy.mode, asset=strategy.asset_ref, fallback_cold=fallback)
