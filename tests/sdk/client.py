"""The SDK clients' side of tests/it/sdk.rs: a2a-sdk and mcp clients through the caller's sidecar.

Usage: client.py OUTBOUND_PORT A2A_CAPABILITY MCP_CAPABILITY. A2A goes the HTTP_PROXY way (the
card is discovered at http://<capability>.reach/ through the outbound port as a proxy); MCP goes
to http://127.0.0.1:<port>/mcp with a `reach-capability` header. The script records what it
saw rather than asserting, so the Rust test can assert with the whole picture in its message:

  1. A2A card, send, multi-turn, stream, a live task's follow-ups; MCP over both revisions.
  2. Prints {"phase": "kill", "a2a_holder": .., "mcp_holder": ..} and waits for a line on stdin
     (the test kills both holders).
  3. A2A follow-ups of the lost task; the open MCP session's next call, a new session after it.
  4. Prints {"phase": "done", "findings": {...}} and exits 0.

An unexpected exception exits non-zero with its traceback on stderr.
"""

import asyncio
import json
import sys
import time
import uuid

import httpx
import httpx2
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers import get_artifact_text, get_message_text, new_text_message
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTasksRequest,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import A2AError
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

START = time.monotonic()


def now() -> float:
    return round(time.monotonic() - START, 3)


class Seen:
    """The sidecar's answer heads, from the HTTP clients' response hooks."""

    def __init__(self) -> None:
        self.heads: list[dict] = []

    async def hook(self, response) -> None:
        head = {
            "method": response.request.method,
            "status": response.status_code,
            "agent": response.headers.get("reach-agent"),
            "reason": response.headers.get("reach-reason"),
        }
        # The sidecar's own answers are small JSON: keep the wire body (read once, the SDK then
        # reads it from the cache), so the test sees the JSON-RPC error the SDK turned into an
        # exception.
        if head["reason"] == "affinity_lost":
            await response.aread()
            head["body"] = response.text
        self.heads.append(head)

    def mark(self) -> int:
        return len(self.heads)

    def since(self, mark: int) -> list[dict]:
        return self.heads[mark:]

    def agent(self, mark: int) -> str | None:
        """The agent that answered the one call made since `mark`."""
        heads = [h for h in self.since(mark) if h["method"] != "DELETE"]
        agents = {h["agent"] for h in heads}
        return agents.pop() if len(agents) == 1 else f"mixed: {heads}"


def error_of(err: Exception, seen: Seen, mark: int) -> dict:
    return {
        "type": type(err).__name__,
        "code": getattr(err, "code", None),
        "message": str(getattr(err, "message", err)),
        "data": getattr(err, "data", None),
        "heads": seen.since(mark),
    }


def user_message(text: str, context_id: str | None = None, task_id: str | None = None):
    message = new_text_message(text, context_id=context_id, task_id=task_id, role=Role.ROLE_USER)
    message.message_id = str(uuid.uuid4())
    return SendMessageRequest(message=message)


def status_text(task) -> str:
    return get_message_text(task.status.message)


# === A2A ===


