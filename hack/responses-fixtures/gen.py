#!/usr/bin/env python3
"""Generates pkg/openai/testdata/responses.json: what vLLM makes of
/v1/responses bodies before its chat template runs (the chat messages, the
tool dicts and the template's generation flags), for the Go conversion to be
compared with.

vLLM cannot be imported here (it needs torch and a GPU build), so this loads
the few functions that do the conversion straight from a vLLM wheel's source
(they depend only on pydantic and the openai SDK types) and runs them on each
body, after validating the body's input and tools with the same SDK types
and vLLM's own input_item_parsing validator. Nothing of vLLM's is copied into
this repository: the functions are read from the wheel at generation time.

Usage:
  pip download vllm==0.33.0 --no-deps -d /tmp/vllm-wheel
  unzip -q -o /tmp/vllm-wheel/vllm-0.33.0-*.whl 'vllm/*' -d /tmp/vllm-src
  pip install 'openai>=2.25' pydantic
  python3 hack/responses-fixtures/gen.py --vllm /tmp/vllm-src/vllm --out pkg/openai/testdata/responses.json
(or: make responses-fixtures-regen)
"""

import argparse
import ast
import json
import logging
import os
import uuid
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal

import openai
from openai.types.chat import (ChatCompletionAssistantMessageParam, ChatCompletionMessageToolCallParam,
                               ChatCompletionToolMessageParam)
from openai.types.chat.chat_completion_message_tool_call_param import Function as FunctionCallTool
from openai.types.responses import (CustomTool, FunctionTool, ResponseFunctionToolCall, ResponseInputItemParam,
                                    ResponseOutputItem, ResponseOutputMessage, ResponseReasoningItem)
from openai.types.responses.response_function_tool_call_output_item import ResponseFunctionToolCallOutputItem
from openai.types.responses.tool import Tool
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_serializer, model_validator


class VLLMValidationError(ValueError):
    pass


def load(path, names, ns):
    """Executes the named top-level functions of a source file in ns."""
    tree = ast.parse(open(path).read())
    found = set()
    nodes = list(tree.body)
    for node in tree.body:  # methods asked for as Class.method
        if isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef) and node.name + "." + sub.name in names:
                    sub.decorator_list = []  # called directly below, as a plain function
                    sub.name = node.name + "_" + sub.name
                    names = (names - {node.name + "." + sub.name.split("_", 1)[1]}) | {sub.name}
                    nodes.append(sub)
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            node.decorator_list = [d for d in node.decorator_list if not (isinstance(d, ast.Name) and d.id == "classmethod")]
            exec(compile(ast.Module([node], []), path, "exec"), ns)
            found.add(node.name)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in node.targets):
            exec(compile(ast.Module([node], []), path, "exec"), ns)
            found.update(t.id for t in node.targets if isinstance(t, ast.Name))
    missing = set(names) - found
    if missing:
        raise SystemExit("%s: not found: %s" % (path, sorted(missing)))


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")


