package tokenize

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"
)

// TestPrintedAsPython renders, through compileTemplate as a chat template
// is compiled, the templates of testdata/pyprint_cases.json, whose outputs
// Jinja2 3.1.6 gave (hack/tokenizer-fixtures/gen_pyprint.py, HuggingFace's
// sandboxed environment): None, floats, lists and dicts printed by output
// tags, '~' and the string, join and trim filters, and the case filters. A case printing x.f
// (2.0) or x.big (beyond int64), numbers the engine carries behind
// pyNumMark, must be refused instead (see pyPrint).
func TestPrintedAsPython(t *testing.T) {
	raw, err := os.ReadFile("testdata/pyprint_cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Data     string      `json:"data"`
		Cases    [][2]string `json:"cases"`
		PerValue [][3]string `json:"per_value"`
	}
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatal(err)
	}
	x, err := jsonValue(json.RawMessage(ref.Data))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range ref.Cases {
		src, want := c[0], c[1]
		tmpl, err := compileTemplate(src)
		if err != nil {
			t.Errorf("%s: %v", src, err)
			continue
		}
		got, err := renderSafe(tmpl, map[string]jinja.Value{"x": x}, 0)
		if err == nil && strings.Contains(got, pyMarkRune) {
			err = errNumberLeak
		}
		if strings.Contains(src, "x.f") || strings.Contains(src, "x.big") {
			if !errors.Is(err, ErrUnsupported) {
				t.Errorf("%s: %q, %v; want ErrUnsupported", src, got, err)
			}
			continue
		}
		if strings.HasPrefix(want, "ERR:") {
			if err == nil {
				t.Errorf("%s: rendered %q where Jinja2 raised %s", src, got, want)
			}
			continue
		}
		if err != nil || got != want {
			t.Errorf("%s:\n got %q, %v\nwant %q", src, got, err, want)
		}
	}
	// upper, lower, capitalize and title, each on a value of its own.
	if len(ref.PerValue) == 0 {
		t.Fatal("no per-value cases")
	}
	for _, c := range ref.PerValue {
		src, raw, want := c[0], c[1], c[2]
		v, err := jsonValue(json.RawMessage(raw))
		if err != nil {
			t.Fatal(err)
		}
		tmpl, err := compileTemplate(src)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := renderSafe(tmpl, map[string]jinja.Value{"x": v}, 0); err != nil || got != want {
			t.Errorf("%s with x = %s:\n got %q, %v\nwant %q", src, raw, got, err, want)
		}
	}
}

// TestPrintTagsRewrite: which tags printTags routes through kvroute_print.
func TestPrintTagsRewrite(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{`a{{ x }}b`, `a{{ (x)|kvroute_print }}b`},
		{`{{- m.content -}}`, `{{- (m.content)|kvroute_print -}}`},
		{`{{ 'lit' }}{{ "q}}" }}`, `{{ 'lit' }}{{ "q}}" }}`},
		{`{{ x|trim }}{{ x | tojson(indent=2) }}{{ xs|join(', ') }}`, `{{ x|trim }}{{ x | tojson(indent=2) }}{{ xs|join(', ') }}`},
		// The filter is not the last operation: printed.
		{`{{ x|trim if c else y }}`, `{{ (x|trim if c else y)|kvroute_print }}`},
		// '~' at the top level: one printed tag per operand, unless '+' or
		// '-' (looser than '~' in Jinja2) or anything looser is there too.
		{`{{- x|trim ~ y -}}`, `{{- x|trim }}{{ (y)|kvroute_print -}}`},
		{`{{ '<' ~ n ~ '>' }}`, `{{ '<' }}{{ (n)|kvroute_print }}{{ '>' }}`},
		{`{{ a ~ b + c }}{{ a ~ b if c }}`, `{{ (a ~ b + c)|kvroute_print }}{{ (a ~ b if c)|kvroute_print }}`},
		{`{{ x|length }}`, `{{ (x|length)|kvroute_print }}`},
		{`{{ x|replace('a', ')')|first }}`, `{{ (x|replace('a', ')')|first)|kvroute_print }}`},
		{`{{ x|replace("|", 'b') }}`, `{{ x|replace("|", 'b') }}`},
		{`{{ f(a|trim) }}`, `{{ (f(a|trim))|kvroute_print }}`},
		// A string method's result, and a sum with a string literal.
		{`{{ x.strip('\n') }}{{ m.content + '\n\n' }}`, `{{ x.strip('\n') }}{{ m.content + '\n\n' }}`},
		{`{{ x.strip()[0] }}{{ x.split(',') }}{{ x.strip }}{{ a + b }}`, `{{ (x.strip()[0])|kvroute_print }}{{ (x.split(','))|kvroute_print }}{{ (x.strip)|kvroute_print }}{{ (a + b)|kvroute_print }}`},
		// A set statement's '~' chain keeps its chain, its operands printed.
		{`{%- set ns.x = ns.x ~ ',' ~ i -%}{% set y = a ~ b + c %}{% set z %}{{ q }}{% endset %}`,
			`{%- set ns.x = (ns.x)|kvroute_print ~ ',' ~ (i)|kvroute_print -%}{% set y = a ~ b + c %}{% set z %}{{ (q)|kvroute_print }}{% endset %}`},
		// Other statements, comments and raw blocks are not touched.
		{`{% set y = x %}{# {{ x }} #}`, `{% set y = x %}{# {{ x }} #}`},
		{`{% raw %}{{ x }}{% endraw %}{{ y }}`, `{% raw %}{{ x }}{% endraw %}{{ y }}`},
	} {
		if got := printTags(c.src); got != c.want {
			t.Errorf("printTags(%q)\n got %q\nwant %q", c.src, got, c.want)
		}
	}
}

// FuzzPrintTags: on data the engine already prints as Python does
// (strings without quotes or escapes, integers, booleans, and containers of
// them), a template rewritten by printTags renders what it rendered
// before, so the rewrite changes no expression's meaning; or it refuses to
// print what Python would print as an object's name (a macro).
func FuzzPrintTags(f *testing.F) {
	srcs, _ := chatTemplateSources(f)
	for _, src := range srcs {
		f.Add(src)
	}
	for _, s := range []string{
		`a{{- x -}}b{{ x|trim if c else y }}`, `{{ x ~ y|trim }}{{ x.strip() + '\n' }}`, `{{ (x) }}{{ x|replace('|', ')') }}`,
		`{{ messages }}{{ messages[0] }}{{ c }}{{ 7 // 2 }}`, `{{ 'a' if c }}{{ x, y }}{{ -n }}{{ not c }}`,
		`{{- '<' ~ x ~ '>' -}}{{ x ~ y|length }}{{ x ~ n is defined }}`, `{% set s = x ~ '-' ~ y %}{{ s }}{%- set t = (x ~ y) ~ m -%}{{ t }}`,
		`{% set ns = namespace(a='') %}{% for m in messages %}{% set ns.a = ns.a ~ m.role ~ ',' %}{% endfor %}{{ ns.a }}`,
	} {
		f.Add(s)
	}
	values := []string{`"plain"`, `7`, `"with {{ and }}"`, `["a", 1]`, `{"k": "v"}`}
	f.Fuzz(func(t *testing.T, src string) {
		if len(src) > 16<<10 || strings.Contains(src, "range") || strings.Contains(src, "*") || strings.Contains(src, "/") {
			return
		}
		orig, err := jinja.Compile(src)
		if err != nil {
			return
		}
		// Printing a macro or a function is refused, not guessed.
		sameRenders(t, "printed", src, orig, printTags(src), values, fuzzTemplateData, true)
	})
}
