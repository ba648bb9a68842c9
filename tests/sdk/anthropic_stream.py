"""Anthropic's official Python SDK in its default configuration, streaming one message through
the agent's sidecar by the `.reach` form: base_url http://<capability>.reach, the outbound port as
HTTP_PROXY (httpx reads it from the environment). Prints what the SDK read, as one JSON line.

Usage: anthropic_stream.py OUTBOUND_PORT CAPABILITY (the port becomes HTTP_PROXY, as a pod's
environment would set it)
"""

import json
import os
import sys

import anthropic


def main() -> None:
    port, capability = sys.argv[1], sys.argv[2]
    os.environ["HTTP_PROXY"] = f"http://127.0.0.1:{port}"
    client = anthropic.Anthropic(base_url=f"http://{capability}.reach", api_key="sk-ant-test")
    with client.messages.stream(
        model="claude-test",
        max_tokens=64,
        messages=[{"role": "user", "content": "Review this change, please."}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    print(
        json.dumps(
            {
                "text": text,
                "input_tokens": final.usage.input_tokens,
                "output_tokens": final.usage.output_tokens,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
