"""An MCP server built with fastmcp in its default configuration (streamable HTTP at /mcp, with
sessions), for tests/it/sdk_js.rs.

Usage: fastmcp_agent.py NAME. Binds 127.0.0.1:0 and prints {"port": N} on stdout. Its tools name
the server: whoami() -> "NAME session S call N"; subtract(a, b) -> "NAME a-b=…".
"""

import asyncio
import json
import socket
import sys

import uvicorn
from fastmcp import Context, FastMCP


def main() -> None:
    name = sys.argv[1]
    mcp = FastMCP(name)
    calls: dict[str, int] = {}

    @mcp.tool
    def whoami(ctx: Context) -> str:
        """Names this server and counts the session's calls."""
        session = ctx.session_id or "-"
        calls[session] = calls.get(session, 0) + 1
        return f"{name} session {session} call {calls[session]}"

    @mcp.tool
    def subtract(a: float, b: float) -> str:
        """Subtracts b from a."""
        return f"{name} {a:g}-{b:g}={a - b:g}"

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    app = mcp.http_app(path="/mcp")
    print(json.dumps({"port": port}), flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
