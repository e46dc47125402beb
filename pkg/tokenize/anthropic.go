package tokenize

import (
	"encoding/json"
	"errors"
	"regexp"
	"strings"

	"github.com/ardanlabs/jinja"
)

// This file holds the two template probes vLLM (0.33,
// entrypoints/anthropic/serving.py) runs once per server to shape the chat
// request it makes of an Anthropic Messages body.

// rejectsInlineSystem reports whether the template fails to render a
// conversation with a system message after the first ([system, user,
// system, user], no generation prompt, nothing else defined, not even the
// tokenizer's special tokens or strftime_now): vLLM then
// merges a Messages request's inline system messages into the leading one.
// An empty template counts as failing, as in vLLM.
func rejectsInlineSystem(src string) bool {
	if src == "" || generationTag.MatchString(src) {
		return true
	}
	t, err := compileTemplate(strictProbeSource(src))
	if err != nil {
		return true
	}
	msg := func(role string) jinja.Value {
		d := jinja.NewDict()
		d.AsDict().Set("role", jinja.NewString(role))
		d.AsDict().Set("content", jinja.NewString("t"))
		return d
	}
	data := map[string]jinja.Value{
		"messages":              jinja.NewList([]jinja.Value{msg("system"), msg("user"), msg("system"), msg("user")}),
		"add_generation_prompt": jinja.NewBool(false),
		// Not defined in the probe's bare environment (the engine's
		// builtins define it).
		"strftime_now": jinja.Undefined(),
		probeUndefined: jinja.NewCallable(probeUndefined, func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
			return jinja.Undefined(), errors.New("an undefined operand of +")
		}),
	}
	_, err = renderSafe(t, data, 256)
	return err != nil
}

// The probe's bare jinja2 environment fails on an addition with an
// undefined operand, where this package's engine adds "": such additions
// are rewritten, for the probe only, to call probeUndefined, which fails
// when the render reaches it. The operands rewritten are the special
// tokens (the probe defines none) and a string content's text part
// ("t"[0]['text'], undefined in jinja2). transformers' {% generation %}
// tag, which bare jinja2 cannot compile, fails the probe outright.
var (
	tokenBeforeAdd = regexp.MustCompile(`(^|[^\w.'"])(?:bos|eos|unk|pad)_token(\s*\+)`)
	tokenAfterAdd  = regexp.MustCompile(`(\+\s*)(?:bos|eos|unk|pad)_token\b`)
	textPartAdd    = regexp.MustCompile(`(\[\s*0\s*\]\s*(?:\[\s*['"]text['"]\s*\]|\.text\b))(\s*\+)`)
	generationTag  = regexp.MustCompile(`\{%-?\s*generation\s*-?%\}`)
)

const probeUndefined = "__kvroute_undefined_operand"

// strictProbeSource is src with the additions above rewritten in its
// expression and statement tags.
func strictProbeSource(src string) string {
	var b strings.Builder
	i, last := 0, 0
	for i+1 < len(src) {
		if src[i] != '{' || (src[i+1] != '{' && src[i+1] != '%') {
			i++
			continue
		}
		closer := "}}"
		if src[i+1] == '%' {
			closer = "%}"
		}
		body, end, _, ok := scanTag(src, i+2, closer)
		if !ok {
			break // unclosed: compiling reports it
		}
		strict := tokenBeforeAdd.ReplaceAllString(body, "${1}"+probeUndefined+"()${2}")
		strict = tokenAfterAdd.ReplaceAllString(strict, "${1}"+probeUndefined+"()")
		strict = textPartAdd.ReplaceAllString(strict, "${1} + "+probeUndefined+"()${2}")
		if strict != body {
			from := i + 2
			b.WriteString(src[last:from])
			b.WriteString(strict)
			last = from + len(body)
		}
		i = end
	}
	if last == 0 {
		return src
	}
	b.WriteString(src[last:])
	return b.String()
}

// anthropicEfforts are the efforts vLLM compares "none" with.
var anthropicEfforts = []string{"low", "medium", "high", "xhigh", "max"}

// probeDisabledThinking is the reasoning effort vLLM uses for a Messages
// request with thinking disabled, when its server is left at "auto": it
// renders a one-message chat ("Hi") with reasoning_effort "none" and with
// each effort; "low" when "none" fails or renders as some effort does (the
// template ignores "none"), else "none".
func (c *ChatTemplate) probeDisabledThinking() string {
	render := func(effort string) (string, bool) {
		out, err := c.Render(ChatInput{
			Messages:            json.RawMessage(`[{"role":"user","content":"Hi"}]`),
			ReasoningEffort:     effort,
			AddGenerationPrompt: true,
		})
		return out, err == nil
	}
	none, ok := render("none")
	if !ok {
		return "low"
	}
	for _, e := range anthropicEfforts {
		if out, ok := render(e); ok && out == none {
			return "low"
		}
	}
	return "none"
}
