package tokenize

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ardanlabs/jinja"
)

func TestSplitConcat(t *testing.T) {
	cases := []struct{ src, want string }{
		// Split: a literal first, then '+' operands of any shape that
		// binds at least as tightly as '+'.
		{`a{{- '<s>' + m.role + '\n' + m.content -}}b`, `a{{- '<s>' }}{{ m.role }}{{ '\n' }}{{ m.content -}}b`},
		{`{{ "x" + y }}`, `{{ "x" }}{{ y }}`},
		{`{{ 'x' + y | trim + z[0] + f(a, b - 1) }}`, `{{ 'x' }}{{ y | trim }}{{ z[0] }}{{ f(a, b - 1) }}`},
		{`{{ 'x' + (y if c else 'n') + n * 2 }}`, `{{ 'x' }}{{ (y if c else 'n') }}{{ n * 2 }}`},
		{`{{ 'a+b' + '}}' + x.is_tool }}`, `{{ 'a+b' }}{{ '}}' }}{{ x.is_tool }}`},
		{`{{ 'it\'s' + x }}{{ y }}`, `{{ 'it\'s' }}{{ x }}{{ y }}`},
		// Unchanged: the first operand is not a lone literal.
		{`{{ x + 'a' }}`, `{{ x + 'a' }}`},
		{`{{ 'a'|upper + x }}`, `{{ 'a'|upper + x }}`},
		{`{{ 'a' }}`, `{{ 'a' }}`},
		// Unchanged: another top-level operator at '+''s level or looser.
		{`{{ 'a' + x - 1 }}`, `{{ 'a' + x - 1 }}`},
		{`{{ 'a' + x ~ y }}`, `{{ 'a' + x ~ y }}`},
		{`{{ 'a' + x if c else y }}`, `{{ 'a' + x if c else y }}`},
		{`{{ 'a' + x == y }}`, `{{ 'a' + x == y }}`},
		{`{{ 'a' + x and y }}`, `{{ 'a' + x and y }}`},
		{`{{ 'a' + x is defined }}`, `{{ 'a' + x is defined }}`},
		{`{{ 'a' + x in y }}`, `{{ 'a' + x in y }}`},
		{`{{ 'a' + not x }}`, `{{ 'a' + not x }}`},
		{`{{ 'a' + + x }}`, `{{ 'a' + + x }}`},
		{`{{ 'a' + x + }}`, `{{ 'a' + x + }}`},
		{`{{ 'a' + x, y }}`, `{{ 'a' + x, y }}`},
		// Unchanged: not an output tag, or inside a raw block.
		{`{% set s = 'a' + x %}{# {{ 'a' + x }} #}`, `{% set s = 'a' + x %}{# {{ 'a' + x }} #}`},
		{`{% raw %}{{ 'a' + x }}{% endraw %}{{ 'a' + x }}`, `{% raw %}{{ 'a' + x }}{% endraw %}{{ 'a' + x }}`},
		// Unclosed: left for the engine to report.
		{`{{ 'a' + x }}{{ 'b' + y`, `{{ 'a' + x }}{{ 'b' + y`},
	}
	for _, c := range cases {
		if got := splitConcat(c.src); got != c.want {
			t.Errorf("splitConcat(%q)\n got %q\nwant %q", c.src, got, c.want)
		}
	}
}

