"""An agent written with agentic_sandbox_agent; what it does is the scenario its task's text names.

The tests start it with ``python helper_agent.py`` and play the controller; a scenario's further
arguments, when it needs some, come in the task's ``data`` parts.
"""

from __future__ import annotations

import hashlib
import io
import sys
import threading
import time

import agentic_sandbox_agent as agent
from agentic_sandbox_agent import Channel, State


def states(ch: Channel) -> None:
    """A status in each state, in each of the forms ``status`` takes."""
    ch.status(text="plain working")
    ch.status("working", metadata={"step": 1})
    ch.status("input_required", message="what now?")
    ch.status("TASK_STATE_AUTH_REQUIRED", message={"parts": [agent.url_part("https://auth.example.com")]})
    ch.status(State.FAILED, text="failed once")
    ch.status(State.CANCELED)
    ch.reject("rejected")
    ch.fail("failed")
    ch.complete("completed")
    try:
        ch.status("TASK_STATE_SUBMITTED")
    except ValueError as exc:
        print("refused locally:", exc, file=sys.stderr)


def parts(ch: Channel) -> None:
    """Artifacts with every part kind, their filename, mediaType and metadata, and appends."""
    ch.artifact(
        "kinds",
        [
            agent.text_part("some text", media_type="text/plain", metadata={"lang": "en"}),
            agent.raw_part(b"\x00\xffbytes", filename="b.bin", media_type="application/octet-stream"),
            agent.url_part("https://example.com/x.png", filename="x.png", media_type="image/png", metadata={"n": 1}),
            agent.data_part({"k": [1, 2, {"z": None}]}, media_type="application/json"),
            "a bare string",
            {"raw": b"raw bytes in a dict", "filename": "d.bin"},
        ],
        name="kinds",
        description="one of each",
        metadata={"origin": "helper"},
        extensions=["https://example.com/ext"],
    )
    first = ch.send_text("part one, ", name="streamed")
    ch.send_text("part two", first, append=True, last_chunk=True)
    ch.send_data({"answer": 42}, "data", media_type="application/json", metadata={"m": True})
    try:
        ch.artifact("bad", [{"text": "a", "url": "b"}])
    except ValueError as exc:
        ch.send_text(f"ValueError: {exc}", "refused-locally")
    try:
        ch.send_text("x" * (1024 * 1024), "too-long")
    except ValueError as exc:
        ch.send_text(f"ValueError: {exc}", "too-long-refused")
    ch.complete()


def files(ch: Channel) -> None:
    """send_file from a path, bytes and a file object; the sizes and chunk sizes come as data."""
    (spec,) = ch.task.data()
    chunk = spec["chunk"]
    ch.send_file(spec["path"], chunk_size=chunk, artifact_id="from-path", metadata={"source": "path"})
    blob = bytes(i % 256 for i in range(spec["bytes"]))
    ch.send_file(blob, "blob.dat", "application/x-test", artifact_id="from-bytes", chunk_size=chunk)
    reader = _CountingReader(blob)
    ch.send_file(reader, "io.dat", artifact_id="from-io", chunk_size=chunk)
    ch.send_data({"largestRead": max(reader.sizes), "reads": len(reader.sizes)}, "reads")
    ch.send_file(b"", "empty.txt", artifact_id="empty")
    try:
        ch.send_file(blob, "x", chunk_size=agent.MAX_FILE_CHUNK + 1)
    except ValueError:
        pass
    else:
        raise AssertionError("a chunk over 512 KiB was accepted")
    ch.complete(hashlib.sha256(blob).hexdigest())


