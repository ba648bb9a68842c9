// The TypeScript MCP SDK's clients for tests/it/sdk_js.rs, in their default configuration: a
// `Client` on a `StreamableHTTPClientTransport` to a plain URL (the sidecar's path-prefix form).
//
// Usage: node mcp_clients.mjs URL N. N clients in turn connect, list the tools, call each (with
// arguments 6 and 7), count to 3 with progress when listed, and close. Prints one JSON line.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const [url, n] = process.argv.slice(2);
const found = { connected: 0, failures: [], clients: [] };

for (let i = 0; i < Number(n); i++) {
  const client = new Client({ name: `client-${i}`, version: '1.0.0' });
  const transport = new StreamableHTTPClientTransport(new URL(url));
  const one = { tools: [], calls: {} };
  try {
    await client.connect(transport);
    found.connected += 1;
    one.protocol = transport.protocolVersion ?? null;
    one.session = transport.sessionId ?? null;
    const { tools } = await client.listTools();
    one.tools = tools.map((t) => t.name).sort();
    for (const tool of one.tools) {
      if (tool === 'count') {
        const progress = [];
        const started = Date.now();
        const result = await client.callTool({ name: 'count', arguments: { n: 3 } }, undefined, {
          onprogress: (p) => progress.push({ at: Date.now() - started, progress: p.progress }),
        });
        one.calls.count = { text: result.content[0].text, progress, ended: Date.now() - started };
      } else {
        const result = await client.callTool({ name: tool, arguments: tool === 'whoami' ? {} : { a: 6, b: 7 } });
        one.calls[tool] = { text: result.content[0]?.text, isError: result.isError ?? false };
      }
    }
    await transport.terminateSession();
    await client.close();
  } catch (err) {
    found.failures.push({ client: i, error: String(err?.stack ?? err) });
  }
  found.clients.push(one);
}
console.log(JSON.stringify(found));
