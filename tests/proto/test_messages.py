"""The hostd API's Structs, checked over every one of them (found by walking the module, never
listed by hand): each frame class is in exactly one union, on the side that sends it, under a tag of
its own; every request, response and event round-trips through the frame codec with every field
set and with only the required ones; a field this version does not know is ignored (a newer peer
may add one); a frame without a required field is refused as invalid, naming its id."""

from __future__ import annotations

import re
import typing
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest

from agentic_sandbox.proto import FrameBuffer, FrameEncoder, FrameInvalid
from agentic_sandbox.proto import messages as m

CLIENT_MEMBERS: tuple[type[m.Frame], ...] = typing.get_args(m.ClientFrame)
SERVER_MEMBERS: tuple[type[m.Frame], ...] = typing.get_args(m.ServerFrame)
DECODERS = {"client": msgspec.msgpack.Decoder(m.ClientFrame), "server": msgspec.msgpack.Decoder(m.ServerFrame)}


def _subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found += _subclasses(sub)
    return found


#: Every concrete frame: a subclass of Request, Response or Event defined in messages.
FRAMES = sorted(
    (c for c in _subclasses(m.Frame) if c not in (m.Request, m.Response, m.Event) and c.__module__ == m.__name__),
    key=lambda c: c.__name__,
)
#: Every Struct of the module, frames and the shapes inside them.
STRUCTS = sorted(
    (
        v
        for v in vars(m).values()
        if isinstance(v, type) and issubclass(v, msgspec.Struct) and v.__module__ == m.__name__
    ),
    key=lambda c: c.__name__,
)


def _side(cls: type[m.Frame]) -> str:
    return "client" if cls in CLIENT_MEMBERS else "server"


# -- values that fit each field's type and constraints --------------------------------------------


def _sample(t: mi.Type, *, full: bool) -> Any:
    if isinstance(t, mi.Metadata):
        return _sample(t.type, full=full)
    if isinstance(t, mi.UnionType):
        members = [x for x in t.types if not isinstance(x, mi.NoneType)]
        return _sample(members[0], full=full) if full or len(members) == len(t.types) else None
    if isinstance(t, mi.LiteralType):
        return t.values[-1]
    if isinstance(t, mi.EnumType):
        return next(iter(t.cls))
    if isinstance(t, mi.BoolType):
        return True
    if isinstance(t, mi.IntType):
        low = t.ge if t.ge is not None else (t.gt + 1 if t.gt is not None else 3)
        return min(low, t.le) if t.le is not None else low
    if isinstance(t, mi.FloatType):
        low = t.ge if t.ge is not None else 1.5
        return min(float(low), t.le) if t.le is not None else float(low)
    if isinstance(t, mi.StrType):
        text = "a1-x"
        if t.min_length:
            text = text + "b" * max(0, t.min_length - len(text))
        if t.pattern is not None:
            assert re.search(t.pattern, text), (t.pattern, text)
        return text[: t.max_length] if t.max_length else text
    if isinstance(t, mi.BytesType):
        return b"\x00\xff" + b"z" * max(0, (t.min_length or 0) - 2)
    if isinstance(t, mi.ListType | mi.SetType | mi.FrozenSetType | mi.VarTupleType):
        count = max(1 if full else 0, t.min_length or 0)
        items = [_sample(t.item_type, full=full) for _ in range(count)]
        return tuple(items) if isinstance(t, mi.VarTupleType) else items
    if isinstance(t, mi.TupleType):
        return tuple(_sample(x, full=full) for x in t.item_types)
    if isinstance(t, mi.DictType):
        if not full and not t.min_length:
            return {}
        return {_sample(t.key_type, full=full): _sample(t.value_type, full=full)}
    if isinstance(t, mi.StructType):
        return _build(t, full=full)
    if isinstance(t, mi.AnyType) or (isinstance(t, mi.CustomType) and t.cls is object):
        return {"any": [1, "two"]}
    raise AssertionError(f"no sample for {t!r}: teach _sample this kind of type")


def _build(t: mi.StructType, *, full: bool) -> Any:
    kwargs = {f.name: _sample(f.type, full=full) for f in t.fields if full or f.required}
    return t.cls(**kwargs)


def sample(cls: type, *, full: bool) -> Any:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return _build(info, full=full)


