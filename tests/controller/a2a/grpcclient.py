"""a2a-sdk's gRPC client set up as a user would: the bearer token through the SDK's AuthInterceptor
(from the card's security scheme), extensions through ``a2a-extensions`` service parameters, and
plaintext grpc.aio channels to the card's GRPC interface."""

from __future__ import annotations

from typing import Any

import grpc
import httpx
from a2a.client import ClientCallContext, ClientConfig
from a2a.client.auth import AuthInterceptor, CredentialService
from a2a.client.interceptors import AfterArgs, BeforeArgs, ClientCallInterceptor
from a2a.client.service_parameters import ServiceParametersFactory, with_a2a_extensions


class Token(CredentialService):
    """The one token, for whatever scheme the card names."""

    def __init__(self, token: str) -> None:
        self.token = token

    async def get_credentials(self, security_scheme_name: str, context: ClientCallContext | None) -> str | None:
        return self.token


class Activate(ClientCallInterceptor):
    """Activates extensions on every call."""

    def __init__(self, *uris: str) -> None:
        self.uris = list(uris)

    async def before(self, args: BeforeArgs) -> None:
        context = args.context or ClientCallContext()
        context.service_parameters = ServiceParametersFactory.create_from(
            context.service_parameters, [with_a2a_extensions(self.uris)]
        )
        args.context = context

    async def after(self, args: AfterArgs) -> None:
        return None


def grpc_config(http: httpx.AsyncClient, *, streaming: bool) -> ClientConfig:
    """A client config that picks the card's GRPC interface (``http`` fetches the card)."""
    return ClientConfig(
        httpx_client=http,
        streaming=streaming,
        supported_protocol_bindings=["GRPC"],
        grpc_channel_factory=grpc.aio.insecure_channel,
    )


def interceptors(token: str, *extensions: str) -> list[Any]:
    out: list[Any] = [AuthInterceptor(Token(token))]
    if extensions:
        out.append(Activate(*extensions))
    return out