class _CountingReader(io.BytesIO):
    """A binary file that records how much each read asked for (send_file must not read it all)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.sizes: list[int] = []

    def read(self, size: int | None = -1) -> bytes:
        self.sizes.append(-1 if size is None else size)
        return super().read(size)


def received(ch: Channel) -> None:
    """What the task carried, read through the helper, sent back as data."""
    task = ch.task
    ch.send_data(
        {
            "taskId": task.task_id,
            "contextId": task.context_id,
            "extensions": task.extensions,
            "metadata": task.metadata,
            "text": task.text(" | "),
            "data": task.data(),
            "files": [
                {
                    "filename": f.filename,
                    "mediaType": f.media_type,
                    "metadata": f.metadata,
                    "sha256": hashlib.sha256(f.data).hexdigest() if f.data is not None else None,
                    "url": f.url,
                }
                for f in task.files()
            ],
            "parts": len(task.parts),
        },
        "received",
    )


def reply(ch: Channel) -> None:
    ch.reply({"parts": [agent.text_part("direct answer"), agent.data_part({"n": 1})], "metadata": {"r": 1}})


def ask(ch: Channel) -> None:
    """Ask, then report the answer and the follow-up that came while it waited."""
    schema = {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}
    payload = ch.ask(
        "Deploy?", schema, prompt_id="6f1b3c1e-0a0b-4c4d-8e8f-000000000001", deadline="2999-01-01T00:00:00Z"
    )
    assert ch.last_input_response is not None
    ch.send_data({"payload": payload, "answeredBy": ch.last_input_response.text()}, "answer")
    event = ch.next_event(timeout=10)
    assert isinstance(event, agent.FollowUp), event
    ch.send_text(f"follow-up: {event.text()}", "follow-up")
    assert ch.next_event(timeout=0.2) is None  # the duplicates were dropped
    ch.complete()


def ask_invalid(ch: Channel) -> None:
    try:
        ch.ask("Deploy?", {"type": "object"})
    except agent.AskError as exc:
        ch.fail(f"AskError: {exc}")


def events(ch: Channel) -> None:
    """Each event as it comes, sent back as data, until a follow-up says stop."""
    ch.status(text="listening")
    for event in ch:
        ch.send_data({"type": event.type, "class": type(event).__name__, "line": event.line})
        if isinstance(event, agent.FollowUp) and event.text() == "stop":
            break
    ch.complete()


def cancel(ch: Channel) -> None:
    """Work until canceled; run() then sets TASK_STATE_CANCELED."""
    ch.status(text="working until canceled")
    if not ch.canceled.wait(TIMEOUT):
        raise AssertionError("no cancel came")
    sys.stderr.write(f"saw cancel: {ch.cancel_reason}\n")


def ask_canceled(ch: Channel) -> None:
    """A cancel while ask() waits: Canceled, which run() turns into TASK_STATE_CANCELED."""
    ch.ask("Wait for me?", {"type": "object"})


def raises(ch: Channel) -> None:
    ch.status(text="about to fail")
    raise ValueError("boom")


def offline(ch: Channel) -> None:
    """Without a channel: what goes to stdout and stderr."""
    print(f"task {ch.task.task_id} in {ch.task.context_id}, protocol {ch.protocol}", file=sys.stderr)
    ch.status(text="progress goes to stderr")
    ch.send_text("artifact text\n")
    ch.send_data({"k": 1})
    ch.send_file(b"file bytes\n", "f.txt", chunk_size=4)
    try:
        ch.ask("?", {"type": "object"})
    except agent.NoChannel as exc:
        print("NoChannel:", exc, file=sys.stderr)
    try:
        ch.next_event(timeout=1)
    except agent.ChannelClosed:
        print("no events", file=sys.stderr)
    ch.complete("completed text")


def v1(ch: Channel) -> None:
    """A version 1 controller: a channel, but no hello and no task line."""
    ch.status(text=f"v1 progress, protocol {ch.protocol}")
    payload = ch.ask("Name?", {"type": "object"})
    ch.send_text(f"hello {payload['name']}\n")
    ch.complete("done")


def threads(ch: Channel) -> None:
    """Writers on several threads: every line stays whole."""

    def write(n: int) -> None:
        for i in range(100):
            ch.send_text(f"thread {n} line {i} " + "é" * (i * 37), f"t{n}", append=i > 0)

    workers = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    ch.complete()


def offline_fail(ch: Channel) -> None:
    ch.fail("it went wrong")


TIMEOUT = 20.0
SCENARIOS = {
    "states": states,
    "parts": parts,
    "files": files,
    "received": received,
    "reply": reply,
    "ask": ask,
    "ask-invalid": ask_invalid,
    "events": events,
    "cancel": cancel,
    "ask-canceled": ask_canceled,
    "raises": raises,
    "offline": offline,
    "offline-fail": offline_fail,
    "v1": v1,
    "threads": threads,
}


def main(ch: Channel) -> None:
    scenario = ch.task.text().split("\n")[0].strip()
    SCENARIOS[scenario](ch)


def on_cancel(reason: str) -> None:
    sys.stderr.write(f"on_cancel({reason!r}) at {time.monotonic():.0f}\n")


if __name__ == "__main__":
    agent.run(main, name="helper-agent", version="1.0", on_cancel=on_cancel)
