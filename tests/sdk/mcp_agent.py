"""An MCP server built with the official mcp SDK (streamable HTTP at /mcp), for tests/it/sdk.rs.

Usage: mcp_agent.py NAME [TOOL ...]. Binds 127.0.0.1:0 and prints {"port": N} on stdout. It has
the TOOLs named (whoami and count when none is), and they name the agent, so the client can tell
which one answered:
  whoami()  -> "NAME session S call N": N counts the calls made in the Mcp-Session-Id S
               (S is "-" for the stateless 2026 revision);
  count(n)  -> reports progress n times, 0.2 s apart (a streamed answer), then "NAME counted n";
  search(q), fetch(q), summarize(q) -> "NAME TOOL": tools a fleet's servers share in part.
"""

import asyncio
import json
import socket
import sys

import uvicorn
from mcp.server import MCPServer
from mcp.server.mcpserver import Context


def main() -> None:
    name = sys.argv[1]
    wanted = set(sys.argv[2:]) or {"whoami", "count"}
    server = MCPServer(name)
    calls: dict[str, int] = {}

    def session_of(ctx: Context) -> str:
        request = ctx.request_context.request
        headers = getattr(request, "headers", None)
        return (headers.get("mcp-session-id") if headers else None) or "-"

    async def whoami(ctx: Context) -> str:
        """Names this agent and counts the calls of the session."""
        session = session_of(ctx)
        calls[session] = calls.get(session, 0) + 1
        return f"{name} session {session} call {calls[session]}"

    async def count(n: int, ctx: Context) -> str:
        """Counts to n, reporting progress at each step."""
        for i in range(n):
            await ctx.report_progress(i + 1, n, f"{name} step {i + 1}")
            await asyncio.sleep(0.2)
        return f"{name} counted {n}"

    def named(tool: str):
        async def answer(q: str) -> str:
            return f"{name} {tool}"

        answer.__name__ = tool
        answer.__doc__ = f"Answers with this agent's name and {tool}."
        return answer

    tools = {"whoami": whoami, "count": count}
    tools.update({t: named(t) for t in ("search", "fetch", "summarize")})
    for tool in sorted(wanted):
        server.tool()(tools[tool])

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    app = server.streamable_http_app(streamable_http_path="/mcp")
    # The socket listens already: connections wait in its backlog until uvicorn accepts them.
    print(json.dumps({"port": port}), flush=True)
    uvicorn_server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    asyncio.run(uvicorn_server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
