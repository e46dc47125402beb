package tokenize

import (
	"encoding/json"
	"fmt"

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
	if src == "" {
		return true
	}
	t, err := compileTemplate(src)
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
	}
	_, err = renderSafe(t, data, 256)
	return err != nil
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
			ChatTemplateKwargs:  effortKwargs(effort),
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

// DisabledThinkingEffort is the reasoning effort the template gets for an
// Anthropic Messages request with thinking disabled.
func (c *ChatTemplate) DisabledThinkingEffort() string { return c.offEffort }

// RejectsInlineSystem reports whether Anthropic Messages requests are
// rendered with their inline system messages merged into the leading one.
func (c *ChatTemplate) RejectsInlineSystem() bool { return c.systemFirst }

// effortKwargs are the template arguments vLLM (0.33, build_chat_params)
// gives a chat request with reasoning_effort effort and no arguments of
// its own: the effort, and enable_thinking unless the effort is "none".
func effortKwargs(effort string) json.RawMessage {
	return json.RawMessage(fmt.Sprintf(`{"enable_thinking":%t,"reasoning_effort":%q}`, effort != "none", effort))
}