def build(vllm):
    """Each source file's functions run in a namespace of their own, holding
    the names that file imports."""
    base = dict(globals())
    base.update({"Any": Any, "Iterable": Iterable, "Literal": Literal, "Sequence": Sequence,
                 "logger": logging.getLogger("vllm"), "random_uuid": lambda: uuid.uuid4().hex,
                 "model_serializer": model_serializer, "model_validator": model_validator, "Field": Field})
    models = dict(base)
    load(os.path.join(vllm, "entrypoints", "generate", "base", "protocol.py"), {"FunctionDefinition"}, models)
    load(os.path.join(vllm, "entrypoints", "openai", "chat_completion", "protocol.py"), {"ChatCompletionToolsParam"}, models)
    tp = dict(base, FunctionDefinition=models["FunctionDefinition"], ChatCompletionToolsParam=models["ChatCompletionToolsParam"],
              NamespaceTool=openai.types.responses.NamespaceTool, ResponsesTool=Tool)
    tp["Tool"] = models["ChatCompletionToolsParam"] | Tool
    load(os.path.join(vllm, "tool_parsers", "utils.py"),
         {"_NAMESPACE_TOOL_SEPARATOR", "CUSTOM_TOOL_INPUT_KEY", "flat_namespace_tool_name", "custom_tool_parameters",
          "custom_tool_as_function_dict", "get_function_tools", "iter_response_function_tool_dicts"}, tp)
    ru = dict(base, FunctionDefinition=models["FunctionDefinition"], ChatCompletionToolsParam=models["ChatCompletionToolsParam"],
              ChatCompletionMessageParam=dict, ResponseInputOutputItem=Any, ToolChoice=Any,
              flat_namespace_tool_name=tp["flat_namespace_tool_name"], CUSTOM_TOOL_INPUT_KEY=tp["CUSTOM_TOOL_INPUT_KEY"],
              iter_response_function_tool_dicts=tp["iter_response_function_tool_dicts"])
    load(os.path.join(vllm, "entrypoints", "openai", "responses", "utils.py"),
         {"encode_custom_tool_input", "_item_type", "_item_dict", "should_continue_final_message",
          "construct_input_messages", "construct_chat_messages_with_tool_call", "_construct_message_from_response_item",
          "convert_tool_responses_to_completions_format", "construct_tool_dicts"}, ru)
    rp = dict(base)
    load(os.path.join(vllm, "entrypoints", "openai", "responses", "protocol.py"),
         {"_default_input_image_details", "ResponsesRequest.input_item_parsing"}, rp)
    item = Annotated[ResponseInputItemParam | ResponseOutputItem, BeforeValidator(rp["_default_input_image_details"])]

    class Body(BaseModel):
        model_config = ConfigDict(extra="allow")
        input: str | list[item]
        instructions: str | None = None
        tools: list[Tool] = Field(default_factory=list)
        tool_choice: Any = "auto"

        @model_validator(mode="before")
        @classmethod
        def _items(cls, data):
            return rp["ResponsesRequest_input_item_parsing"](cls, data)

    ru["Body"] = Body
    return ru


def convert(ns, body):
    try:
        req = ns["Body"].model_validate(json.loads(json.dumps(body)))
        messages = ns["construct_input_messages"](request_instructions=req.instructions, request_input=req.input)
        tools = ns["construct_tool_dicts"](req.tools, req.tool_choice)
        cont = ns["should_continue_final_message"](req.input)
    except (ValidationError, ValueError, KeyError, AttributeError, TypeError, IndexError) as e:
        return {"body": body, "error": type(e).__name__}
    # The tools as the template's tojson prints them (json.dumps), which is
    # where their key order and null fields show.
    return {"body": body, "messages": json.loads(json.dumps(messages, default=dump)),
            "tools_tojson": None if tools is None else json.dumps(tools, ensure_ascii=False),
            "add_generation_prompt": not cont, "continue_final_message": cont}


def dump(o):
    if hasattr(o, "model_dump"):
        return o.model_dump()
    if isinstance(o, Iterable):
        return list(o)
    raise TypeError(type(o))


