"""An A2A agent built with the official a2a-sdk, for tests/it/sdk.rs.

Usage: a2a_agent.py NAME. Binds 127.0.0.1:0 and prints {"port": N} on stdout, then serves its
card at /.well-known/agent-card.json and JSON-RPC (A2A 1.0) at /. Every answer names the agent,
so the client can tell which one held a task. What the user's text asks for:
  "stream": a working task, three artifact chunks 0.3 s apart, then completed;
  "wait":   a working task that runs until it is cancelled (for follow-ups on a live task);
  anything else: completed at once with "NAME turn N: TEXT", N counting the turns of the context.
"""

import asyncio
import json
import socket
import sys

import uvicorn
from a2a.helpers import new_task, new_text_message, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import (
    InMemoryPushNotificationConfigStore,
    InMemoryTaskStore,
    TaskUpdater,
)
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    TaskState,
)
from starlette.applications import Starlette


class Executor(AgentExecutor):
    def __init__(self, name: str) -> None:
        self.name = name
        self.turns: dict[str, int] = {}

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = context.task_id, context.context_id
        if context.current_task is None:
            await event_queue.enqueue_event(
                new_task(task_id, context_id, TaskState.TASK_STATE_SUBMITTED)
            )
        updater = TaskUpdater(event_queue, task_id, context_id)
        say = lambda text: new_text_message(text, context_id=context_id, task_id=task_id)
        text = context.get_user_input()
        await updater.start_work(say(f"{self.name} working"))
        if text == "stream":
            for i in range(3):
                await updater.add_artifact([new_text_part(f"{self.name} chunk {i}")])
                await asyncio.sleep(0.3)
            await updater.complete(say(f"{self.name} streamed"))
        elif text == "wait":
            # Runs until CancelTask cancels this coroutine (bounded, so a lost test cannot leak it).
            await asyncio.sleep(60)
            await updater.complete(say(f"{self.name} waited"))
        else:
            turn = self.turns.get(context_id, 0) + 1
            self.turns[context_id] = turn
            await updater.complete(say(f"{self.name} turn {turn}: {text}"))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel(
            new_text_message(f"{self.name} canceled", context_id=context.context_id)
        )


def main() -> None:
    name = sys.argv[1]
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    card = AgentCard(
        name=name,
        description=f"a2a-sdk test agent {name}",
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=f"http://127.0.0.1:{port}/",
                protocol_binding="JSONRPC",
                protocol_version="1.0",
            )
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="chat", name="chat", description="echoes", tags=["echo"])],
    )
    handler = DefaultRequestHandler(
        agent_executor=Executor(name),
        task_store=InMemoryTaskStore(),
        agent_card=card,
        push_config_store=InMemoryPushNotificationConfigStore(),
    )
    app = Starlette(routes=create_agent_card_routes(card) + create_jsonrpc_routes(handler, "/"))
    # The socket listens already: connections wait in its backlog until uvicorn accepts them.
    print(json.dumps({"port": port}), flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
