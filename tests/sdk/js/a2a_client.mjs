// The a2a-js client's side of tests/it/sdk_js.rs, in its default configuration: the card is
// discovered from a plain URL (the sidecar's path-prefix form, since Node's fetch ignores
// HTTP_PROXY), a message sent, then a second turn in the same context.
//
// Usage: node a2a_client.mjs CARD_URL. Prints one JSON line: the card's interface URL as served,
// and each turn's answer text.
import { Role } from '@a2a-js/sdk';
import { ClientFactory } from '@a2a-js/sdk/client';

const [cardUrl] = process.argv.slice(2);

function message(text, contextId) {
  return {
    message: {
      role: Role.ROLE_USER,
      messageId: crypto.randomUUID(),
      parts: [{ content: { $case: 'text', value: text }, metadata: undefined, filename: '', mediaType: 'text/plain' }],
      contextId,
      taskId: '',
      extensions: [],
      metadata: {},
      referenceTaskIds: [],
    },
  };
}

function text(result) {
  const msg = result?.payload?.$case === 'message' ? result.payload.value : result?.message ?? result;
  const part = msg?.parts?.[0]?.content;
  return part?.$case === 'text' ? part.value : JSON.stringify(result);
}

const found = {};
try {
  const card = await (await fetch(cardUrl)).json();
  found.interface = card.supportedInterfaces?.[0]?.url;
  const client = await new ClientFactory().createFromUrl(cardUrl, '');
  const contextId = crypto.randomUUID();
  found.first = text(await client.sendMessage(message('hello', contextId)));
  found.second = text(await client.sendMessage(message('again', contextId)));
} catch (err) {
  found.error = String(err?.stack ?? err);
}
console.log(JSON.stringify(found));
