"""The Python mcp SDK's clients for tests/it/sdk_js.rs, in their default configuration: a
`Client` on `streamable_http_client(URL)` to a plain URL (the sidecar's path-prefix form).

Usage: mcp_clients.py URL N MODE. MODE is the SDK's revision mode ("legacy": the handshake
revision with sessions; "2026-07-28": stateless). N clients in turn connect, list the tools,
call each (arguments 6 and 7), and close. Prints one JSON line.
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.client.streamable_http import streamable_http_client


async def one(url: str, mode: str) -> dict:
    found: dict = {"calls": {}}
    async with Client(streamable_http_client(url), mode=mode) as client:
        found["protocol"] = client.protocol_version
        tools = await client.list_tools()
        found["tools"] = sorted(t.name for t in tools.tools)
        for tool in found["tools"]:
            args = {} if tool == "whoami" else {"n": 2} if tool == "count" else {"a": 6, "b": 7}
            result = await client.call_tool(tool, args)
            text = result.content[0].text if result.content else ""
            found["calls"][tool] = {"text": text, "isError": bool(result.is_error)}
    return found


def describe(err: BaseException) -> str:
    """The error, with the sub-exceptions of a group (anyio's task groups wrap them)."""
    if isinstance(err, BaseExceptionGroup):
        return "; ".join(describe(e) for e in err.exceptions)
    return f"{type(err).__name__}: {err}"


async def main() -> None:
    url, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    found: dict = {"connected": 0, "failures": [], "clients": []}
    for i in range(n):
        try:
            found["clients"].append(await one(url, mode))
            found["connected"] += 1
        except Exception as err:  # noqa: BLE001 (reported to the test, which shows it)
            found["failures"].append({"client": i, "error": describe(err)})
    print(json.dumps(found), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
