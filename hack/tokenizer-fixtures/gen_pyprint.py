import json, jinja2, jinja2.sandbox
env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
X = r'''{"none": null, "t": true, "f": 2.0, "big": 123456789012345678901234567890, "tiny": 1e-05,
 "parts": [{"type": "text", "text": "You're \"here\"\tnow\n"}],
 "s": "it's", "u": "\u00e9\u00a0\u2028\ud83d\ude80\u007f\u001c\u00ad\\",
 "mixed": [null, 1, 2.5, "a", [true, false], {"k": null}],
 "tools": [{"function": {"name": "get", "description": null}}, {"function": {"name": "put", "description": "Put it"}}],
 "d": {"b": {"c": [1, "x"]}, "a": null}}'''
cases = [
 "[{{ x.none }}]", "{{ x.t }}|{{ x.tiny }}", "{{ x.f }}", "{{ x.big }}|{{ x.f|string }}", "{{ [x.f] }}", "{{ x.parts }}", "{{ x.parts[0].text|trim }}|{{ x.parts|trim }}",
 "{{ x.s }}|{{ [x.s] }}|{{ [x.parts[0].text] }}", "{{ [x.u] }}", "{{ x.mixed }}", "{{ x.mixed|string }}|{{ x.none|string }}",
 "{{ x.mixed|join(', ') }}", "{{ x.tools|map(attribute='function')|join('/', attribute='description') }}",
 "{{ x.d }}|{{ x.d|join(',') }}|{{ 'abc'|join('-') }}", "{{ 1.5 * 2 }}|{{ 7 / 2 }}|{{ 10 / 5 }}", "<{{ x.missing }}>",
 "a {{- x.none -}} b", "{% for t in x.tools %}{description:<escape>{{- t['function']['description'] -}}<escape>}{% endfor %}",
 "{{ 'x' + x.s + 'y' }}", "{{ x.none if x.t }}|{{ x.none if not x.t }}",
 "{{ 'a' ~ x.none ~ x.tiny ~ x.parts ~ x.missing }}", "{{ 'a' ~ x.f ~ x.big }}", "{{ x.none ~ 1 ~ x.t }}", "{{ 'a' ~ x.s + 'b' }}",
 "{% set s = 'n=' ~ x.none %}{{ s }}",
]
out = []
for c in cases:
    try:
        r = env.from_string(c).render(x=json.loads(X))
    except Exception as e:
        r = "ERR:" + type(e).__name__
    out.append((c, r))
# The case filters, each on one value of its own (str() of it, Python's
# full case mapping, Jinja2's word breaks for title).
case_values = ["user_id", "it's a test", "hello-world foo(bar) [x] <y>", "\u00c9COLE stra\u00dfe \u01c6 \ufb01", "\u00df",
               "\u0130stanbul", "\u03a3\u0391\u03a3 \u039f\u0394\u039f\u03a3", "mIxEd CaSe", "a\tb\nc\u001fd", "x1y 2z", "",
               "  lead", "o'neil mc'donald", None, 1.5, 7, True, ["a", 1]]
per_value = []
for v in case_values:
    for f in ["upper", "lower", "capitalize", "title"]:
        src = "{{ x|" + f + " }}"
        per_value.append((src, json.dumps(v), env.from_string(src).render(x=v)))
json.dump({"data": X, "cases": out, "per_value": per_value}, open("pyprint_cases.json", "w"), indent=1, ensure_ascii=False)
for c, r in out: print(repr(c), "=>", repr(r))
