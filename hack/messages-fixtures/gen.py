#!/usr/bin/env python3
"""Generates pkg/openai/testdata/messages.json: the chat request vLLM builds
from an Anthropic /v1/messages body (the chat messages, the tool dicts, the
tool choice, the reasoning effort, the template kwargs, stream and
max_tokens), for the Go conversion to be compared with.

Each case holds the body and one of:
  "invalid": the body fails vLLM's AnthropicMessagesRequest validation (the
             pydantic error text, without its documentation links);
  "error":   the conversion itself raises (e.g. a tool_addition naming a tool
             the body does not declare);
  "plain" and "merged": the conversion with merge_inline_system off and on
             (vLLM turns it on for chat templates that reject a system message
             after the first one; see merge_oracle.py).
Both conversions use disabled_thinking_effort="none".

vLLM cannot be imported here (it needs torch and a GPU build), so this loads
the conversion (the AnthropicServingMessages class methods and the request
models of vllm/entrypoints/anthropic) straight from a vLLM wheel's source and
runs it with small stand-ins for the chat request classes it builds, whose
own validation does not change what is recorded here. The bodies are
validated by the wheel's own pydantic models. Nothing of vLLM's is copied
into this repository: the code is read from the wheel at generation time.

Usage:
  pip download vllm==0.33.0 --no-deps -d /tmp/vllm-wheel
  unzip -q -o /tmp/vllm-wheel/vllm-0.33.0-*.whl 'vllm/*' -d /tmp/vllm-src
  pip install pydantic jinja2
  python3 hack/messages-fixtures/gen.py --vllm /tmp/vllm-src/vllm --out pkg/openai/testdata/messages.json
(or: make messages-fixtures-regen)
"""

import __future__
import argparse
import ast
import copy
import json
import os
import sys
import time
import types
from typing import Annotated, Any, Literal, TypeAlias, get_args

import jinja2
import jinja2.ext
import jinja2.sandbox
from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator


def load(path, names, modname, env):
    """Executes, in source order, the named top-level definitions of a source
    file (functions, classes, assignments) in a fresh module whose globals
    start as env, and returns that module. A name "Class.method" asks for a
    class of that name holding just the named methods (decorators kept)."""
    tree = ast.parse(open(path).read())
    # A file that postpones its annotations gets its definitions compiled the same way.
    flags = 0
    if any(isinstance(n, ast.ImportFrom) and n.module == "__future__" and any(a.name == "annotations" for a in n.names)
           for n in tree.body):
        flags = __future__.annotations.compiler_flag
    methods = {}
    for n in names:
        if "." in n:
            cls, meth = n.split(".", 1)
            methods.setdefault(cls, set()).add(meth)
    mod = types.ModuleType(modname)
    mod.__dict__.update(env)
    sys.modules[modname] = mod  # pydantic resolves forward references through the module
    found = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in methods:
            body = [s for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and s.name in methods[node.name]]
            found.update(node.name + "." + s.name for s in body)
            node = ast.ClassDef(name=node.name, bases=[], keywords=[], body=body, decorator_list=[], type_params=[])
            node = ast.fix_missing_locations(ast.copy_location(node, node))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name in names:
            found.add(node.name)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in node.targets):
            found.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id in names:
            found.add(node.target.id)
        else:
            continue
        exec(compile(ast.Module([node], []), path, "exec", flags=flags, dont_inherit=True), mod.__dict__)
    missing = set(names) - found
    if missing:
        raise SystemExit("%s: not found: %s" % (path, sorted(missing)))
    return mod


PROTOCOL_NAMES = {
    "AnthropicContentBlock", "_reject_tool_changes", "AnthropicMessage", "AnthropicTool",
    "AnthropicToolChangeReference", "AnthropicToolChangeDefinition", "AnthropicToolChange",
    "AnthropicToolChoice", "AnthropicJsonOutputFormat", "AnthropicEffort", "AnthropicDisabledThinkingEffort",
    "AnthropicDisabledThinkingEffortOption", "AnthropicThinkingDisplay", "AnthropicOutputConfig",
    "AnthropicThinkingConfigEnabled", "AnthropicThinkingConfigDisabled", "AnthropicThinkingConfigAdaptive",
    "AnthropicThinkingConfig", "AnthropicMessagesRequest", "AnthropicCountTokensRequest",
}

SERVING_METHODS = {"AnthropicServingMessages." + m for m in (
    "to_chat_completion_request", "_convert_system_message", "_extract_system_text", "_convert_messages",
    "_convert_message_content", "_convert_block", "_convert_tool_use_block", "_convert_tool_result_block",
    "_convert_user_tool_result", "_convert_image_source_to_url", "_build_base_request", "_handle_thinking",
    "_handle_output_config", "_handle_streaming_options", "_convert_tool_choice", "_resolve_tools",
    "_convert_tools", "_detect_merge_inline_system")}


