"""Identifiers: UUIDv7 (RFC 9562) for instances, sessions and execs."""

from __future__ import annotations

import os
import re
import time
import uuid

UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def uuid7() -> uuid.UUID:
    """A time-ordered UUIDv7: 48-bit Unix milliseconds, version 7, variant 10, 74 random bits."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")  # 80 bits, 74 used
    rand_a = rand >> 68  # 12 bits
    rand_b = rand & ((1 << 62) - 1)  # 62 bits
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    return uuid.UUID(int=value)


def new_id() -> str:
    return str(uuid7())


def is_uuid(value: str) -> bool:
    # fullmatch: ``$`` alone would also match before a final newline.
    return UUID_RE.fullmatch(value) is not None
