"""The peer for bench_a2a.py: a2a-sdk's own server (its Starlette REST routes on uvicorn) with an
agent executor that runs ``/bin/echo`` per task, as the controller runs a process per task.

``python bench/peer_a2a_server.py PORT [SQLITE_FILE] [--database-url URL] [--executor module:Class]`` serves
``http://127.0.0.1:PORT/agents/peer``; it prints ``ready`` once listening. ``--executor`` runs
another executor in place of the echo one (bench_agents.py:
``timestamp_executor:TimestampExecutor``). Its tasks are kept in memory (``InMemoryTaskStore``,
what the SDK's samples use) unless a SQLite file is given: then in the SDK's ``DatabaseTaskStore``
on that file, in WAL mode with ``synchronous=NORMAL`` as the controller keeps its store, so that a
task it answered survives a crash as the controller's do. ``--database-url postgresql://...``
keeps them in the same ``DatabaseTaskStore`` on that PostgreSQL database instead (through asyncpg,
SQLAlchemy's pool at its defaults; bench_controllers.py, beside controllers on the same server).
Needs ``a2a-sdk[http-server]`` and ``uvicorn``, for the SQLite store ``a2a-sdk[sqlite]``, for
PostgreSQL ``a2a-sdk[postgresql]`` (all in the ``bench`` extra).

``--grpc`` serves the SDK's gRPC binding instead (its ``GrpcHandler`` on a ``grpc.aio`` server) at
``127.0.0.1:PORT``, the same handler and executor behind it (needs only grpcio, a dependency of the
project itself).
"""

from __future__ import annotations

import asyncio
import importlib
import sys

from a2a.server.agent_execution.agent_executor import AgentExecutor
from a2a.server.agent_execution.context import RequestContext
from a2a.server.events.event_queue import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks.inmemory_task_store import InMemoryTaskStore
from a2a.server.tasks.task_store import TaskStore
from a2a.server.tasks.task_updater import TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part, Task, TaskState, TaskStatus


class EchoExecutor(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = context.task_id or "", context.context_id or ""
        # The SDK wants the Task before any update (else INVALID_AGENT_RESPONSE).
        status = TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)
        await event_queue.enqueue_event(Task(id=task_id, context_id=context_id, status=status))
        proc = await asyncio.create_subprocess_exec(
            "/bin/echo", "-n", context.get_user_input(), stdout=asyncio.subprocess.PIPE
        )
        out, _ = await proc.communicate()
        updater = TaskUpdater(event_queue, task_id, context_id)
        await updater.add_artifact([Part(text=out.decode())])
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        await TaskUpdater(event_queue, context.task_id or "", context.context_id or "").cancel()


def sqlite_store(path: str) -> TaskStore:
    from a2a.server.tasks.database_task_store import DatabaseTaskStore
    from sqlalchemy import event
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(f"sqlite+aiosqlite:///{path}")

    @event.listens_for(engine.sync_engine, "connect")
    def _pragmas(conn: object, _record: object) -> None:
        cursor = conn.cursor()  # type: ignore[attr-defined]
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    return DatabaseTaskStore(engine)


def postgres_store(url: str) -> TaskStore:
    """The SDK's store on a PostgreSQL database, ``postgresql://`` as libpq spells it."""
    from a2a.server.tasks.database_task_store import DatabaseTaskStore
    from sqlalchemy.ext.asyncio import create_async_engine

    scheme, sep, rest = url.partition("://")
    if scheme not in ("postgresql", "postgres") or not sep:
        raise SystemExit(f"--database-url: a postgresql:// URL, not {url!r}")
    return DatabaseTaskStore(create_async_engine(f"postgresql+asyncpg://{rest}"))


async def serve_grpc(handler: DefaultRequestHandler, target: str) -> None:
    import grpc
    from a2a.server.request_handlers.grpc_handler import GrpcHandler
    from a2a.types import a2a_pb2_grpc

    server = grpc.aio.server()
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(GrpcHandler(handler), server)
    server.add_insecure_port(target)
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def main() -> None:
    args = sys.argv[1:]
    executor: AgentExecutor = EchoExecutor()
    if "--executor" in args:
        at = args.index("--executor")
        module, name = args[at + 1].split(":")
        executor = getattr(importlib.import_module(module), name)()
        del args[at : at + 2]
    database_url: str | None = None
    if "--database-url" in args:
        at = args.index("--database-url")
        database_url = args[at + 1]
        del args[at : at + 2]
    grpc_mode = "--grpc" in args
    if grpc_mode:
        args.remove("--grpc")
    port = int(args[0])
    store: TaskStore
    if database_url is not None:
        store = postgres_store(database_url)
    elif len(args) > 1:
        store = sqlite_store(args[1])
    else:
        store = InMemoryTaskStore()
    url = f"127.0.0.1:{port}" if grpc_mode else f"http://127.0.0.1:{port}/agents/peer"
    binding = "GRPC" if grpc_mode else "HTTP+JSON"
    card = AgentCard(
        name="peer",
        description="a2a-sdk echo peer",
        version="1",
        supported_interfaces=[AgentInterface(url=url, protocol_binding=binding, protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="runs /bin/echo", tags=["echo"])],
    )
    handler = DefaultRequestHandler(agent_executor=executor, task_store=store, agent_card=card)
    if grpc_mode:
        asyncio.run(serve_grpc(handler, url))
        return
    import uvicorn
    from a2a.server.routes.rest_routes import create_rest_routes
    from starlette.applications import Starlette

    app = Starlette(routes=create_rest_routes(handler, path_prefix="/agents/peer"))
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)

    async def serve() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.02)
        print("ready", flush=True)
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
