// An A2A agent built with the official @a2a-js/sdk as its samples build one: JSON-RPC served at
// /a2a/jsonrpc, the card at /.well-known/agent-card.json naming that URL. For tests/it/sdk_js.rs.
//
// Usage: node a2a_agent.mjs NAME SKILL. Binds 127.0.0.1:0 and prints {"port": N} on stdout. Each
// answer names the agent and counts the turns of its context: "NAME turn N", so the client can
// tell which agent answered and that a second turn reached the holder of the first.
import express from 'express';
import { A2A_PROTOCOL_VERSION, AGENT_CARD_PATH, Role } from '@a2a-js/sdk';
import { AgentEvent, DefaultRequestHandler, InMemoryTaskStore } from '@a2a-js/sdk/server';
import { agentCardHandler, jsonRpcHandler, UserBuilder } from '@a2a-js/sdk/server/express';

const [name, skill] = process.argv.slice(2);
const turns = new Map();

class Executor {
  cancelTask = async () => {};

  async execute(context, bus) {
    const contextId = context.contextId;
    const turn = (turns.get(contextId) ?? 0) + 1;
    turns.set(contextId, turn);
    bus.publish(
      AgentEvent.message({
        role: Role.ROLE_AGENT,
        messageId: crypto.randomUUID(),
        parts: [{ content: { $case: 'text', value: `${name} turn ${turn}` }, metadata: undefined, filename: '', mediaType: 'text/plain' }],
        contextId,
        taskId: '',
        extensions: [],
        metadata: {},
        referenceTaskIds: [],
      })
    );
    bus.finished();
  }
}

const app = express();
const server = app.listen(0, '127.0.0.1', () => {
  const port = server.address().port;
  const card = {
    name,
    description: `The ${skill} agent ${name}`,
    supportedInterfaces: [
      { url: `http://127.0.0.1:${port}/a2a/jsonrpc`, protocolBinding: 'JSONRPC', tenant: '', protocolVersion: A2A_PROTOCOL_VERSION },
    ],
    provider: undefined,
    version: '1.0.0',
    capabilities: { streaming: true, pushNotifications: false, extensions: [], extendedAgentCard: false },
    securitySchemes: {},
    securityRequirements: [],
    defaultInputModes: ['text'],
    defaultOutputModes: ['text'],
    skills: [
      { id: skill, name: skill, description: `Answers as ${name}`, tags: [skill], examples: [], inputModes: ['text'], outputModes: ['text'], securityRequirements: [] },
    ],
    documentationUrl: '',
    signatures: [],
  };
  const requestHandler = new DefaultRequestHandler(card, new InMemoryTaskStore(), new Executor());
  app.use(`/${AGENT_CARD_PATH}`, agentCardHandler({ agentCardProvider: requestHandler }));
  app.use('/a2a/jsonrpc', jsonRpcHandler({ requestHandler, userBuilder: UserBuilder.noAuthentication }));
  console.log(JSON.stringify({ port }));
});