class ChatCompletionRequest:
    """Stands in for vLLM's chat request: records what the conversion sets,
    by keyword or by attribute."""

    def __init__(self, **kwargs):
        self.__dict__.update(kwargs)

    def __getattr__(self, name):  # only for fields never set
        return None


class _Validated:
    """Stands in for a vLLM pydantic model the conversion builds with
    model_validate: the dict it was given."""

    @staticmethod
    def model_validate(d):
        return d


class ChatCompletionToolsParam(_Validated):
    pass


class ChatCompletionNamedToolChoiceParam(_Validated):
    pass


class StreamOptions(_Validated):
    pass


class ResponseFormat:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


class JsonSchemaResponseFormat(ResponseFormat):
    pass


def build(vllm):
    """Returns the conversion class and the request model, each loaded into a
    module of its own holding the names its source file imports."""
    base = {"Annotated": Annotated, "Any": Any, "Literal": Literal, "TypeAlias": TypeAlias, "get_args": get_args,
            "BaseModel": BaseModel, "Field": Field, "field_validator": field_validator,
            "model_validator": model_validator, "time": time}
    gen = load(os.path.join(vllm, "entrypoints", "generate", "base", "protocol.py"),
               {"MMPayload", "resolve_return_mm_kwargs_alias"}, "_vllm_generate_base_protocol", base)
    # vllm.envs reads VLLM_MAX_STOP_STRINGS from the environment; this is its default.
    envs = types.SimpleNamespace(VLLM_MAX_STOP_STRINGS=int(os.environ.get("VLLM_MAX_STOP_STRINGS", "4")))
    proto = load(os.path.join(vllm, "entrypoints", "anthropic", "protocol.py"), PROTOCOL_NAMES,
                 "_vllm_anthropic_protocol", dict(base, envs=envs, MMPayload=gen.MMPayload,
                                                  resolve_return_mm_kwargs_alias=gen.resolve_return_mm_kwargs_alias))
    for name in PROTOCOL_NAMES:
        obj = getattr(proto, name)
        if isinstance(obj, type) and issubclass(obj, BaseModel):
            obj.model_rebuild()
    env = dict(base, json=json, jinja2=jinja2, ChatCompletionRequest=ChatCompletionRequest,
               ChatCompletionToolsParam=ChatCompletionToolsParam,
               ChatCompletionNamedToolChoiceParam=ChatCompletionNamedToolChoiceParam, StreamOptions=StreamOptions,
               ResponseFormat=ResponseFormat, JsonSchemaResponseFormat=JsonSchemaResponseFormat)
    env.update({n: getattr(proto, n) for n in PROTOCOL_NAMES})
    serving = load(os.path.join(vllm, "entrypoints", "anthropic", "serving.py"), SERVING_METHODS,
                   "_vllm_anthropic_serving", env)
    return serving.AnthropicServingMessages, proto.AnthropicMessagesRequest


def pydantic_text(e):
    """The validation error's text without pydantic's documentation links,
    which name pydantic's version."""
    return "\n".join(line for line in str(e).splitlines() if "errors.pydantic.dev" not in line)


def record(req):
    return {"messages": req.messages, "tools": req.tools, "tool_choice": req.tool_choice,
            "reasoning_effort": req.reasoning_effort, "chat_template_kwargs": req.chat_template_kwargs,
            "stream": req.stream, "max_tokens": req.max_tokens}


class Raw(str):
    """A body given as JSON text, for number literals and duplicate keys that
    a Python dict cannot hold; the fixture carries the text as it is."""


def convert(conv, model, name, body):
    case = {"name": name, "body": body}
    try:
        req = model.model_validate(json.loads(body) if isinstance(body, Raw) else copy.deepcopy(body))
    except ValidationError as e:
        case["invalid"] = pydantic_text(e)
        return case
    out = {}
    for key, merge in (("plain", False), ("merged", True)):
        try:
            got = conv.to_chat_completion_request(req, merge_inline_system=merge, disabled_thinking_effort="none")
        except Exception as e:  # what vLLM answers with a 400
            out[key] = {"error": "%s: %s" % (type(e).__name__, e)}
        else:
            # Through JSON now, so that nothing shared with a later call can change it.
            out[key] = json.loads(json.dumps(record(got), ensure_ascii=False))
    if "error" in out["plain"] or "error" in out["merged"]:
        if out["plain"] != out["merged"]:
            raise SystemExit("%s: the conversion fails with only one of the merge settings: %r" % (name, out))
        case["error"] = out["plain"]["error"]
        return case
    case.update(out)
    return case