// chatTemplateSources are the chat templates the split is checked on:
// every fixture family's, as its tokenizer_config.json ships it, and a
// few written here in shapes the fixtures lack (no spaces around '+',
// double quotes, a '~' join, a leading variable operand, a macro, a
// filter block, a namespace counter), with whether each must be split
// (true) or left as written (false); the other fixture families are
// checked only for the same render.
func chatTemplateSources(t testing.TB) (map[string]string, map[string]bool) {
	t.Helper()
	srcs := map[string]string{
		"inst": `{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{'[INST] '+m['content']+' [/INST]'}}` +
			`{% elif m['role'] == 'assistant' %}{{ ' ' + m['content'] + eos_token }}{% endif %}{% endfor %}`,
		"tagged": `{% for m in messages %}{{ "<|" + m.role + "|>\n" + m.content | trim + "<|end|>\n" }}{% endfor %}` +
			`{% if add_generation_prompt %}{{ "<|assistant|>\n" }}{% endif %}`,
		"tilde": `{% for m in messages %}{{ '<' ~ m.role ~ '>' + m.content }}{{ bos_token + m.role + '\n' }}{% endfor %}`,
		"macro": `{% macro turn(r, c) %}{{- '<t ' + r + '>' + c + '</t>' -}}{% endmacro %}{% set ns = namespace(n=0) %}` +
			`{% for m in messages %}{{ turn(m.role, m.content) }}{% set ns.n = ns.n + 1 %}{% endfor %}{{ 'n=' + ns.n | string }}`,
		"filtered": `{% filter upper %}{% for m in messages %}{{ 'x:' + m.content + (':last' if loop.last else '') }}{% endfor %}{% endfilter %}`,
	}
	// tilde's tags join with '~' or start with a variable: neither splits.
	split := map[string]bool{"qwen3": true, "inst": true, "tagged": true, "tilde": false, "macro": true, "filtered": true}
	for _, name := range fixtureNames {
		if noChatTemplate[name] {
			continue
		}
		data, err := os.ReadFile(filepath.Join(tokenizerDir(name), "tokenizer_config.json"))
		if err != nil {
			t.Fatal(err)
		}
		var cfg tokenizerConfig
		if err := json.Unmarshal(data, &cfg); err != nil {
			t.Fatal(err)
		}
		src, toolSrc, err := templateSources(cfg.ChatTemplate)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		srcs[name] = src
		if toolSrc != "" {
			srcs[name+"/tool_use"] = toolSrc
		}
	}
	return srcs, split
}

// TestSplitConcatRendersSame renders every template of chatTemplateSources
// as written and as split, over messages whose fields take every value
// kind the engine prints (numbers, lists, dicts, None, booleans, strings
// with quotes and template delimiters), and requires the same output or
// an error from both.
func TestSplitConcatRendersSame(t *testing.T) {
	values := []string{`"plain"`, `"it's \"q\" {{ x }} + y"`, `7`, `2.5`, `true`, `null`, `[1, "a"]`, `{"k": "v"}`, `""`}
	srcs, wantSplit := chatTemplateSources(t)
	for name, src := range srcs {
		t.Run(name, func(t *testing.T) {
			split := splitConcat(src)
			if want, ok := wantSplit[name]; ok && want != (split != src) {
				t.Fatalf("split %v, want %v: %q", split != src, want, split)
			}
			orig, err := jinja.Compile(src)
			if err != nil {
				t.Fatal(err)
			}
			cut, err := jinja.Compile(split)
			if err != nil {
				t.Fatalf("split template does not compile: %v", err)
			}
			rendered := 0
			for _, content := range values {
				for _, role := range []string{`"system"`, `"user"`, `"assistant"`, `"tool"`, `3`} {
					for _, gen := range []bool{false, true} {
						msgs := `[{"role": "system", "content": ` + content + `}, {"role": "user", "content": "hi"},
							{"role": ` + role + `, "content": ` + content + `, "tool_calls": [{"type": "function",
							"function": {"name": ` + content + `, "arguments": {"a": ` + content + `}}}]},
							{"role": "user", "content": ` + content + `}]`
						v, err := jsonValue(json.RawMessage(msgs))
						if err != nil {
							t.Fatal(err)
						}
						in := map[string]jinja.Value{"messages": v, "add_generation_prompt": jinja.NewBool(gen),
							"bos_token": jinja.NewString("<s>"), "tools": jinja.None()}
						want, werr := renderSafe(orig, in, 0)
						got, gerr := renderSafe(cut, in, 0)
						if (werr != nil) != (gerr != nil) || got != want {
							t.Fatalf("content %s role %s: as written %q (%v), split %q (%v)", content, role, want, werr, got, gerr)
						}
						if werr == nil {
							rendered++
						}
					}
				}
			}
			if rendered == 0 {
				t.Fatal("no input rendered: the comparison checked nothing")
			}
		})
	}
}

// TestRenderSized checks the sized render against the engine's own on
// every template of chatTemplateSources, as compiled for use, with hints
// below, near and above the output.
func TestRenderSized(t *testing.T) {
	if !sizedRenderOK {
		t.Fatal("the sized render is off: the engine's Template or evaluator layout changed (see jinjafix.go)")
	}
	v, err := jsonValue(json.RawMessage(`[{"role": "system", "content": "sys"}, {"role": "user", "content": "` +
		strings.Repeat("word ", 2000) + `"}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]`))
	if err != nil {
		t.Fatal(err)
	}
	in := map[string]jinja.Value{"messages": v, "add_generation_prompt": jinja.NewBool(true), "tools": jinja.None(),
		"bos_token": jinja.NewString("<s>"), "eos_token": jinja.NewString("</s>")}
	srcs, _ := chatTemplateSources(t)
	for name, src := range srcs {
		tmpl, err := compileTemplate(src)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want, err := tmpl.RenderValues(in)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, hint := range []int{0, 100, len(want), 1 << 20} {
			got, err := renderSized(tmpl, in, hint)
			if err != nil || got != want {
				t.Fatalf("%s, hint %d: sized render differs (err %v)", name, hint, err)
			}
		}
	}
}

