"""Drives enginesim with the official OpenAI Python client and prints what
the client parsed, as JSON, for the Go test to check."""
import json
import sys

import openai

base_url = sys.argv[1]
prompt = sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)
out = {}


def usage(u):
    if u is None:
        return None
    cached = None
    if u.prompt_tokens_details is not None:
        cached = u.prompt_tokens_details.cached_tokens
    return {"prompt": u.prompt_tokens, "completion": u.completion_tokens,
            "total": u.total_tokens, "cached": cached}


r = client.completions.create(model="sim-model", prompt=prompt, max_tokens=6, seed=7)
out["completion"] = {"text": r.choices[0].text, "finish": r.choices[0].finish_reason,
                     "usage": usage(r.usage), "object": r.object}

text, finish, u, n = "", None, None, 0
for chunk in client.completions.create(model="sim-model", prompt=prompt, max_tokens=6, seed=7,
                                       stream=True, stream_options={"include_usage": True}):
    n += 1
    if chunk.choices:
        text += chunk.choices[0].text
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage is not None:
        u = usage(chunk.usage)
out["completion_stream"] = {"text": text, "finish": finish, "usage": u, "chunks": n}

messages = [{"role": "user", "content": prompt}]
r = client.chat.completions.create(model="sim-model", messages=messages, max_tokens=5, seed=7)
out["chat"] = {"text": r.choices[0].message.content, "role": r.choices[0].message.role,
               "finish": r.choices[0].finish_reason, "usage": usage(r.usage)}

text, finish, u, roles = "", None, None, []
for chunk in client.chat.completions.create(model="sim-model", messages=messages, max_tokens=5, seed=7,
                                            stream=True, stream_options={"include_usage": True}):
    if chunk.choices:
        d = chunk.choices[0].delta
        if d.role:
            roles.append(d.role)
        text += d.content or ""
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage is not None:
        u = usage(chunk.usage)
out["chat_stream"] = {"text": text, "finish": finish, "usage": u, "roles": roles}



def responses_usage(u):
    return {"input": u.input_tokens, "output": u.output_tokens, "total": u.total_tokens,
            "cached": u.input_tokens_details.cached_tokens}


r = client.responses.create(model="sim-model", input=prompt, max_output_tokens=5, temperature=0)
out["responses"] = {"text": r.output_text, "status": r.status, "object": r.object,
                    "usage": responses_usage(r.usage)}

# The client's stream helper checks the event sequence as it accumulates it.
# A response cut at max_output_tokens ends with response.incomplete, as
# vLLM ends it (the helper's get_final_response wants response.completed).
events = []
final = None
with client.responses.stream(model="sim-model", input=prompt, max_output_tokens=5, temperature=0) as stream:
    for event in stream:
        events.append(event.type)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
out["responses_stream"] = {"text": final.output_text, "status": final.status, "object": final.object,
                           "usage": responses_usage(final.usage), "events": events}

errors = {}
try:
    client.responses.create(model="sim-model", input="x", previous_response_id="resp_unknown")
except openai.NotFoundError as e:
    errors["previous_response"] = {"status": e.status_code, "message": e.message}
try:
    client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
except openai.NotFoundError as e:
    errors["unknown_model"] = {"status": e.status_code, "message": e.message}
try:
    client.completions.create(model="sim-model", prompt="y" * 5000, max_tokens=1)
except openai.BadRequestError as e:
    errors["too_long"] = {"status": e.status_code, "message": e.message}
out["errors"] = errors

models = client.models.list()
out["models"] = [m.id for m in models.data]

json.dump(out, sys.stdout)
