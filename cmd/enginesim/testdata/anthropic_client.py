"""Drives enginesim's /v1/messages with the official Anthropic Python client
and prints what the client parsed, as JSON, for the Go test to check."""
import json
import sys

import anthropic

base_url = sys.argv[1]
text = sys.argv[2]
client = anthropic.Anthropic(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
out = {}

# Claude Code's shape: system blocks led by the per-request billing header,
# a tool, and a user turn of text blocks.
system = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.0; cch=00000;"},
    {"type": "text", "text": "You are Claude Code, a coding agent.", "cache_control": {"type": "ephemeral"}},
]
tools = [{"name": "Read", "description": "Reads a file.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]
messages = [{"role": "user", "content": [{"type": "text", "text": text}]}]
# Greedy, so that every request answers the same (the client has no
# temperature argument: it goes in the body as vLLM reads it).
args = dict(model="sim-model", max_tokens=5, system=system, tools=tools, messages=messages,
            metadata={"user_id": "user_abc_account_def_session_0a1b"}, extra_body={"temperature": 0})


def usage(u):
    return {"input": u.input_tokens, "output": u.output_tokens,
            "cache_read": u.cache_read_input_tokens, "cache_creation": u.cache_creation_input_tokens}


def message(m):
    return {"id": m.id, "type": m.type, "role": m.role, "model": m.model, "stop_reason": m.stop_reason,
            "stop_sequence": m.stop_sequence, "blocks": [b.type for b in m.content],
            "text": "".join(b.text for b in m.content if b.type == "text"), "usage": usage(m.usage)}


out["create"] = message(client.messages.create(**args))

# The client's stream helper checks the event order as it accumulates the
# message.
with client.messages.stream(**args) as stream:
    streamed = "".join(stream.text_stream)
    final = stream.get_final_message()
out["stream"] = dict(message(final), streamed=streamed)

# The raw events, as typed by the client.
events, start_usage = [], None
for ev in client.messages.create(stream=True, **args):
    events.append(ev.type)
    if ev.type == "message_start":
        start_usage = usage(ev.message.usage)
out["raw_events"] = events
out["start_usage"] = start_usage

count = client.messages.count_tokens(model="sim-model", system=system, tools=tools, messages=messages)
out["count_tokens"] = count.input_tokens

errors = {}
try:
    client.messages.create(**dict(args, model="no-such-model"))
except anthropic.NotFoundError as e:
    errors["unknown_model"] = {"status": e.status_code, "type": e.body["error"]["type"], "message": e.message}
try:
    client.messages.create(**dict(args, messages=[{"role": "user", "content": "y" * 5000}]))
except anthropic.BadRequestError as e:
    errors["too_long"] = {"status": e.status_code, "type": e.body["error"]["type"], "message": e.message}
try:
    # Rejected by vLLM's request model: answered in the OpenAI error shape.
    client.messages.create(**dict(args, max_tokens=0))
except anthropic.BadRequestError as e:
    errors["validation"] = {"status": e.status_code, "type": e.body["error"]["type"], "message": e.message}
out["errors"] = errors

json.dump(out, sys.stdout)
