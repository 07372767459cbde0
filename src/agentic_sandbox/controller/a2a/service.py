"""The A2A service: every A2A operation, once. Both bindings (HTTP+JSON in ``rest``, JSON-RPC in
``jsonrpc``) read their request into these typed parameters and call the same method.

Each takes the :class:`~agentic_sandbox.controller.a2a.edge.Caller` its binding's edge produced and
returns the A2A JSON result (a dict) or, for the streaming operations, the body of an SSE stream.
The service is built with what it uses (store, task and push services, credentials, loadouts) and
knows no HTTP: the base URL a card names comes with the caller, so it works outside a request too.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

import msgspec

from agentic_sandbox.proto import messages as m

from ..auth.credentials import InstanceCredentials
from ..errors import TASK_FILE_NOT_FOUND, UNSUPPORTED_OPERATION, InvalidState, NotFound
from ..instances.catalog import not_found
from ..loadouts.service import LoadoutService
from ..push import PushService
from ..push.configs import ConfigRef, ListParams, PushConfigIn, convert
from ..push.configs import view as push_view
from ..push.target import check_literal
from ..store import InstanceRecord, SigningKeyRecord, Store, TaskRecord, TaskSnapshot
from ..tasks.agentevents import ANSWERED_WITH
from ..tasks.model import Id, Metadata, SendMessageRequest
from ..tasks.service import ListQuery, TaskService
from . import agentoutput, card03, hitl, ptyext, tenancy
from .caller import Caller
from .card import build_card, grpc_interface, instance_url, sign_card
from .idempotencycache import IdempotencyCache
from .streams import Framing, TaskStreams
from .views import read_snapshot, task_view

#: The bindings served at the base URL: JSON-RPC first (what a2a-sdk clients pick by default).
BINDINGS = ("JSONRPC", "HTTP+JSON")
STREAMING = True

#: Signed cards kept (a few per instance: one per origin it is reached at).
SIGNED_CARDS_KEPT = 1024

HistoryLength = Annotated[int, msgspec.Meta(ge=0, le=10000)]


class GetTaskParams(msgspec.Struct, rename="camel", kw_only=True):
    id: Id
    history_length: HistoryLength | None = None
    tenant: str | None = None


class TaskIdParams(msgspec.Struct, rename="camel", kw_only=True):
    id: Id
    metadata: Metadata | None = None
    tenant: str | None = None


class StoredFile(msgspec.Struct, frozen=True, kw_only=True):
    """A file an agent returned, as a download serves it."""

    chunks: Iterator[bytes]
    size: int
    filename: str | None
    media_type: str | None


class A2AService:
    def __init__(
        self,
        store: Store,
        tasks: TaskService,
        push: PushService,
        credentials: InstanceCredentials,
        loadouts: LoadoutService,
        idempotency: IdempotencyCache,
        *,
        keepalive_s: float,
        push_allow_private: bool,
    ) -> None:
        self._store = store
        self._tasks = tasks
        self._push = push
        self._credentials = credentials
        self._loadouts = loadouts
        self._idempotency = idempotency
        self._streams = TaskStreams(store, tasks.hub, keepalive_s=keepalive_s)
        self._push_allow_private = push_allow_private
        #: The gRPC binding's port while it is served (set by the app once it listens): cards then
        #: list the GRPC interface (controller.a2a.grpcbinding).
        self.grpc_port: int | None = None
        #: Signed cards by (kid, jku, the unsigned card's bytes), oldest first.
        self._signed_cards: dict[tuple[str, str, bytes], dict[str, Any]] = {}

    # -- what the edge and discovery read ---------------------------------------------------------

    async def instance(self, instance_id: str) -> InstanceRecord:
        """The instance an A2A request names, as the catalog has it; a destroyed one is not found."""
        rec = await self._store.instances.get(instance_id)
        if rec is None or rec.state == "destroyed":
            raise not_found(instance_id)
        return rec

    async def find_task(self, task_id: str) -> TaskRecord | None:
        """A task by its id alone, whichever instance it belongs to (the v1 paths name no instance)."""
        return await self._store.tasks.get(task_id)

    async def signed_card(self, rec: InstanceRecord, base_url: str) -> tuple[dict[str, object], SigningKeyRecord]:
        """The instance's AgentCard as served at ``base_url``, signed, and the key that signed it."""
        loadout = self._loadouts.get(rec.loadout) if rec.loadout else None
        card = build_card(
            rec,
            base_url,
            loadout_description=loadout.manifest.description if loadout is not None else None,
            streaming=STREAMING,
            bindings=BINDINGS,
        )
        if self.grpc_port is not None:
            card["supportedInterfaces"].append(grpc_interface(base_url, self.grpc_port, rec.id))
        card["capabilities"]["extensions"] += [
            self._idempotency.card_extension(),
            hitl.card_extension(),
            tenancy.card_extension(),
            ptyext.card_extension(),
            agentoutput.card_extension(),
        ]
        key_rec, key = await self._credentials.signing_key(rec.id)
        jku = f"{instance_url(base_url, rec.id)}/.well-known/jwks.json"
        served = card03.with_v03_fields(card)  # one card for 1.0 and 0.3 clients alike
        # Signing (three signatures, a 0.3 model validation) costs far more than the request
        # around it, on an endpoint anyone may call: a card is signed once per distinct content.
        cache_key = (key_rec.kid, jku, msgspec.json.encode(served))
        signed = self._signed_cards.get(cache_key)
        if signed is None:
            also = tuple(card03.signing_payloads(card, served))
            signed = sign_card(served, key, kid=key_rec.kid, jku=jku, also=also)
            self._signed_cards[cache_key] = signed
            while len(self._signed_cards) > SIGNED_CARDS_KEPT:
                self._signed_cards.pop(next(iter(self._signed_cards)))
        return copy.deepcopy(signed), key_rec

    async def jwks(self, instance_id: str | None = None) -> dict[str, Any]:
        """The public signing keys: one instance's, or every instance's."""
        return await self._credentials.jwks(instance_id)

    # -- the operations ------------------------------------------------------------------------------

    async def view(
        self, caller: Caller, task: TaskRecord | str, *, history_length: int | None = None
    ) -> dict[str, Any]:
        """The Task as the caller sees it: read at one point of its timeline (given an id), or in the
        state an operation left it (given its row; what happened since shows in artifacts only)."""
        task_id = task if isinstance(task, str) else task.id
        snap = await read_snapshot(self._store, caller.instance.id, task_id, history_length)
        if not isinstance(task, str):
            snap.record = task
        return self.shown_view(caller, snap)

    def shown_view(self, caller: Caller, snap: TaskSnapshot) -> dict[str, Any]:
        return task_view(
            snap,
            caller.instance,
            disclose_host=caller.discloses_host,
            prompts=caller.sees_prompts,
            base_url=caller.base_url,
            wire=caller.wire,
        )

    async def send(self, caller: Caller, req: SendMessageRequest) -> Any:
        """The task service's send, with the configuration's inline push config (if any) made for
        the task: checked before the send, delivering from the task's start (a new task) or from
        the message sent (a follow-up)."""
        config = req.configuration
        if config is None or config.task_push_notification_config is None:
            return await self._tasks.send(
                caller.instance, req, prompts_active=caller.sees_prompts, extensions=caller.extensions
            )
        push = convert(config.task_push_notification_config, PushConfigIn)
        check_literal(push.url, allow_private=self._push_allow_private)
        from_seq = 0
        if req.message.task_id is not None:
            from_seq = (await self._tasks.get(caller.instance.id, req.message.task_id)).last_seq
        plain = msgspec.structs.replace(config, task_push_notification_config=None)
        rec = await self._tasks.send(
            caller.instance,
            msgspec.structs.replace(req, configuration=plain),
            prompts_active=caller.sees_prompts,
            extensions=caller.extensions,
        )
        await self._push.create(caller.instance.id, rec.id, push, from_seq=from_seq, extensions=caller.extensions)
        return rec

    async def send_message(self, caller: Caller, req: SendMessageRequest) -> dict[str, Any]:
        rec = await self.send(caller, tenancy.apply(caller.extensions, req))
        config = req.configuration
        if config is None or not config.return_immediately:
            rec = await self._tasks.wait_settled(rec.id)
        if rec.metadata.get(ANSWERED_WITH) == "message" and isinstance(rec.status.get("message"), dict):
            return {"message": rec.status["message"]}  # the agent answered with a Message, not a task
        history = config.history_length if config is not None else None
        return {"task": await self.view(caller, rec, history_length=history)}

    async def send_streaming_message(
        self, caller: Caller, req: SendMessageRequest, framing: Framing | None = None
    ) -> tuple[dict[str, Any], AsyncIterator[bytes]]:
        """The stream of the task the message went to, and what names it (``taskId``, and
        ``fromCreation``: a new task streams from its creation, a follow-up from the task as it stands)
        so that idempotency/v1 can attach a repeat to the same stream (:func:`attach_stream`)."""
        rec = await self.send(caller, tenancy.apply(caller.extensions, req))
        stream = {"taskId": rec.id, "fromCreation": req.message.task_id is None}
        return stream, self.attach_stream(caller, stream, framing)

    def attach_stream(
        self, caller: Caller, stream: dict[str, Any], framing: Framing | None = None
    ) -> AsyncIterator[bytes]:
        return self._streams.events(caller, stream["taskId"], from_creation=stream["fromCreation"], framing=framing)

    async def get_task(self, caller: Caller, params: GetTaskParams) -> dict[str, Any]:
        return await self.view(caller, params.id, history_length=params.history_length)

    async def list_tasks(self, caller: Caller, query: ListQuery) -> dict[str, Any]:
        page = await self._tasks.list(caller.instance.id, query)
        history = 0 if query.history_length is None else query.history_length
        store, tasks = self._store, []
        for rec in page.tasks:
            snap = await store.tasks.snapshot(rec.id, history, artifacts=query.include_artifacts)
            if snap is not None:  # else purged since the page was read (the page is this instance's)
                tasks.append(self.shown_view(caller, snap))
        return {
            "tasks": tasks,
            "nextPageToken": page.next_page_token,
            "pageSize": page.page_size,
            "totalSize": page.total_size,
        }

    async def cancel_task(self, caller: Caller, params: TaskIdParams) -> dict[str, Any]:
        rec = await self._tasks.cancel(caller.instance.id, params.id)
        return await self.view(caller, rec)

    async def subscribe_to_task(
        self, caller: Caller, params: TaskIdParams, framing: Framing | None = None
    ) -> AsyncIterator[bytes]:
        rec = await self._tasks.get(caller.instance.id, params.id)
        if rec.terminal:
            raise InvalidState(UNSUPPORTED_OPERATION, f"task {rec.id} is {rec.state}: there is nothing to subscribe to")
        await self._wake_on_traffic(caller.instance, "a2a.subscribe")
        return self._streams.events(caller, rec.id, from_creation=False, framing=framing)

    async def _wake_on_traffic(self, instance: InstanceRecord, cause: str) -> None:
        """A subscriber to a task of a sleeping instance wakes it, as a send does (hostd wakes the
        instance itself for what runs there); not one whose policy says it wakes only by hand.
        A wake that fails is the caller's answer (503 ``instance.wake_failed``)."""
        if instance.sleep is None or not (instance.idle or {}).get("wake_on_traffic", True):
            return
        await self._tasks.link.call(m.InstanceWakeRequest(instance_id=instance.id, cause=cause))

    async def create_push_config(self, caller: Caller, task_id: str, cfg: PushConfigIn) -> dict[str, Any]:
        rec = await self._tasks.get(caller.instance.id, task_id)
        # Delivery starts with the task's next event (the config is for what happens from now on).
        made = await self._push.create(
            caller.instance.id, rec.id, cfg, from_seq=rec.last_seq, extensions=caller.extensions
        )
        return push_view(made)

    async def get_push_config(self, caller: Caller, ref: ConfigRef) -> dict[str, Any]:
        await self._tasks.get(caller.instance.id, ref.task_id)
        return push_view(await self._push.configs.get(ref.task_id, ref.id))

    async def list_push_configs(self, caller: Caller, params: ListParams) -> dict[str, Any]:
        await self._tasks.get(caller.instance.id, params.task_id)
        recs, next_token = await self._push.configs.list(params)
        return {"configs": [push_view(rec) for rec in recs], "nextPageToken": next_token}

    async def delete_push_config(self, caller: Caller, ref: ConfigRef) -> dict[str, Any]:
        await self._tasks.get(caller.instance.id, ref.task_id)
        await self._push.delete(ref.task_id, ref.id)
        return {}

    async def task_file(self, caller: Caller, task_id: str, file_id: str) -> StoredFile:
        """A file one of the task's artifacts holds on disk (only those: the id is looked up in the
        stored artifacts, never used as a path first); TASK_FILE_NOT_FOUND otherwise."""
        await self._tasks.get(caller.instance.id, task_id)
        for artifact in await self._store.tasks.artifacts(task_id):
            for part in artifact.get("parts") or []:
                ref = part.get("file") if isinstance(part, dict) else None
                if isinstance(ref, dict) and ref.get("id") == file_id:
                    size = int(ref["size"])
                    if (self._tasks.files.size(task_id, file_id) or 0) < size:
                        break  # gone from the disk (or cut short): not served as if whole
                    return StoredFile(
                        chunks=self._tasks.files.chunks(task_id, file_id, size),
                        size=size,
                        filename=part.get("filename"),
                        media_type=part.get("mediaType"),
                    )
        raise NotFound(TASK_FILE_NOT_FOUND, f"task {task_id} has no file {file_id[:64]!r}", details={"taskId": task_id})

    async def extended_agent_card(self, caller: Caller) -> dict[str, Any]:
        card, _key = await self.signed_card(caller.instance, caller.base_url)
        return card
