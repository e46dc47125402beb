#!/usr/bin/env python3
"""Runs vLLM's own _detect_merge_inline_system over chat templates: whether
vLLM's /v1/messages merges the system messages found inside "messages" into
the leading system prompt for a model with that template.

vLLM decides this once per server by rendering a [system, user, system, user]
conversation with the template in a bare jinja2 sandbox: a template that
raises a jinja2.TemplateError there (e.g. "System message must be at the
beginning") gets the merge, and so does a missing template. An exception of
any other type is not caught by vLLM and would stop the server; such
templates are reported as "non-template error: ...".

The function is loaded from a vLLM wheel's source (see gen.py next to this
file for why); nothing of vLLM's is copied into this repository.

Writes:
  --out-family FILE  {"<family>": {"<template name>": bool}} for the family
                     tokenizers (a tokenizer_config.json whose chat_template
                     is a string gives the name "default"; a list of
                     {name, template} gives each name);
  --out FILE         {"<source>": bool | "non-template error: ..."} for those
                     and for each template of --corpus ({"<name>": template}),
                     the family ones named "<family>/<template name>".

Usage:
  python3 hack/messages-fixtures/merge_oracle.py --vllm /tmp/vllm-src/vllm \\
      --tokenizers .cache/tokenizers --out-family pkg/tokenize/testdata/merge_inline_system.json \\
      [--corpus templates.json --out all.json]
"""

import argparse
import json
import os
import sys
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen import load  # noqa: E402


def family_templates(tokenizers):
    """{family: {template name: template text or None}} from each
    <family>/tokenizer_config.json (or its chat_template.jinja)."""
    out = {}
    for fam in sorted(os.listdir(tokenizers)):
        cfg_path = os.path.join(tokenizers, fam, "tokenizer_config.json")
        if not os.path.isfile(cfg_path):
            continue
        with open(cfg_path) as f:
            t = json.load(f).get("chat_template")
        jinja_path = os.path.join(tokenizers, fam, "chat_template.jinja")
        if t is None and os.path.isfile(jinja_path):
            with open(jinja_path) as f:
                t = f.read()
        if isinstance(t, list):
            out[fam] = {e["name"]: e["template"] for e in t}
        else:
            out[fam] = {"default": t}
    return out


def sources(corpus, tokenizers):
    """(source name, family or None, template name, template) for every template asked for."""
    if corpus:
        with open(corpus) as f:
            for name, t in json.load(f).items():
                yield name, None, None, t
    for fam, named in family_templates(tokenizers).items():
        for tname, t in named.items():
            yield fam + "/" + tname, fam, tname, t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vllm", required=True, help="the vllm package directory of an unpacked wheel")
    ap.add_argument("--tokenizers", required=True, help="a directory of <family>/tokenizer_config.json")
    ap.add_argument("--corpus", help="a JSON object of more templates, by name")
    ap.add_argument("--out-family", required=True)
    ap.add_argument("--out")
    a = ap.parse_args()
    serving = load(os.path.join(a.vllm, "entrypoints", "anthropic", "serving.py"),
                   {"AnthropicServingMessages._detect_merge_inline_system"}, "_vllm_anthropic_serving_merge",
                   {"jinja2": jinja2, "Any": Any})
    detect = serving.AnthropicServingMessages._detect_merge_inline_system
    every, family = {}, {}
    for name, fam, tname, t in sources(a.corpus, a.tokenizers):
        try:
            got = detect(t)
        except Exception as e:  # vLLM catches jinja2.TemplateError only
            got = "non-template error: %s: %s" % (type(e).__name__, e)
        every[name] = got
        if fam is not None:
            if not isinstance(got, bool):
                raise SystemExit("%s: %s" % (name, got))
            family.setdefault(fam, {})[tname] = got
    with open(a.out_family, "w") as f:
        json.dump(family, f, indent=1, sort_keys=True)
        f.write("\n")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(every, f, indent=1, ensure_ascii=False)
            f.write("\n")
    merged = sum(v is True for v in every.values())
    other = {k: v for k, v in every.items() if not isinstance(v, bool)}
    print("%d templates: %d merge, %d do not, %d raise something else" % (
        len(every), merged, sum(v is False for v in every.values()), len(other)))
    for k, v in other.items():
        print("  %s: %s" % (k, v))


if __name__ == "__main__":
    main()