def bodies():
    weather = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}
    out = {"type": "function_call_output", "call_id": "call_1", "output": "18C, cloudy"}
    yield {"model": "m", "input": "Tell me a joke."}
    yield {"model": "m", "input": "Hi", "instructions": "Be brief."}
    yield {"model": "m", "input": "Hi", "instructions": ""}
    yield {"model": "m", "input": [{"role": "user", "content": "Hi"}]}
    yield {"model": "m", "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]}
    yield {"model": "m", "instructions": "You are a coding agent.", "input": [
        {"role": "developer", "content": "Use the tools."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather?"}, {"type": "input_text", "text": "In Paris."}]},
        call, out]}
    yield {"model": "m", "input": [
        {"role": "user", "content": "Weather?"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me check."}]},
        call, dict(call, call_id="call_2", arguments="{\"city\": \"Rome\"}"),
        out, dict(out, call_id="call_2", output="25C")]}
    yield {"model": "m", "input": [
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "I should call the tool."}]},
        call, out,
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 18C."}]},
        {"role": "user", "content": "Thanks"}]}
    yield {"model": "m", "input": [
        {"role": "user", "content": "Weather?"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Summary only."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]}]}
    yield {"model": "m", "input": [{"role": "user", "content": "x"},
                                   {"role": "assistant", "content": "plain assistant string"},
                                   {"role": "user", "content": "y"}]}
    yield {"model": "m", "input": [{"role": "user", "content": "Continue:"},
                                   {"type": "message", "role": "assistant", "status": "in_progress",
                                    "content": [{"type": "output_text", "text": "Once upon"}]}]}
    yield {"model": "m", "input": [{"role": "user", "content": "x"}, call, out],
           "tools": [{"type": "function", "name": "get_weather", "description": "Weather now.", "parameters": weather, "strict": True},
                     {"type": "function", "name": "noop", "parameters": None, "strict": False},
                     {"type": "web_search"}]}
    yield {"model": "m", "input": "x", "tool_choice": "none",
           "tools": [{"type": "function", "name": "f", "parameters": weather}]}
    yield {"model": "m", "input": "x", "tools": [{"type": "custom", "name": "apply_patch", "description": "Apply a patch."}]}
    yield {"model": "m", "input": [dict(call, namespace="files"), out],
           "tools": [{"type": "namespace", "name": "files", "description": "File tools.",
                      "tools": [{"type": "function", "name": "read", "parameters": weather}]}]}
    yield {"model": "m", "input": [{"role": "system", "content": "S"}, {"role": "user", "content": "u", "name": "bob"}]}
    yield {"model": "m", "input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": "list output"}]}]}
    yield {"model": "m", "input": [
        {"role": "user", "content": "Patch it."},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "A patch."}]},
        {"type": "message", "role": "assistant", "content": "Applying."},
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch\n+x <y> & \"z\"\n"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s1"}], "content": [{"type": "reasoning_text", "text": "r2"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s3"}]},
        call, {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}, {"type": "output_text", "text": "b"}]}],
        "tools": [{"type": "custom", "name": "apply_patch", "description": "Apply."}]}
    yield {"model": "m", "input": [{"role": "assistant", "content": []}, {"role": "assistant", "content": [{"type": "input_text", "text": "t"}]}, call]}
    yield {"model": "m", "input": [{"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}]}
    yield {"model": "m", "input": [{"type": "message", "role": "assistant", "content": []}]}
    yield {"model": "m", "input": "x", "instructions": ["not", "a", "string"]}
    yield {"model": "m", "input": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "tools": [
        {"type": "function", "name": "g", "description": "G.", "parameters": {"type": "object", "properties": {}}, "defer_loading": True},
        {"type": "file_search", "vector_store_ids": ["v"]}]}
    yield {"model": "m", "input": "x", "tools": [{"type": "web_search"}]}
    yield {"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]}
    yield {"model": "m", "input": [{"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}]}
    yield {"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x/y.png"}]}]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm", required=True, help="the vllm package directory of an unpacked wheel")
    ap.add_argument("--out", required=True)
    ap.add_argument("--vllm-version", default="0.33.0", help="the wheel's version, recorded in the file")
    a = ap.parse_args()
    ns = build(a.vllm)
    cases = [convert(ns, b) for b in bodies()]
    meta = {"vllm_source": a.vllm_version, "openai": openai.__version__}
    with open(a.out, "w") as f:
        json.dump({"meta": meta, "cases": cases}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("%d cases (%d errors) -> %s" % (len(cases), sum("error" in c for c in cases), a.out))


if __name__ == "__main__":
    main()