def _through_the_codec(frame: m.Frame, side: str, extra: dict[str, Any] | None = None) -> Any:
    if extra is None:
        wire = FrameEncoder().encode(frame)
    else:
        body = msgspec.msgpack.encode({**msgspec.to_builtins(frame, builtin_types=(bytes,)), **extra})
        wire = bytearray(len(body).to_bytes(4, "big") + body)
    buf = FrameBuffer()
    buf.feed(bytes(wire))
    out = buf.next_message(DECODERS[side])
    assert buf.pending_bytes == 0
    return out


# -- the unions -----------------------------------------------------------------------------------


def test_the_walk_finds_the_api() -> None:
    assert len(FRAMES) > 80 and m.HelloRequest in FRAMES and m.ExecExited in FRAMES
    assert m.InstanceInfo in STRUCTS and m.InstanceInfo not in FRAMES


def test_every_frame_is_in_exactly_one_union_on_the_side_that_sends_it() -> None:
    assert set(CLIENT_MEMBERS) | set(SERVER_MEMBERS) == set(FRAMES)
    assert not set(CLIENT_MEMBERS) & set(SERVER_MEMBERS)
    assert len(CLIENT_MEMBERS) == len(set(CLIENT_MEMBERS)) and len(SERVER_MEMBERS) == len(set(SERVER_MEMBERS))
    assert all(issubclass(c, m.Request) for c in CLIENT_MEMBERS)
    assert all(issubclass(c, m.Response | m.Event) for c in SERVER_MEMBERS)
    assert set(m.STREAM_REQUESTS) <= set(CLIENT_MEMBERS)


def test_tags_are_the_class_names_and_never_mean_two_things() -> None:
    tags = [mi.type_info(c).tag for c in FRAMES]  # type: ignore[attr-defined]
    assert tags == [c.__name__ for c in FRAMES]
    assert len(set(tags)) == len(tags)
    assert all(mi.type_info(c).tag_field == "t" for c in FRAMES)  # type: ignore[attr-defined]


def test_requests_and_responses_pair_up_by_name() -> None:
    """``FooRequest`` is answered by ``FooResponse`` (a subscription by StreamOpened and events)."""
    names = {c.__name__ for c in FRAMES}
    for cls in CLIENT_MEMBERS:
        if cls.__name__.endswith("Request") and cls not in m.STREAM_REQUESTS:
            assert cls.__name__.removesuffix("Request") + "Response" in names, cls


# -- every frame through the codec ----------------------------------------------------------------


@pytest.mark.parametrize("full", [True, False], ids=["every-field", "required-only"])
@pytest.mark.parametrize("cls", FRAMES, ids=lambda c: c.__name__)
def test_round_trips_through_the_frame_codec(cls: type[m.Frame], full: bool) -> None:
    frame = sample(cls, full=full)
    frame.id = 41
    out = _through_the_codec(frame, _side(cls))
    assert type(out) is cls and out == frame


@pytest.mark.parametrize("cls", FRAMES, ids=lambda c: c.__name__)
def test_a_field_this_version_does_not_know_is_ignored(cls: type[m.Frame]) -> None:
    frame = sample(cls, full=True)
    frame.id = 7
    assert _through_the_codec(frame, _side(cls), extra={"added_in_a_later_version": {"x": [1, 2]}}) == frame


@pytest.mark.parametrize(
    "cls",
    [c for c in FRAMES if any(f.required for f in mi.type_info(c).fields)],
    ids=lambda c: c.__name__,  # type: ignore[attr-defined]
)
def test_a_frame_without_a_required_field_is_invalid_and_names_its_id(cls: type[m.Frame]) -> None:
    frame = sample(cls, full=True)
    frame.id = 9
    body = msgspec.to_builtins(frame, builtin_types=(bytes,))
    missing = next(f for f in mi.type_info(cls).fields if f.required)  # type: ignore[attr-defined]
    del body[missing.encode_name]
    raw = msgspec.msgpack.encode(body)
    buf = FrameBuffer()
    buf.feed(len(raw).to_bytes(4, "big") + raw)
    with pytest.raises(FrameInvalid) as caught:
        buf.next_message(DECODERS[_side(cls)])
    assert caught.value.frame_id == 9 and missing.encode_name in caught.value.reason


@pytest.mark.parametrize("cls", STRUCTS, ids=lambda c: c.__name__)
def test_every_struct_round_trips_alone(cls: type[msgspec.Struct]) -> None:
    """The shapes inside frames too (InstanceInfo, SessionInfo ...), in msgpack and in JSON (the
    CLIs print them as JSON)."""
    value = sample(cls, full=True)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(value), type=cls) == value
    assert msgspec.json.decode(msgspec.json.encode(value), type=cls) == value
