"""What the controller tells its followers: the event bus (``bus``) and the log ring (``logs``), both
kept in a bounded ring (``ring``) that SSE followers read from a position; on a store shared by
several controllers the bus's ring is filled from the store (``journal``).
"""