// fuzzTemplateData is a render's data for the template fuzzers: a
// conversation whose every content (and tool call argument) is the JSON
// value v, and names m, x, y and n bound to v.
func fuzzTemplateData(tb testing.TB, v string) map[string]jinja.Value {
	msgs, err := jsonValue(json.RawMessage(`[{"role": "system", "content": ` + v + `}, {"role": "user", "content": ` + v + `},
		{"role": "assistant", "content": ` + v + `, "tool_calls": [{"function": {"name": "f", "arguments": {"a": ` + v + `}}}]}]`))
	if err != nil {
		tb.Fatal(err)
	}
	x, err := jsonValue(json.RawMessage(v))
	if err != nil {
		tb.Fatal(err)
	}
	return map[string]jinja.Value{"messages": msgs, "m": x, "x": x, "y": x, "n": x, "c": jinja.NewBool(true),
		"add_generation_prompt": jinja.NewBool(true), "bos_token": jinja.NewString("<s>")}
}

// sameRenders fails t unless src (compiled: orig), rewritten as rewritten
// (by what), renders what it renders as written, or fails as it does, on
// the data of each of values. A render the rewrite refuses with
// ErrUnsupported where the original rendered counts as the same when
// refusedOK (printing a macro: refused, not guessed).
func sameRenders(t *testing.T, what, src string, orig *jinja.Template, rewritten string, values []string, data func(testing.TB, string) map[string]jinja.Value, refusedOK bool) {
	t.Helper()
	cut, err := jinja.Compile(rewritten)
	if err != nil {
		return // compileTemplate keeps the template as written
	}
	for _, v := range values {
		want, werr := renderSafe(orig, data(t, v), 0)
		got, gerr := renderSafe(cut, data(t, v), 0)
		if refusedOK && werr == nil && errors.Is(gerr, ErrUnsupported) {
			continue
		}
		if (werr != nil) != (gerr != nil) || got != want {
			t.Fatalf("%s %q\nof %q\nrenders %q (%v), as written %q (%v)", what, rewritten, src, got, gerr, want, werr)
		}
	}
}

// FuzzSplitConcat: for any template the engine compiles, the split form
// renders the same bytes (or fails as well) over a few inputs. The seeds
// are chatTemplateSources and the table above; the
// fuzzer mutates them (tags, quotes, operators, delimiters inside
// strings). Templates that could render without bound (range, string
// repetition) or are large are skipped.
func FuzzSplitConcat(f *testing.F) {
	srcs, _ := chatTemplateSources(f)
	for _, src := range srcs {
		f.Add(src)
	}
	for _, s := range []string{
		`a{{- '<s>' + m + '\n' + x -}}b`, `{{ 'x' + (y if c else 'n') + n }}`, `{{ 'a+b' + '}}' + x.is_tool }}`,
		`{% set s = 'a' + x %}{{ s }}{# {{ 'a' + x }} #}`, `{{ 'it\'s' + x }}{{ y }}`, `{{ "q\"" + x | trim + '-' }}`,
		`{% for m in messages %}{{ '<' + m.role + '>' + m.content }}{% endfor %}`, `{{ 'a' + x - 1 }}`, `{{ 'a' ~ x + y }}`,
	} {
		f.Add(s)
	}
	// Each render gets inputs of its own: the engine lets a template set a
	// dict's key ({% set n.k = 1 %}), so a render can change what the next
	// one sees.
	values := []string{`"plain"`, `7`, `[1, "a"]`, `null`, `{"k": "v"}`, `"with {{ and }} and 'q'"`}
	input := func(tb testing.TB, v string) map[string]jinja.Value {
		data := fuzzTemplateData(tb, v)
		data["tools"] = jinja.None()
		return data
	}
	f.Fuzz(func(t *testing.T, src string) {
		if len(src) > 16<<10 || strings.Contains(src, "range") || strings.Contains(src, "*") {
			return
		}
		orig, err := jinja.Compile(src)
		if err != nil {
			return
		}
		if split := splitConcat(src); split != src {
			sameRenders(t, "split", src, orig, split, values, input, false)
		}
	})
}