async def a2a_first(http: httpx.AsyncClient, seen: Seen, capability: str) -> tuple[dict, dict]:
    base = f"http://{capability}.reach/"
    mark = seen.mark()
    card = await A2ACardResolver(http, base).get_agent_card()
    found: dict = {
        "card": {
            "name": card.name,
            "urls": [i.url for i in card.supported_interfaces],
            "agent": seen.agent(mark),
        }
    }
    plain = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
    streaming = ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create(card)
    polling = ClientFactory(ClientConfig(httpx_client=http, streaming=False, polling=True)).create(
        card
    )

    async def send(client, request) -> tuple[object, str | None]:
        mark = seen.mark()
        events = [event async for event in client.send_message(request)]
        return events[-1].task, seen.agent(mark)

    # A send, then two more turns in its context: each a new task on the same agent.
    task, agent = await send(plain, user_message("hello"))
    found["send"] = {
        "text": status_text(task),
        "agent": agent,
        "state": TaskState.Name(task.status.state),
    }
    turns = []
    for turn in ("again", "and again"):
        next_task, agent = await send(plain, user_message(turn, context_id=task.context_id))
        turns.append(
            {
                "text": status_text(next_task),
                "agent": agent,
                "context": next_task.context_id == task.context_id,
            }
        )
    found["turns"] = turns
    lost = {"task": task.id, "context": task.context_id, "holder": found["send"]["agent"]}

    # A stream: when each event arrived, against when the stream ended.
    mark = seen.mark()
    events = []
    async for event in streaming.send_message(user_message("stream")):
        kind = event.WhichOneof("payload")
        text = ""
        if kind == "artifact_update":
            text = get_artifact_text(event.artifact_update.artifact)
        events.append({"at": now(), "kind": kind, "text": text})
    found["stream"] = {"events": events, "ended": now(), "agent": seen.agent(mark)}

    # A live task and every follow-up on it.
    live, holder = await send(polling, user_message("wait"))
    follow: dict = {"holder": holder, "state": TaskState.Name(live.status.state), "calls": {}}

    async def call(name: str, make):
        mark = seen.mark()
        try:
            result = await make()
            follow["calls"].setdefault(name, []).append({"agent": seen.agent(mark), "ok": result})
        except A2AError as err:
            follow["calls"].setdefault(name, []).append(
                {"agent": seen.agent(mark), "error": error_of(err, seen, mark)}
            )

    for _ in range(3):
        await call("GetTask", lambda: _get(plain, live.id))
        await call("ListTasks", lambda: _list(plain, live.context_id, live.id))

    async def subscribe():
        async for event in streaming.subscribe(SubscribeToTaskRequest(id=live.id)):
            return event.WhichOneof("payload")
        return None

    for _ in range(3):
        await call("SubscribeToTask", subscribe)
    config = TaskPushNotificationConfig(
        task_id=live.id, id="hook-1", url="http://127.0.0.1:9/push", token="t"
    )
    for _ in range(2):
        await call(
            "CreateTaskPushNotificationConfig",
            lambda: _ok(plain.create_task_push_notification_config(config), lambda c: c.id),
        )
        await call(
            "GetTaskPushNotificationConfig",
            lambda: _ok(
                plain.get_task_push_notification_config(
                    GetTaskPushNotificationConfigRequest(task_id=live.id, id="hook-1")
                ),
                lambda c: c.url,
            ),
        )
        await call(
            "ListTaskPushNotificationConfigs",
            lambda: _ok(
                plain.list_task_push_notification_configs(
                    ListTaskPushNotificationConfigsRequest(task_id=live.id)
                ),
                lambda r: len(r.configs),
            ),
        )
    await call(
        "DeleteTaskPushNotificationConfig",
        lambda: _ok(
            plain.delete_task_push_notification_config(
                DeleteTaskPushNotificationConfigRequest(task_id=live.id, id="hook-1")
            ),
            lambda _: "deleted",
        ),
    )
    await call(
        "CancelTask",
        lambda: _ok(
            plain.cancel_task(CancelTaskRequest(id=live.id)),
            lambda t: TaskState.Name(t.status.state),
        ),
    )
    found["follow"] = follow
    return found, lost


async def _ok(awaitable, pick):
    return pick(await awaitable)


async def _get(client, task_id: str):
    task = await client.get_task(GetTaskRequest(id=task_id))
    return {
        "id": task.id == task_id,
        "state": TaskState.Name(task.status.state),
        "text": status_text(task),
    }


async def _list(client, context_id: str, task_id: str):
    listed = await client.list_tasks(ListTasksRequest(context_id=context_id))
    return {"found": any(t.id == task_id for t in listed.tasks)}


async def a2a_after_kill(http: httpx.AsyncClient, seen: Seen, capability: str, lost: dict) -> dict:
    card = await A2ACardResolver(http, f"http://{capability}.reach/").get_agent_card()
    plain = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)
    found: dict = {}
    mark = seen.mark()
    try:
        task = await plain.get_task(GetTaskRequest(id=lost["task"]))
        found["GetTask"] = {"answered": status_text(task), "heads": seen.since(mark)}
    except A2AError as err:
        found["GetTask"] = error_of(err, seen, mark)
    mark = seen.mark()
    try:
        events = [
            e async for e in plain.send_message(user_message("more", context_id=lost["context"]))
        ]
        found["SendInContext"] = {
            "answered": status_text(events[-1].task),
            "heads": seen.since(mark),
        }
    except A2AError as err:
        found["SendInContext"] = error_of(err, seen, mark)
    # The lost context's task list: its holder is the only agent that knows the context.
    mark = seen.mark()
    try:
        listed = await _list(plain, lost["context"], lost["task"])
        found["ListTasks"] = {"answered": listed, "heads": seen.since(mark)}
    except A2AError as err:
        found["ListTasks"] = error_of(err, seen, mark)
    # A new conversation is not held back: it lands on a survivor.
    mark = seen.mark()
    events = [e async for e in plain.send_message(user_message("fresh"))]
    found["fresh"] = {"text": status_text(events[-1].task), "agent": seen.agent(mark)}
    return found


