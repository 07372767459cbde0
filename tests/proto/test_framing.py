"""Frame codec: round trips, limits, and a decoder that never crashes on hostile bytes."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_sandbox.proto import FrameBuffer, FrameEncoder, FrameInvalid, FrameTooLarge, UnknownFrame
from agentic_sandbox.proto import messages as m

CLIENT = msgspec.msgpack.Decoder(m.ClientFrame)
SERVER = msgspec.msgpack.Decoder(m.ServerFrame)


def test_round_trip_many_frames_in_one_feed() -> None:
    enc = FrameEncoder()
    frames = [
        m.PingRequest(id=1, payload=b"x"),
        m.SessionWriteRequest(id=2, session_id="s1", data=b"\x00\xff" * 100),
        m.SessionCreateRequest(id=3, instance_id="i", argv=["sh", "-c", "true"], env={"A": "b"}),
    ]
    buf = FrameBuffer()
    buf.feed(b"".join(enc.encode(f) for f in frames))
    out = []
    while (frame := buf.next_message(CLIENT)) is not None:
        out.append(frame)
    assert out == frames
    assert buf.pending_bytes == 0


@given(st.binary(min_size=0, max_size=300_000), st.integers(min_value=1, max_value=5000))
@settings(max_examples=50, deadline=None)
def test_any_split_of_the_byte_stream_gives_the_same_frames(payload: bytes, chunk: int) -> None:
    enc = FrameEncoder()
    frames = [m.SessionOutput(id=7, seq=i, data=payload[i:]) for i in range(3)]
    wire = b"".join(bytes(enc.encode(f)) for f in frames)
    buf = FrameBuffer()
    out = []
    for start in range(0, len(wire), chunk):
        buf.feed(wire[start : start + chunk])
        while (frame := buf.next_message(SERVER)) is not None:
            out.append(frame)
    assert out == frames


def test_oversized_declared_length_is_refused_before_buffering() -> None:
    buf = FrameBuffer(max_frame_bytes=1024)
    with pytest.raises(FrameTooLarge):
        buf.feed((1025).to_bytes(4, "big") + b"x")


def test_encoder_refuses_oversized_frame() -> None:
    enc = FrameEncoder(max_frame_bytes=100)
    with pytest.raises(FrameTooLarge):
        enc.encode(m.PingRequest(payload=b"x" * 200))


def test_invalid_field_names_the_frame_id() -> None:
    buf = FrameBuffer()
    buf.feed(FrameEncoder().encode(m.SessionResizeRequest(id=42, session_id="s", cols=5000, rows=10)))
    with pytest.raises(FrameInvalid) as info:
        buf.next_message(CLIENT)
    assert info.value.frame_id == 42
    assert "cols" in info.value.reason


def test_unknown_tag_is_not_a_validation_error() -> None:
    buf = FrameBuffer()
    buf.feed(FrameEncoder().encode({"t": "LaunchMissiles", "id": 1}))
    with pytest.raises(UnknownFrame):
        buf.next_message(CLIENT)


def test_unknown_fields_are_tolerated_for_evolution() -> None:
    buf = FrameBuffer()
    buf.feed(FrameEncoder().encode({"t": "PingRequest", "id": 5, "added_in_v2": [1, 2]}))
    assert buf.next_message(CLIENT) == m.PingRequest(id=5)


@given(st.binary(max_size=2048))
@settings(max_examples=500, deadline=None)
def test_decoder_never_crashes_on_garbage(garbage: bytes) -> None:
    """Any bytes either decode, wait for more, or raise one of the documented errors."""
    buf = FrameBuffer(max_frame_bytes=4096)
    try:
        buf.feed(garbage)
        while buf.next_message(CLIENT) is not None:
            pass
    except (FrameTooLarge, FrameInvalid, UnknownFrame, msgspec.DecodeError):
        pass


@given(st.binary(min_size=1, max_size=512))
@settings(max_examples=300, deadline=None)
def test_decoder_never_crashes_on_framed_garbage(body: bytes) -> None:
    buf = FrameBuffer()
    try:
        buf.feed(len(body).to_bytes(4, "big") + body)
        buf.next_message(CLIENT)
    except (FrameInvalid, UnknownFrame, msgspec.DecodeError):
        pass


def test_every_request_has_a_response_type() -> None:
    """The client checks reply types by name; every request type must have its pair."""
    for cls in m.ClientFrame.__args__:
        if cls in (m.StreamCancel, *m.STREAM_REQUESTS):
            continue
        name = cls.__name__.removesuffix("Request") + "Response"
        assert hasattr(m, name), name
        assert getattr(m, name) in m.ServerFrame.__args__
