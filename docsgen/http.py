"""The HTTP API's reference, read from the app ``toolq serve`` runs: every operation of its
OpenAPI document with its parameters, body and answers, every schema with its fields, and the
routes the document leaves out (the document itself, ``/mcp``, the viewer's pages)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from fastapi import FastAPI
from starlette.routing import BaseRoute, Mount, Route

from docsgen.tables import cell, prose, table

METHODS = ("get", "post", "put", "patch", "delete")
#: What the routes outside the document are, by path prefix (the first that matches).
OUTSIDE_THE_SCHEMA = (
    ("/openapi.json", "This document, with the tool names the fleet accepts when it is asked."),
    ("/mcp", "The fleet's tools over MCP (Streamable HTTP), a run per session."),
    ("/ui/live/", "The viewer's live stream of a page, opened with a signed ticket."),
    ("/ui/page/", "A viewer page's content, fetched with the token."),
    ("/ui/static", "The viewer's script and style sheet."),
    ("/", "A page of the web viewer (its content is fetched with the token)."),
)


def build_app() -> FastAPI:
    """The app as ``toolq serve`` builds it, pointed at a broker it never reaches: building it
    connects to nothing, and its document does not depend on the fleet."""
    from api.http.app import create_app
    from api.settings import OrchestratorSettings

    quiet = logging.getLogger("api.http.app")
    with _at_level(quiet, logging.ERROR):  # its warning that no model API is configured
        return create_app(OrchestratorSettings(broker_url="redis://127.0.0.1:1/0"))


def operations(document: dict[str, Any]) -> list[tuple[str, str]]:
    """(METHOD, path) of every operation of the document, in its order."""
    return [
        (method.upper(), path)
        for path, item in document["paths"].items()
        for method in METHODS
        if method in item
    ]


def routes(app: FastAPI) -> list[tuple[str, str]]:
    """(METHOD, path) of every route the app serves, in the document or not (a mount as
    ``*``)."""
    found: list[tuple[str, str]] = []
    for path, route in _walk(app.router.routes, ""):
        if isinstance(route, Mount):
            found.append(("*", path))
            continue
        methods = sorted((getattr(route, "methods", None) or {"*"}) - {"HEAD"})
        found += [(method, path) for method in methods]
    return found


def markdown(app: FastAPI) -> str:
    document = app.openapi()
    parts = ["## Operations", ""]
    for method, path in operations(document):
        parts += _operation(document, method, path)
    inside = set(operations(document))
    outside = [(m, p) for m, p in routes(app) if (m, p) not in inside]
    parts += ["## Routes outside the document", ""]
    rows = [(f"`{m} {p}`", cell(_outside(p))) for m, p in outside]
    parts += [table(("route", "what it is"), rows), "", "## Schemas", ""]
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        parts += _schema(name, schema)
    return "\n".join(parts)


def _operation(document: dict[str, Any], method: str, path: str) -> list[str]:
    op = document["paths"][path][method.lower()]
    secured = bool(op.get("security", document.get("security")))
    lines = [
        f"### `{method} {path}`",
        "",
        prose(op.get("description") or op.get("summary", "")),
        "",
    ]
    lines += ["Needs the bearer token." if secured else "Needs no token.", ""]
    params = op.get("parameters", [])
    if params:
        rows = [
            (
                f"`{p['name']}`",
                p["in"],
                "yes" if p.get("required") else "no",
                cell(_type(p.get("schema", {}))),
                cell(p.get("description", "")),
            )
            for p in params
        ]
        lines += [table(("parameter", "in", "required", "type", "meaning"), rows), ""]
    body = op.get("requestBody")
    if body:
        kinds = ", ".join(
            f"{media}: {_type(content.get('schema', {}))}"
            for media, content in body.get("content", {}).items()
        )
        lines += [f"Body: {prose(kinds)}.", ""]
    answers: list[tuple[str, str, str]] = []
    for status, answer in op.get("responses", {}).items():
        kinds = ", ".join(
            f"{media}: {_type(content.get('schema', {}))}" if content.get("schema") else media
            for media, content in answer.get("content", {}).items()
        )
        answers.append((f"`{status}`", cell(answer.get("description", "")), cell(kinds)))
    lines += [table(("status", "when", "body"), answers), ""]
    return lines


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name}", ""]
    if schema.get("description"):
        lines += [prose(schema["description"]), ""]
    props = schema.get("properties", {})
    if not props:
        lines += [f"Type: {prose(_type(schema))}.", ""]
        return lines
    required = set(schema.get("required", []))
    rows = [
        (
            f"`{field}`",
            cell(_type(spec)),
            "yes" if field in required else "no",
            cell(spec.get("description", "")),
        )
        for field, spec in props.items()
    ]
    return [*lines, table(("field", "type", "required", "meaning"), rows), ""]


def _type(schema: dict[str, Any]) -> str:
    """A schema in a few words: ``RunState``, ``string``, ``array of ToolInfo``, ``a or b``."""
    if "$ref" in schema:
        target = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{target}](#{target.lower()})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            # Each kind once: two choices may differ only in what the words leave out.
            return " or ".join(dict.fromkeys(_type(choice) for choice in schema[key]))
    if "enum" in schema:
        return "one of " + ", ".join(f"`{value}`" for value in schema["enum"])
    if "const" in schema:
        return f"`{schema['const']}`"
    kind = schema.get("type")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if kind == "object" and "additionalProperties" in schema:
        values = schema["additionalProperties"]
        return f"object of {_type(values)}" if isinstance(values, dict) else "object"
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "string" and "format" in schema:
        return f"{schema['format']} string"  # "date-time string": what the text must be
    return str(kind or "any")


def _outside(path: str) -> str:
    return next((what for prefix, what in OUTSIDE_THE_SCHEMA if path.startswith(prefix)), "")


def _walk(routes: Sequence[BaseRoute], prefix: str) -> Iterator[tuple[str, BaseRoute]]:
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            # FastAPI keeps an included router whole (not copied into the app's routes); its
            # routes are reached through it, under the prefix it was included with.
            context = getattr(route, "include_context", None)
            yield from _walk(included.routes, prefix + (getattr(context, "prefix", "") or ""))
        elif isinstance(route, Route | Mount):
            yield prefix + route.path, route


@contextlib.contextmanager
def _at_level(logger: logging.Logger, level: int) -> Iterator[None]:
    previous = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(previous)
