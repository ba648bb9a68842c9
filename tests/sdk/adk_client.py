"""google-adk's RemoteA2aAgent, in its default configuration, built from an agent card URL as the
sidecar serves it (the path-prefix form on the loopback listener: google-adk takes a card only
over https or from a loopback host), for tests/it/sdk_js.rs.

Usage: adk_client.py CARD_URL. Runs two turns through an InMemoryRunner (no model: the remote
agent answers) and prints one JSON line with each turn's text, or the error.
"""

import asyncio
import json
import sys

from google.adk.agents.remote_a2a_agent import RemoteA2aAgent
from google.adk.runners import InMemoryRunner
from google.genai import types


async def turn(runner: InMemoryRunner, session_id: str, text: str) -> str:
    message = types.Content(role="user", parts=[types.Part(text=text)])
    said = []
    async for event in runner.run_async(user_id="u", session_id=session_id, new_message=message):
        for part in (event.content.parts if event.content else None) or []:
            if part.text:
                said.append(part.text)
    return " ".join(said)


async def main() -> None:
    card_url = sys.argv[1]
    found: dict = {}
    try:
        agent = RemoteA2aAgent(name="remote", agent_card=card_url)
        runner = InMemoryRunner(agent=agent, app_name="sdk")
        session = await runner.session_service.create_session(app_name="sdk", user_id="u")
        found["first"] = await turn(runner, session.id, "hello")
        found["second"] = await turn(runner, session.id, "again")
    except Exception as err:  # noqa: BLE001 (reported to the test, which shows it)
        found["error"] = f"{type(err).__name__}: {err}"
    print(json.dumps(found), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
