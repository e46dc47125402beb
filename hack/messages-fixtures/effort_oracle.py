#!/usr/bin/env python3
"""Runs vLLM's own DisabledThinkingEffortResolver._probe over chat templates:
the reasoning_effort vLLM's /v1/messages sends to the template for a body
with thinking.type=disabled.

vLLM renders the chat [{"role": "user", "content": "Hi"}] (generation prompt
on) once with reasoning_effort "none" and once with each Anthropic effort
("low" to "max"). If "none" fails to render, or renders the same prompt as
one of the efforts (the template ignores it, or treats it as an effort), it
uses "low"; otherwise "none".

The probe, the template-kwarg building (ChatCompletionRequest.
build_chat_params, ChatParams, merge_kwargs: reasoning_effort goes in as
is, with enable_thinking = effort != "none" unless the request sets it) and
the rendering (safe_apply_chat_template, its kwarg filter and the content
format detection that decides between "Hi" and [{"type": "text", ...}]) are
loaded from a vLLM wheel's source (see gen.py next to this file for why) and
run with HuggingFace transformers' apply_chat_template. Only the glue
between them (the online renderer's render_chat) is written here. Nothing
of vLLM's is copied into this repository.

Family templates are rendered with their own tokenizer; --corpus templates
with the --host family's tokenizer (its bos/eos tokens; the outcome only
depends on differences between renders, or on a render failing).

Writes:
  --out-family FILE  {"<family>": "none" | "low"} (the template vLLM uses
                     by default: the string one, or the one named "default")
  --out FILE         {"<source>": "none" | "low"} for the --corpus templates
                     ({"<name>": template}) and the family ones.

Usage (transformers 5.x, tokenizers, jinja2):
  python3 hack/messages-fixtures/effort_oracle.py --vllm /tmp/vllm-src/vllm \\
      --tokenizers .cache/tokenizers --out-family pkg/tokenize/testdata/disabled_thinking_effort.json \\
      [--corpus templates.json --out all.json]
"""

import argparse
import asyncio
import inspect
import json
import logging
import os
import sys
import types
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal, get_args, overload

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox
from transformers import AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen import load  # noqa: E402
from merge_oracle import family_templates  # noqa: E402


class VLLMValidationError(ValueError):
    pass


class ChatTemplateResolutionError(ValueError):
    pass


def build(vllm):
    """The probe class and the render helpers, each file's definitions in a
    module of their own."""
    src = lambda *p: os.path.join(vllm, *p)  # noqa: E731
    base = {"Any": Any, "Literal": Literal, "Callable": Callable, "logger": logging.getLogger("vllm"),
            "lru_cache": lru_cache, "inspect": inspect}
    fu = load(src("utils", "func_utils.py"), {"_supports_kw", "supports_kw"}, "_vllm_func_utils", base)
    pr = load(src("renderers", "params.py"), {"merge_kwargs", "map_reasoning_effort", "recursively_merge_kwargs",
                                              "ChatParams"}, "_vllm_renderers_params",
              dict(base, dataclass=dataclass, field=field,
                   # Only ever called with None here (no media kwargs anywhere).
                   merge_media_io_kwargs=lambda defaults, overrides: overrides or defaults))
    cc = load(src("entrypoints", "openai", "chat_completion", "protocol.py"), {"ChatCompletionRequest.build_chat_params"},
              "_vllm_chat_completion_protocol",
              dict(base, ChatParams=pr.ChatParams, map_reasoning_effort=pr.map_reasoning_effort,
                   merge_kwargs=pr.merge_kwargs, ChatTemplateContentFormatOption=Any))

    def resolve_chat_template(tokenizer, chat_template, tools, *, model_config):
        # vLLM's first choice, which is what applies: the template is always given.
        if chat_template is not None:
            return tokenizer.get_chat_template(chat_template, tools=tools)
        return None

    hf = load(src("renderers", "hf.py"), {
        "_is_var_access", "_is_attr_access", "_is_var_or_elems_access", "_attr_dotted_name",
        "_iter_nodes_assign_var_or_elems", "_iter_nodes_assign_messages_item", "_iter_nodes_assign_content_item",
        "_try_extract_ast", "_detect_content_format", "_detect_developer_role_support", "_convert_developer_to_system",
        "_consolidate_system_messages", "AssistantTracker", "_resolve_chat_template_kwargs",
        "_cached_resolve_chat_template_kwargs", "_get_hf_base_chat_template_params", "resolve_chat_template_kwargs",
        "_template_error_reason", "safe_apply_chat_template"}, "_vllm_renderers_hf",
        dict(base, jinja2=jinja2, deque=deque, overload=overload, supports_kw=fu.supports_kw,
             resolve_chat_template=resolve_chat_template, VLLMValidationError=VLLMValidationError,
             ChatTemplateResolutionError=ChatTemplateResolutionError))
    proto = load(src("entrypoints", "anthropic", "protocol.py"), {"AnthropicEffort", "AnthropicDisabledThinkingEffort"},
                 "_vllm_anthropic_protocol_efforts", base)
    serving = load(src("entrypoints", "anthropic", "serving.py"), {"DisabledThinkingEffortResolver._probe"},
                   "_vllm_anthropic_serving_effort",
                   dict(base, get_args=get_args, AnthropicEffort=proto.AnthropicEffort,
                        AnthropicDisabledThinkingEffort=proto.AnthropicDisabledThinkingEffort))
    return serving.DisabledThinkingEffortResolver, cc.ChatCompletionRequest.build_chat_params, pr.merge_kwargs, hf