BILLING = "x-anthropic-billing-header: cc_version=2.1.42.e7c; cc_entrypoint=cli; cch=4f1a2;"
EPH = {"type": "ephemeral"}


def text(t, **kw):
    return dict({"type": "text", "text": t}, **kw)


def tool_use(id_, name, input_=None, **kw):
    block = {"type": "tool_use", "id": id_, "name": name}
    if input_ is not None:
        block["input"] = input_
    block.update(kw)
    return block


def tool_result(id_, content=None, **kw):
    block = {"type": "tool_result", "tool_use_id": id_}
    if content is not None:
        block["content"] = content
    block.update(kw)
    return block


def body(messages, **kw):
    return dict({"model": "m", "max_tokens": 1024, "messages": messages}, **kw)


def bodies():
    """(name, body) pairs."""
    hi = [{"role": "user", "content": "Hi"}]
    img64 = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    imgurl = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}}
    weather = {"name": "get_weather", "description": "Current weather for a city.",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    clock = {"name": "clock", "input_schema": {"type": "object", "properties": {}}}

    # The top-level system prompt.
    yield "system_string", body(hi, system="You are a helpful assistant.")
    yield "system_string_empty", body(hi, system="")
    yield "system_list_empty", body(hi, system=[])
    yield "system_blocks_billing_cache_control", body(hi, system=[
        text(BILLING), text("You are an interactive CLI coding agent.", cache_control=EPH),
        text("\nFollow the project's conventions.", cache_control=dict(EPH, ttl="1h"))])
    yield "system_blocks_empty_text", body(hi, system=[text(""), text("A"), {"type": "text"}, text("B")])
    yield "system_blocks_billing_multiline_block", body(hi, system=[text(BILLING + "\nKept or not?"), text("Rest.")])
    yield "system_blocks_only_billing", body(hi, system=[text(BILLING)])
    yield "system_string_billing_prefix", body(hi, system=BILLING + "\nYou are helpful.")
    yield "system_blocks_non_text_ignored", body(hi, system=[img64, text("Only text counts."),
                                                             {"type": "thinking", "thinking": "hidden"}])

    # System messages inside messages.
    yield "inline_system_string_middle", body([
        {"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
        {"role": "system", "content": "Reminder: be terse."}, {"role": "user", "content": "three"}],
        system="Top.")
    yield "inline_system_list_billing_first", body([
        {"role": "system", "content": [text(BILLING), text("Inline A."), text(""), text("Inline B.")]},
        {"role": "user", "content": "go"}])
    yield "inline_system_empty", body([
        {"role": "user", "content": "a"}, {"role": "system", "content": ""},
        {"role": "system", "content": []}, {"role": "system", "content": [text("")]},
        {"role": "user", "content": "b"}], system=[text("Top block.")])
    yield "inline_system_last_and_billing_string", body([
        {"role": "system", "content": BILLING + " trailing"}, {"role": "user", "content": "q"},
        {"role": "system", "content": "Last word."}])
    yield "inline_system_several_with_top_blocks", body([
        {"role": "system", "content": "first inline"}, {"role": "user", "content": "u1"},
        {"role": "assistant", "content": [text("a1")]}, {"role": "system", "content": [text("second "), text("inline")]},
        {"role": "user", "content": "u2"}], system=[text(BILLING), text("Top 1."), text("Top 2.")])

    # User content.
    yield "user_string", body([{"role": "user", "content": "Hello, world"}])
    yield "user_string_empty", body([{"role": "user", "content": ""}])
    yield "user_single_text_block", body([{"role": "user", "content": [text("just one", cache_control=EPH)]}])
    yield "user_several_text_blocks", body([{"role": "user", "content": [text("first"), text("second"), text("third")]}])
    yield "user_text_blocks_some_empty", body([{"role": "user", "content": [text(""), text("only this"), text("")]}])
    yield "user_empty_list_and_empty_text", body([
        {"role": "user", "content": []}, {"role": "user", "content": [text("")]}, {"role": "user", "content": "kept"}])
    yield "user_images", body([
        {"role": "user", "content": [text("What is this?"), img64, imgurl]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": [imgurl]},
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "data": "AAAA"}},
            {"type": "image", "source": {"type": "file", "file_id": "f1"}},
            {"type": "image", "source": {"type": "url"}},
            {"type": "image", "source": {}}, {"type": "image"}, text("and these?")]}])
    yield "user_system_reminder_blocks", body([{"role": "user", "content": [
        text("<system-reminder>\nAs you answer, use the context below.\n# claudeMd\nRun make test.\n</system-reminder>\n"),
        text("Fix the failing test in pkg/x."),
        text("<system-reminder>The user opened pkg/x/x.go.</system-reminder>")]}])

    # Assistant content.
    yield "assistant_thinking_text_tool_uses", body([
        {"role": "user", "content": "Look around."},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should list files, then read one.", "signature": "c2lnbmF0dXJl"},
            text("Let me look."),
            tool_use("toolu_01", "Bash", {"command": "ls -la", "description": "List files", "timeout": 1.0,
                                          "opts": {"env": {"LANG": "C"}, "retries": [1, 2.5, 1e5]}}),
            tool_use("toolu_02", "Read", {"file_path": "/tmp/héllo wörld/日本.txt", "note": "emoji 😀 and \u2028 sep \u2029",
                                          "limit": 12345678901234567890, "ratio": 1.5e-7, "neg": -0.0, "huge": 1e300}),
            tool_use("toolu_03", "Noop", {}),
            tool_use("toolu_04", "Clock")]},
        {"role": "user", "content": [tool_result("toolu_01", "a\nb"), tool_result("toolu_02", "text"),
                                     tool_result("toolu_03", "ok"), tool_result("toolu_04", "12:00")]}])
    yield "assistant_tool_use_escapes", body([
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [tool_use("toolu_esc", "Write", {
            "content": "line1\nline2\t\"quoted\" \\ back / slash <tag> & amp '\u0000' \u007f \u0080 \u00e9 \ufeff",
            "nested": [[], {}, [None, True, False]], "z": 1, "a": 2, "n": None})]},
        {"role": "user", "content": [tool_result("toolu_esc", "written")]}])
    yield "assistant_redacted_thinking", body([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
                                          {"type": "thinking", "thinking": "visible", "signature": "s"}, text("answer")]},
        {"role": "user", "content": "next"}])
    yield "assistant_empty_list", body([{"role": "user", "content": "q"}, {"role": "assistant", "content": []},
                                        {"role": "user", "content": "again"}])
    yield "assistant_only_empty_text", body([{"role": "user", "content": "q"}, {"role": "assistant", "content": [text("")]},
                                             {"role": "user", "content": "again"}])
    yield "assistant_string_and_prefill", body([{"role": "user", "content": "Count to 3."},
                                                {"role": "assistant", "content": "1, 2,"}])
    yield "assistant_thinking_variants", body([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "", "signature": "s"}]},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "part one, "}, {"type": "thinking"},
                                          {"type": "thinking", "thinking": "part two"}, text("done")]},
        {"role": "user", "content": "q3"}])
    yield "assistant_tool_use_without_name_and_image", body([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_nn", "input": {"k": "v"}}, imgurl]},
        {"role": "user", "content": [tool_result("toolu_nn", "r")]}])

    # Tool results.
    yield "tool_result_string", body([
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [tool_use("toolu_w", "get_weather", {"city": "Paris"})]},
        {"role": "user", "content": [tool_result("toolu_w", "18C, cloudy", cache_control=EPH)]}], tools=[weather])
    yield "tool_result_text_list", body([
        {"role": "user", "content": "read"},
        {"role": "assistant", "content": [tool_use("toolu_r", "Read", {"file_path": "a.go"})]},
        {"role": "user", "content": [tool_result("toolu_r", [text("     1\tpackage a"), text("     2\t"), {"type": "text"},
                                                             text("last", cache_control=EPH)])]}])
    yield "tool_result_with_images", body([
        {"role": "user", "content": "screenshot"},
        {"role": "assistant", "content": [tool_use("toolu_s", "Screenshot", {}), tool_use("toolu_t", "Screenshot", {})]},
        {"role": "user", "content": [
            tool_result("toolu_s", [text("Captured."), img64, imgurl, {"type": "image"}]),
            tool_result("toolu_t", [img64])]}])
    yield "tool_result_tool_reference", body([
        {"role": "user", "content": "find a tool"},
        {"role": "assistant", "content": [tool_use("toolu_ts", "ToolSearch", {"query": "weather"})]},
        {"role": "user", "content": [tool_result("toolu_ts", [
            text("Found 2 tools."), {"type": "tool_reference", "tool_name": "get_weather"},
            {"type": "tool_reference", "name": "clock"}, {"type": "tool_reference"}, img64])]}],
        tools=[dict(weather, defer_loading=True), clock])
    yield "tool_result_is_error_and_empty", body([
        {"role": "user", "content": "run"},
        {"role": "assistant", "content": [tool_use("toolu_e1", "Bash", {"command": "false"}),
                                          tool_use("toolu_e2", "Bash", {"command": "true"}),
                                          tool_use("toolu_e3", "Bash", {"command": ":"})]},
        {"role": "user", "content": [tool_result("toolu_e1", "Exit code 1", is_error=True), tool_result("toolu_e2", []),
                                     tool_result("toolu_e3"), {"type": "tool_result", "content": "no id"}]}])
    yield "user_mixed_tool_results_and_text", body([
        {"role": "user", "content": "do two things"},
        {"role": "assistant", "content": [text("On it."), tool_use("toolu_a", "A", {"x": 1}),
                                          tool_use("toolu_b", "B", {"y": 2})]},
        {"role": "user", "content": [
            text("Before the results."), tool_result("toolu_a", "result a"),
            text("<system-reminder>Between.</system-reminder>"), tool_result("toolu_b", [text("result b"), img64]),
            imgurl, text("After.")]}])
    yield "user_tool_result_then_single_text", body([
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [tool_use("toolu_g", "G", {})]},
        {"role": "user", "content": [tool_result("toolu_g", "done"), text("Now summarize.")]}])
    yield "assistant_tool_result_string", body([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [tool_result("toolu_x", "42")]},
        {"role": "assistant", "content": [text("The answer:"), tool_result("toolu_y", "43", is_error=True)]},
        {"role": "user", "content": "and?"}])
    yield "assistant_tool_result_list_and_empty", body([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [tool_result("toolu_l", [
            text("it's \"x\""), {"type": "image", "source": {"type": "url", "url": "u"}}])]},
        {"role": "assistant", "content": [tool_result("toolu_m", []), tool_result("toolu_n")]},
        {"role": "user", "content": "ok"}])

    # Tools and tool choice.
    yield "tools_variants", body(hi, tools=[
        weather,
        {"name": "no_description", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}},
        {"name": "schema_without_type", "description": "d",
         "input_schema": {"properties": {"a": {"type": "integer"}}, "required": ["a"]}},
        {"name": "type_not_first", "input_schema": {"properties": {}, "type": "object", "additionalProperties": False}},
        {"name": "strict_tool", "description": "s", "input_schema": {"type": "object"}, "strict": True},
        {"name": "deferred", "input_schema": {}, "defer_loading": True, "strict": False},
        {"name": "extras", "description": "has extra keys", "type": "custom", "cache_control": EPH,
         "input_schema": {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                          "properties": {"n": {"type": "number", "default": 1.0, "maximum": 1e5}}}}])
    yield "tools_empty_list", body(hi, tools=[])
    yield "tool_choice_auto_parallel", body(hi, tools=[weather], tool_choice={"type": "auto", "disable_parallel_tool_use": False})
    yield "tool_choice_any", body(hi, tools=[weather, clock], tool_choice={"type": "any"})
    yield "tool_choice_none", body(hi, tools=[weather], tool_choice={"type": "none"})
    yield "tool_choice_tool_no_parallel", body(hi, tools=[weather, clock],
                                               tool_choice={"type": "tool", "name": "clock", "disable_parallel_tool_use": True})
    yield "tool_choice_tool_parallel", body(hi, tools=[weather], tool_choice={"type": "tool", "name": "get_weather",
                                                                              "disable_parallel_tool_use": False})
    yield "tool_choice_without_tools", body(hi, tool_choice={"type": "any"})

    # tool_addition / tool_removal in system messages.
    deferred = dict(clock, defer_loading=True, description="Tells the time.")
    search = {"name": "search", "description": "Web search.", "input_schema": {"properties": {"q": {"type": "string"}}}}
    yield "tool_addition_by_reference", body([
        {"role": "user", "content": "time?"},
        {"role": "system", "content": [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "clock"}}]},
        {"role": "user", "content": "now?"}], tools=[weather, deferred])
    yield "tool_addition_by_definition", body([
        {"role": "user", "content": "search?"},
        {"role": "system", "content": [text("Search is available now."),
                                       {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": search}}]},
        {"role": "user", "content": "go"}], tools=[weather])
    yield "tool_addition_definition_without_tools", body([
        {"role": "system", "content": [{"type": "tool_addition", "tool": {"type": "tool_definition", "definition": search}}]},
        {"role": "user", "content": "go"}], tool_choice={"type": "any"})
    yield "tool_removal", body([
        {"role": "user", "content": "a"},
        {"role": "system", "content": [{"type": "tool_removal", "tool": {"type": "tool_reference", "name": "get_weather"}}]},
        {"role": "user", "content": "b"}], tools=[weather, clock, search])
    yield "tool_removal_then_readdition", body([
        {"role": "user", "content": "a"},
        {"role": "system", "content": [{"type": "tool_removal", "tool": {"type": "tool_reference", "name": "get_weather"}},
                                       {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": search}}]},
        {"role": "user", "content": "b"},
        {"role": "system", "content": [text("Weather is back."),
                                       {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "get_weather"}},
                                       {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": dict(
                                           clock, description="Redefined clock.")}}]},
        {"role": "user", "content": "c"}], tools=[weather, clock], system="Top.")
    yield "tool_addition_undeclared", body([
        {"role": "system", "content": [{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "missing"}}]},
        {"role": "user", "content": "x"}], tools=[weather])
    yield "tool_removal_without_tools", body([
        {"role": "system", "content": [{"type": "tool_removal", "tool": {"type": "tool_reference", "name": "clock"}}]},
        {"role": "user", "content": "x"}])

    # Thinking, output config and the rest of the request.
    yield "thinking_enabled", body(hi, max_tokens=4096, thinking={"type": "enabled", "budget_tokens": 2048})
    yield "thinking_disabled", body(hi, thinking={"type": "disabled"})
    yield "thinking_adaptive", body(hi, thinking={"type": "adaptive", "display": "summarized"})
    yield "output_config_effort", body(hi, output_config={"effort": "xhigh"})
    yield "output_config_effort_thinking_disabled", body(hi, output_config={"effort": "high"}, thinking={"type": "disabled"})
    yield "output_config_effort_thinking_enabled", body(hi, max_tokens=8192, output_config={"effort": "low"},
                                                        thinking={"type": "enabled", "budget_tokens": 1024})
    yield "output_config_format", body(hi, output_config={"format": {"type": "json_schema", "schema": {
        "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}})
    yield "chat_template_kwargs", body(hi, chat_template_kwargs={"enable_thinking": False, "custom": [1, "two", None]},
                                       thinking={"type": "disabled"})
    yield "stream_true", body(hi, stream=True)
    yield "stream_false", body(hi, stream=False)
    yield "metadata_user_id_legacy", body(hi, metadata={"user_id": "user_" + "3f9a" * 16 +
                                                         "_account_6c1f5e0a-2b7d-4e9a-9c3b-8d2f1a0b7e64"
                                                         "_session_0b4e8c2d-91f7-4a36-b5d0-7e2c9f13a8b5"})
    yield "metadata_user_id_json", body(hi, metadata={"user_id": json.dumps({
        "device_id": "5d2c" * 16, "account_uuid": "", "session_id": "a7e3c1f0-4b2d-4c8e-9f61-0d5b3e7a2c94"},
        separators=(",", ":"))})
    yield "sampling_and_stop_sequences", body(hi, temperature=0.7, top_p=0.9, top_k=40, stop_sequences=["\n\nHuman:", "END"])
    yield "lax_types", body(hi, max_tokens=64.0, stream="true")
    yield "prefill_leg_budget_over_max_tokens", body(hi, max_tokens=1, thinking={"type": "enabled", "budget_tokens": 2048},
                                                     kv_transfer_params={"do_remote_decode": True})
    yield "unknown_fields_ignored", body([{"role": "user", "content": [text("hi", citations=None)], "id": "msg_1"}],
                                         context_management={"edits": []}, service_tier="auto", return_mm_kwargs=False)
    yield "claude_code_session", claude_code_session()
    yield "raw_tool_use_input_literals", Raw(
        '{"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": '
        '[{"type": "tool_use", "id": "toolu_raw", "name": "f", "input": {"a": 1e5, "b": 1E+2, "c": 0.10, "d": -0, '
        '"e": -0.0, "f": 1.0e0, "g": 1e400, "h": 123456789012345678901234567890, "i": 5e-324, "j": 2.50, "k": 1.5E-7, '
        '"dup": 1, "l": "\\u00e9\\ud83d\\ude00 lone \\ud800", "dup": 2, "m": 1e16, "n": 1e15, "o": 0.0001, '
        '"p": 0.00001}}]}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_raw", '
        '"content": "ok"}]}]}')

    # Bodies vLLM rejects.
    yield "invalid_missing_max_tokens", {"model": "m", "messages": hi}
    yield "invalid_max_tokens_zero", body(hi, max_tokens=0)
    yield "invalid_model_empty", body(hi, model="")
    yield "invalid_model_missing", {"max_tokens": 10, "messages": hi}
    yield "invalid_unknown_block_type", body([{"role": "user", "content": [{"type": "document", "source": {}}]}])
    yield "invalid_role_tool", body([{"role": "tool", "content": "x"}])
    yield "invalid_role_developer", body([{"role": "developer", "content": "x"}])
    yield "invalid_content_null", body([{"role": "user", "content": None}])
    yield "invalid_content_missing", body([{"role": "user"}])
    yield "invalid_text_not_string", body([{"role": "user", "content": [{"type": "text", "text": 5}]}])
    yield "invalid_thinking_budget_small", body(hi, thinking={"type": "enabled", "budget_tokens": 1000})
    yield "invalid_thinking_budget_not_below_max_tokens", body(hi, max_tokens=2048,
                                                                thinking={"type": "enabled", "budget_tokens": 2048})
    yield "invalid_thinking_type", body(hi, thinking={"type": "auto"})
    yield "invalid_effort", body(hi, output_config={"effort": "none"})
    yield "invalid_tool_without_input_schema", body(hi, tools=[{"name": "t", "description": "d"}])
    yield "invalid_tool_input_schema_list", body(hi, tools=[{"name": "t", "input_schema": []}])
    yield "invalid_tool_choice_tool_without_name", body(hi, tools=[weather], tool_choice={"type": "tool"})
    yield "invalid_tool_use_input_list", body([{"role": "assistant", "content": [tool_use("toolu_z", "f", [1, 2])]}])
    yield "invalid_tool_result_content_int", body([{"role": "user", "content": [tool_result("toolu_z", 7)]}])
    yield "invalid_tool_result_content_string_items", body([{"role": "user", "content": [tool_result("toolu_z", ["a"])]}])
    yield "invalid_tool_addition_in_user", body([{"role": "user", "content": [
        {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "clock"}}]}], tools=[clock])
    yield "invalid_tool_addition_in_top_system", body(hi, tools=[clock], system=[
        {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "clock"}}])
    yield "invalid_tool_addition_without_tool", body([{"role": "system", "content": [{"type": "tool_addition"}]}])
    yield "invalid_tool_removal_definition", body([{"role": "system", "content": [
        {"type": "tool_removal", "tool": {"type": "tool_definition", "definition": clock}}]}])
    yield "invalid_stop_sequences_too_many", body(hi, stop_sequences=["a", "b", "c", "d", "e"])
    yield "invalid_cache_salt_empty", body(hi, cache_salt="")
    yield "invalid_messages_not_list", body("Hi")


def claude_code_session():
    """A coding agent's fourth request: billing line, a long cached system
    prompt, ten tools, and several tool-use turns with reminders."""
    def schema(props, required=(), **kw):
        s = {"type": "object", "properties": props}
        if required:
            s["required"] = list(required)
        s.update(kw)
        s["additionalProperties"] = False
        s["$schema"] = "http://json-schema.org/draft-07/schema#"
        return s
    string = {"type": "string"}
    tools = [
        {"name": "Task", "description": "Start a sub-agent for a self-contained, multi-step piece of work.",
         "input_schema": schema({"description": dict(string, description="A few words naming the job"),
                                 "prompt": dict(string, description="What the sub-agent should do"),
                                 "subagent_type": string}, ["description", "prompt", "subagent_type"])},
        {"name": "Bash", "description": "Run a shell command in a persistent session.\n\nQuote paths with spaces.",
         "input_schema": schema({"command": string, "timeout": {"type": "number", "description": "Milliseconds, at most 600000"},
                                 "description": string, "run_in_background": {"type": "boolean"}}, ["command"])},
        {"name": "Glob", "description": "Match file paths against a glob pattern.",
         "input_schema": schema({"pattern": string, "path": string}, ["pattern"])},
        {"name": "Grep", "description": "Search file contents with a regular expression.",
         "input_schema": schema({"pattern": string, "path": string, "glob": string,
                                 "output_mode": {"type": "string", "enum": ["content", "files_with_matches", "count"]},
                                 "-i": {"type": "boolean"}, "-n": {"type": "boolean"}, "head_limit": {"type": "number"}},
                                ["pattern"])},
        {"name": "Read", "description": "Read a file from the local filesystem.",
         "input_schema": schema({"file_path": string, "offset": {"type": "number"}, "limit": {"type": "number"}}, ["file_path"])},
        {"name": "Edit", "description": "Replace an exact string in a file.",
         "input_schema": schema({"file_path": string, "old_string": string, "new_string": string,
                                 "replace_all": {"type": "boolean", "default": False}},
                                ["file_path", "old_string", "new_string"])},
        {"name": "Write", "description": "Write a whole file.",
         "input_schema": schema({"file_path": string, "content": string}, ["file_path", "content"])},
        {"name": "TodoWrite", "description": "Keep a structured task list for this session.",
         "input_schema": schema({"todos": {"type": "array", "items": {"type": "object", "properties": {
             "content": {"type": "string", "minLength": 1},
             "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]},
             "activeForm": {"type": "string", "minLength": 1}},
             "required": ["content", "status", "activeForm"], "additionalProperties": False}}}, ["todos"])},
        {"name": "WebFetch", "description": "Fetch a URL and answer a question about it.",
         "input_schema": schema({"url": dict(string, format="uri"), "prompt": string}, ["url", "prompt"])},
        {"name": "ExitPlanMode", "description": "Leave plan mode once the plan is ready.",
         "input_schema": schema({"plan": string}, ["plan"])},
    ]
    system = [
        text(BILLING),
        text("You are a command-line agent that helps with software engineering tasks.", cache_control=EPH),
        text("\nKeep answers short. Use the tools to read before you edit. Never invent file paths.\n\n"
             "# Tone\nPlain, direct, no emoji unless asked.\n\n# Tasks\n1. Understand the request.\n"
             "2. Look at the code.\n3. Change it.\n4. Run the tests.\n\n"
             "<env>\nWorking directory: /home/dev/proj\nIs directory a git repo: Yes\nPlatform: linux\n"
             "Today's date: 2026-03-02\n</env>\n", cache_control=EPH)]
    reminder = ("<system-reminder>\nAs you answer the user's questions, you can use the following context:\n"
                "# claudeMd\nContents of /home/dev/proj/CLAUDE.md (project instructions):\n\n"
                "Run `go test ./...` before committing.\n\n"
                "      IMPORTANT: this context may or may not be relevant to your tasks.\n</system-reminder>\n")
    messages = [
        {"role": "user", "content": [text(reminder), text("The parser test fails on empty input. Fix it.", cache_control=EPH)]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Find the parser test first.", "signature": "EqQBCkYIBxgCKkBsig"},
            text("I'll find the test."),
            tool_use("toolu_01ABC", "Grep", {"pattern": "func TestParse", "path": "/home/dev/proj",
                                             "output_mode": "files_with_matches"}),
            tool_use("toolu_01ABD", "TodoWrite", {"todos": [
                {"content": "Reproduce the failure", "status": "in_progress", "activeForm": "Reproducing the failure"},
                {"content": "Fix empty input", "status": "pending", "activeForm": "Fixing empty input"}]})]},
        {"role": "user", "content": [
            tool_result("toolu_01ABC", "Found 1 file\n/home/dev/proj/parse/parse_test.go"),
            tool_result("toolu_01ABD", "Todos have been modified successfully."),
            text("<system-reminder>\nThe TodoWrite tool hasn't been used recently.\n</system-reminder>")]},
        {"role": "assistant", "content": [
            tool_use("toolu_01ABE", "Read", {"file_path": "/home/dev/proj/parse/parse.go"}),
            tool_use("toolu_01ABF", "Bash", {"command": "cd /home/dev/proj && go test ./parse/ 2>&1 | tail -20",
                                             "description": "Run the parser tests", "timeout": 120000})]},
        {"role": "user", "content": [
            tool_result("toolu_01ABE", [text("     1\tpackage parse\n     2\t\n     3\tfunc Parse(s string) []string {\n"
                                             "     4\t\treturn strings.Split(s, \",\")\n     5\t}\n")]),
            tool_result("toolu_01ABF", "--- FAIL: TestParse/empty (0.00s)\n    parse_test.go:14: got [\"\"], want []\nFAIL",
                        is_error=True)]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "strings.Split returns [\"\"] for \"\"; return nil early.", "signature": "Ep8BCkYI"},
            tool_use("toolu_01ABG", "Edit", {"file_path": "/home/dev/proj/parse/parse.go",
                                             "old_string": "\treturn strings.Split(s, \",\")",
                                             "new_string": "\tif s == \"\" {\n\t\treturn nil\n\t}\n"
                                                           "\treturn strings.Split(s, \",\")"})]},
        {"role": "user", "content": [
            tool_result("toolu_01ABG", "The file /home/dev/proj/parse/parse.go has been updated.", cache_control=EPH)]},
    ]
    return {"model": "claude-sonnet-4-5-20250929", "max_tokens": 32000, "messages": messages, "system": system,
            "tools": tools,
            "metadata": {"user_id": "user_" + "9e1d" * 16 + "_account__session_3c5a7e91-0f2b-4d68-a1c4-5b9e2d7f0a36"},
            "temperature": 1, "stream": True, "thinking": {"type": "enabled", "budget_tokens": 31999}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm", required=True, help="the vllm package directory of an unpacked wheel")
    ap.add_argument("--out", required=True)
    ap.add_argument("--vllm-version", default="0.33.0", help="the wheel's version, recorded in the file")
    a = ap.parse_args()
    conv, model = build(a.vllm)
    seen = set()
    cases = []
    for name, b in bodies():
        if name in seen:
            raise SystemExit("duplicate case name " + name)
        seen.add(name)
        cases.append(convert(conv, model, name, b))
    raw = {}
    for i, c in enumerate(cases):
        if isinstance(c["body"], Raw):
            raw['"@raw-body-%d@"' % i] = c["body"]
            c["body"] = "@raw-body-%d@" % i
    out = json.dumps({"vllm_version": a.vllm_version, "cases": cases}, indent=1, ensure_ascii=False)
    for k, v in raw.items():
        out = out.replace(k, v)
    with open(a.out, "w") as f:
        f.write(out + "\n")
    print("%d cases (%d invalid, %d errors) -> %s" % (
        len(cases), sum("invalid" in c for c in cases), sum("error" in c for c in cases), a.out))


if __name__ == "__main__":
    main()
