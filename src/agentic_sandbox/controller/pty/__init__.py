"""PTY attach over WebSocket: the pty-ws/v1 binding with pty-extensions/v1.

``/agents/{instance_id}/sessions/{session_id}/attach`` (:mod:`.route`: the upgrade and its checks,
served on ASGI by the app's WebSocket connection class, :mod:`.asgisocket`; :mod:`.attach`: the
socket, the owner of its pumps and of its parts: :mod:`.dispatch` the client frames,
:mod:`.membership` roles and joins, :mod:`.heartbeat` pings and the idle close, :mod:`.writes`
input posted to hostd, :mod:`.feed` replay then live output), who may do what (:mod:`.scopes`),
the frames (:mod:`.frames`), what a socket has yet to send (:mod:`.lanes`), who is attached to a
session (:mod:`.rooms`) and its screen for keyframes (:mod:`.screen`), starting a pending session
(:mod:`.launch`), the legacy v1 socket (:mod:`.legacy`). Sessions themselves are hostd's; they are
made through the admin surface.

:mod:`.surface` is what the app registers (the blueprint of :mod:`.blueprint` with the legacy
socket's route); this init imports nothing, so the services beside it (rooms, screen, lanes) do
not pull the web framework in.
"""