# === MCP ===


def mcp_client(url: str, seen: Seen, capability: str, mode: str) -> Client:
    http = httpx2.AsyncClient(
        headers={"reach-capability": capability},
        timeout=httpx2.Timeout(30, read=60),
        event_hooks={"response": [seen.hook]},
    )
    return Client(streamable_http_client(url, http_client=http), mode=mode)


async def mcp_round(client: Client, seen: Seen) -> dict:
    found: dict = {"protocol": client.protocol_version}
    mark = seen.mark()
    tools = await client.list_tools()
    found["tools"] = sorted(t.name for t in tools.tools)
    found["tools_agent"] = seen.agent(mark)
    calls = []
    for _ in range(3):
        mark = seen.mark()
        result = await client.call_tool("whoami", {})
        calls.append({"text": result.content[0].text, "agent": seen.agent(mark)})
    found["calls"] = calls
    progress = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append({"at": now(), "progress": value, "total": total, "message": message})

    mark = seen.mark()
    result = await client.call_tool("count", {"n": 3}, progress_callback=on_progress)
    found["count"] = {
        "text": result.content[0].text,
        "ended": now(),
        "progress": progress,
        "agent": seen.agent(mark),
    }
    return found


async def main() -> None:
    port, a2a_capability, mcp_capability = sys.argv[1], sys.argv[2], sys.argv[3]
    seen = Seen()
    findings: dict = {}
    http = httpx.AsyncClient(
        proxy=f"http://127.0.0.1:{port}", timeout=30, event_hooks={"response": [seen.hook]}
    )
    findings["a2a"], lost = await a2a_first(http, seen, a2a_capability)

    url = f"http://127.0.0.1:{port}/mcp"
    findings["mcp"] = {}
    modern = mcp_client(url, seen, mcp_capability, "2026-07-28")
    async with modern:
        findings["mcp"]["2026-07-28"] = await mcp_round(modern, seen)
    # The handshake revision's session stays open across the kill.
    legacy = mcp_client(url, seen, mcp_capability, "legacy")
    await legacy.__aenter__()
    findings["mcp"]["legacy"] = await mcp_round(legacy, seen)
    mcp_holder = findings["mcp"]["legacy"]["calls"][0]["agent"]

    print(
        json.dumps({"phase": "kill", "a2a_holder": lost["holder"], "mcp_holder": mcp_holder}),
        flush=True,
    )
    if not sys.stdin.readline():
        raise SystemExit("stdin closed before the holders were killed")

    findings["a2a_lost"] = await a2a_after_kill(http, seen, a2a_capability, lost)
    lost_mcp: dict = {}
    mark = seen.mark()
    try:
        result = await legacy.call_tool("whoami", {})
        lost_mcp["call"] = {"answered": result.content[0].text, "heads": seen.since(mark)}
    except MCPError as err:
        lost_mcp["call"] = error_of(err, seen, mark)
    mark = seen.mark()
    # Closing the lost session sends its DELETE.
    try:
        await legacy.__aexit__(None, None, None)
    except Exception as err:  # noqa: BLE001 (the SDK may raise on close: recorded, asserted)
        lost_mcp["close_error"] = repr(err)
    lost_mcp["close"] = seen.since(mark)
    # The application starts a new session, as the SDK's error tells it to: on a survivor.
    again = mcp_client(url, seen, mcp_capability, "legacy")
    async with again:
        lost_mcp["again"] = await mcp_round(again, seen)
    modern = mcp_client(url, seen, mcp_capability, "2026-07-28")
    async with modern:
        lost_mcp["modern"] = await mcp_round(modern, seen)
    findings["mcp_lost"] = lost_mcp
    await http.aclose()
    print(json.dumps({"phase": "done", "findings": findings}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