def prober(vllm):
    resolver, build_chat_params, merge_kwargs, hf = build(vllm)

    class Probe(resolver):
        """vLLM's resolver with its render step done by transformers, the way
        the online renderer does it for a plain HF tokenizer."""

        def __init__(self, tokenizer, template):
            self.tokenizer, self.template = tokenizer, template

        async def _render_probe_prompt(self, effort):
            # ChatCompletionRequest(messages=[...], reasoning_effort=effort): the fields
            # build_chat_params reads, at the request model's defaults.
            request = types.SimpleNamespace(
                messages=[{"role": "user", "content": "Hi"}], reasoning_effort=effort, add_generation_prompt=True,
                continue_final_message=False, documents=None, chat_template=None, chat_template_kwargs=None,
                media_io_kwargs=None, tool_choice="none", tools=None, response_format=None)
            try:
                # OnlineRenderer.preprocess_chat, no tools, no server defaults.
                defaults = merge_kwargs(None, dict(tools=None, tokenize=False))
                params = build_chat_params(request, self.template, "auto", reasoning_effort_map=None).with_defaults(
                    defaults, default_media_io_kwargs=None, default_mm_processor_kwargs=None)
                # HfRenderer.render_messages: the content format, then the template.
                fmt = "string" if params.chat_template is None else hf._detect_content_format(
                    params.chat_template, default="string")
                content = "Hi" if fmt == "string" else [{"type": "text", "text": "Hi"}]
                text = hf.safe_apply_chat_template(None, self.tokenizer, [{"role": "user", "content": content}],
                                                   **params.get_apply_chat_template_kwargs())
            except Exception:
                return None
            return self.tokenizer.encode(text, add_special_tokens=False), text

    return Probe


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm", required=True, help="the vllm package directory of an unpacked wheel")
    ap.add_argument("--tokenizers", required=True, help="a directory of <family>/tokenizer.json + tokenizer_config.json")
    ap.add_argument("--corpus", help="a JSON object of more templates, by name")
    ap.add_argument("--host", default="llama3", help="the family whose tokenizer renders the --corpus templates")
    ap.add_argument("--out-family", required=True)
    ap.add_argument("--out")
    a = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    Probe = prober(a.vllm)
    toks = {}

    def tok(fam):
        if fam not in toks:
            toks[fam] = AutoTokenizer.from_pretrained(os.path.join(a.tokenizers, fam))
        return toks[fam]

    every, family = {}, {}
    if a.corpus:
        with open(a.corpus) as f:
            for name, t in json.load(f).items():
                every[name] = asyncio.run(Probe(tok(a.host), t)._probe())
    for fam, named in family_templates(a.tokenizers).items():
        for tname, t in named.items():
            got = asyncio.run(Probe(tok(fam), t)._probe())
            every[fam + "/" + tname] = got
            if tname == "default" or len(named) == 1:
                family[fam] = got
    with open(a.out_family, "w") as f:
        json.dump(family, f, indent=1, sort_keys=True)
        f.write("\n")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(every, f, indent=1, ensure_ascii=False)
            f.write("\n")
    print("%d templates: %d none, %d low" % (len(every), sum(v == "none" for v in every.values()),
                                             sum(v == "low" for v in every.values())))
    print(json.dumps(family))


if __name__ == "__main__":
    main()
