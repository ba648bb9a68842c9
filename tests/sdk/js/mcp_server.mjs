// An MCP server built with the official TypeScript SDK as its README builds one, for
// tests/it/sdk_js.rs: streamable HTTP at /mcp, with sessions (the SDK's default pattern: a
// transport per session, `sessionIdGenerator: randomUUID`) or stateless (a server per request).
//
// Usage: node mcp_server.mjs NAME stateful|stateless TOOL... Binds 127.0.0.1:0 and prints
// {"port": N} on stdout. Tools, each naming the server that ran it:
//   whoami()       -> "NAME session S call N" (S: "-" when stateless; N counts the session's calls)
//   add(a, b), multiply(a, b) -> "NAME a+b=…", "NAME a*b=…"
//   count(n)       -> n progress notifications 0.2 s apart, then "NAME counted n"
import { randomUUID } from 'node:crypto';
import express from 'express';
import { z } from 'zod';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';

const [name, mode, ...wanted] = process.argv.slice(2);
const calls = new Map();

function server() {
  const mcp = new McpServer({ name, version: '1.0.0' });
  const text = (t) => ({ content: [{ type: 'text', text: t }] });
  const tools = {
    whoami: () =>
      mcp.registerTool('whoami', { description: 'Names this server and counts the session calls' }, async (extra) => {
        const session = extra.sessionId ?? '-';
        const n = (calls.get(session) ?? 0) + 1;
        calls.set(session, n);
        return text(`${name} session ${session} call ${n}`);
      }),
    add: () =>
      mcp.registerTool('add', { description: 'Adds two numbers', inputSchema: { a: z.number(), b: z.number() } }, async ({ a, b }) =>
        text(`${name} ${a}+${b}=${a + b}`)),
    multiply: () =>
      mcp.registerTool('multiply', { description: 'Multiplies two numbers', inputSchema: { a: z.number(), b: z.number() } }, async ({ a, b }) =>
        text(`${name} ${a}*${b}=${a * b}`)),
    count: () =>
      mcp.registerTool('count', { description: 'Counts to n, reporting progress', inputSchema: { n: z.number() } }, async ({ n }, extra) => {
        const token = extra._meta?.progressToken;
        for (let i = 1; i <= n; i++) {
          if (token !== undefined) {
            await extra.sendNotification({ method: 'notifications/progress', params: { progressToken: token, progress: i, total: n, message: `${name} step ${i}` } });
          }
          await new Promise((r) => setTimeout(r, 200));
        }
        return text(`${name} counted ${n}`);
      }),
  };
  for (const tool of wanted) tools[tool]();
  return mcp;
}

const app = express();
app.use(express.json());
const transports = {};

if (mode === 'stateful') {
  app.post('/mcp', async (req, res) => {
    const id = req.headers['mcp-session-id'];
    let transport = id ? transports[id] : undefined;
    if (!transport && !id && isInitializeRequest(req.body)) {
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (sid) => { transports[sid] = transport; },
      });
      transport.onclose = () => { if (transport.sessionId) delete transports[transport.sessionId]; };
      await server().connect(transport);
    } else if (!transport) {
      res.status(400).json({ jsonrpc: '2.0', error: { code: -32000, message: 'Bad Request: No valid session ID provided' }, id: null });
      return;
    }
    await transport.handleRequest(req, res, req.body);
  });
  const bySession = async (req, res) => {
    const transport = transports[req.headers['mcp-session-id']];
    if (!transport) { res.status(400).send('Invalid or missing session ID'); return; }
    await transport.handleRequest(req, res);
  };
  app.get('/mcp', bySession);
  app.delete('/mcp', bySession);
} else {
  app.post('/mcp', async (req, res) => {
    const mcp = server();
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
    res.on('close', () => { transport.close(); mcp.close(); });
    await mcp.connect(transport);
    await transport.handleRequest(req, res, req.body);
  });
  const notAllowed = (_req, res) => res.status(405).json({ jsonrpc: '2.0', error: { code: -32000, message: 'Method not allowed.' }, id: null });
  app.get('/mcp', notAllowed);
  app.delete('/mcp', notAllowed);
}

// Counted for the test: sessions open now (the broker must end what it opens).
app.get('/sessions', (_req, res) => res.json({ open: Object.keys(transports).length }));

const listener = app.listen(0, '127.0.0.1', () => {
  console.log(JSON.stringify({ port: listener.address().port }));
});
