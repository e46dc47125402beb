#!/usr/bin/env python3
"""Generates pkg/tokenize/testdata/jinja_diff_cases.json: small templates,
each one expression printed by an output tag, rendered by Jinja2 (the
sandboxed environment HuggingFace renders chat templates in, with its
tojson) on one value decoded from JSON. TestJinjaDifferential renders them
with the Go engine as a chat template is compiled and checks that every
case renders as Jinja2 does, is refused, or is in the list of the engine's
known divergences (testdata/jinja_diff_known.txt).

Usage: python3 hack/tokenizer-fixtures/gen_jinja_diff.py (jinja2 3.1.x)
"""
import itertools
import json
import os

import jinja2
import jinja2.sandbox

env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


env.filters["tojson"] = tojson

VALUES = ["null", "2.0", "1", '"a b"', "\"it's\"", '[1, "b", null]', '{"k": null, "j": 2.5}', "true",
          "123456789012345678901234567890", "1e-05", '""', "[]", '"user_id \\u00df \\u03a3\\u0391\\u03a3"']
EXPRS = ["x", "x|upper", "x|lower", "x|title", "x|capitalize", "x|string", "x|trim", "x|length", "x|first", "x|last",
         "x|default('D')", "x|default('D', true)", "x|join('-')", "x|list", "x|replace('a', 'Z')", "x|indent(2)",
         "'%s'|format(x)", "'{}'.format(x)", "x ~ '|'", "'<' + x|string + '>'", "x|tojson", "x is none", "x is string",
         "x is number", "x is mapping", "x is iterable", "x|int", "x|float", "x|abs", "x|round", "x|sort", "x|unique|list",
         "x|items|list", "x|dictsort", "x|count", "x|wordcount", "x|truncate(3)", "x|e", "x|safe", "x|lower|upper",
         "[x]", "{'k': x}", "(x, 1)", "x|max", "x|min", "x|sum", "x.strip()", "x.upper()", "x.split(' ')",
         "x.startswith('a')", "x.items()|list", "x.keys()|list", "x.get('k')", "x[0]", "x['k']", "x[1:]",
         "x|select|list", "x|reject|list", "x|map('string')|list", "x in ['a b', 1]", "not x", "x and 'y'", "x or 'y'",
         "x == none", "x == 2", "x|batch(2)|list", "x|slice(2)|list", "'a' ~ x ~ 'b'", "x|selectattr('k')|list"]

cases = []
for v, e in itertools.product(VALUES, EXPRS):
    src = "{{ " + e + " }}"
    try:
        want = env.from_string(src).render(x=json.loads(v))
    except Exception as ex:  # noqa: BLE001 - any failure is what Python does
        want = "ERR:" + type(ex).__name__
    cases.append({"src": src, "x": v, "want": want})

out = os.path.join(os.path.dirname(__file__), "..", "..", "pkg", "tokenize", "testdata", "jinja_diff_cases.json")
with open(out, "w") as f:
    json.dump({"jinja2": jinja2.__version__, "cases": cases}, f, ensure_ascii=False, indent=0)
print(len(cases), "cases")
