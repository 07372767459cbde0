"""``/console/`` over real HTTP: the page with its per-response nonce and strict policy, the built
files by exact name with caching headers, and clear answers for everything else."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from agentic_sandbox.controller.console.assets import ConsoleAssets

from ..conftest import LiveController

REQUIRED_POLICY = {
    "default-src": ["'none'"],
    "script-src": ["'self'"],
    "connect-src": ["'self'"],
    "img-src": ["'self'"],
    "font-src": ["'self'"],
    "base-uri": ["'none'"],
    "form-action": ["'none'"],
    "frame-ancestors": ["'none'"],
    "require-trusted-types-for": ["'script'"],
    "trusted-types": ["'none'"],
    "style-src-attr": ["'unsafe-inline'"],
}


def _policy(response: httpx.Response) -> dict[str, list[str]]:
    directives = [part.split() for part in response.headers["Content-Security-Policy"].split(";")]
    return {words[0]: words[1:] for words in directives if words}


def _security_headers(response: httpx.Response) -> None:
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Referrer-Policy"] == "no-referrer"
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Cross-Origin-Opener-Policy"] == "same-origin"
    policy = _policy(response)
    for directive, sources in REQUIRED_POLICY.items():
        assert policy[directive] == sources, (directive, policy)
    for directive in ("style-src", "style-src-elem"):
        assert policy[directive][0] == "'self'" and all(s.startswith("'nonce-") for s in policy[directive][1:])


async def test_the_page_carries_a_fresh_nonce_under_a_strict_policy(anon: httpx.AsyncClient) -> None:
    redirect = await anon.get("/console")
    assert redirect.status_code == 308 and redirect.headers["Location"] == "/console/"
    _security_headers(redirect)

    nonces = []
    for _ in range(2):
        page = await anon.get("/console/")  # a static page: no token needed, none rendered into it
        assert page.status_code == 200 and page.headers["Content-Type"] == "text/html; charset=utf-8"
        assert page.headers["Cache-Control"] == "no-store"
        _security_headers(page)
        policy = _policy(page)
        (nonce,) = re.findall(r'<script type="module" src="app.js" nonce="([^"]+)"></script>', page.text)
        assert policy["style-src-elem"] == ["'self'", f"'nonce-{nonce}'"] == policy["style-src"]
        assert "__CSP_NONCE__" not in page.text and "<script>" not in page.text  # no inline script
        nonces.append(nonce)
    assert nonces[0] != nonces[1] and len(nonces[0]) >= 24
    assert (await anon.head("/console/")).status_code == 200


async def test_built_files_by_exact_name_with_validators(anon: httpx.AsyncClient) -> None:
    for name, kind in (
        ("app.js", "text/javascript"),
        ("console.css", "text/css"),
        ("vendor/xterm.mjs", "text/javascript"),
        ("vendor/xterm.css", "text/css"),
        ("vendor/addon-fit.mjs", "text/javascript"),
        ("favicon.svg", "image/svg+xml"),
        ("vendor/xterm.LICENSE.txt", "text/plain"),
    ):
        response = await anon.get(f"/console/{name}")
        assert response.status_code == 200, name
        assert response.headers["Content-Type"].startswith(kind), (name, response.headers["Content-Type"])
        assert response.headers["Cache-Control"] == "no-cache"
        _security_headers(response)
        again = await anon.get(f"/console/{name}", headers={"If-None-Match": response.headers["ETag"]})
        assert again.status_code == 304 and again.content == b""


async def test_anything_else_is_a_plain_answer(controller: LiveController, anon: httpx.AsyncClient) -> None:
    for path in (
        "/console/index.html",  # only with its nonce, at /console/
        "/console/manifest.json",
        "/console/nope.js",
        "/console/vendor/",
        "/console/%2e%2e/controller/app.py",
        "/console/..%2f..%2fREADME.md",
        "/console/vendor/..%2fapp.js",
    ):
        response = await anon.get(path)
        assert response.status_code == 404, (path, response.status_code)
        assert response.headers["Content-Type"].startswith("text/plain")
        _security_headers(response)
    refused = await anon.post("/console/", content=b"x")
    assert refused.status_code == 405
    _security_headers(refused)


async def test_an_unbuilt_console_says_how_to_build_it(
    controller: LiveController, anon: httpx.AsyncClient, tmp_path: Path
) -> None:
    controller.state.console = ConsoleAssets.load(tmp_path / "no-build")
    for path in ("/console/", "/console/app.js"):
        response = await anon.get(path)
        assert response.status_code == 503 and "make console" in response.text, response.text
        _security_headers(response)
    assert (await anon.get("/readyz")).status_code == 200  # the APIs do not depend on it
