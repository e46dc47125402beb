package tokenize

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
)

// The engine's content formats (vLLM's --chat-template-content-format).
const (
	ContentFormatAuto   = "auto"
	ContentFormatString = "string"
	ContentFormatOpenAI = "openai"
)

// EngineChat is what a model's engine was started with that changes how it
// renders chats (vLLM 0.33's serve flags of the same names). The local
// tokenizer must be told: it cannot see the engine's command line, and a
// difference silently changes every token after it (the self-check would
// then demote the model to the engine's /tokenize).
type EngineChat struct {
	// Template replaces tokenizer_config.json's chat template, for every
	// request (--chat-template): a file's path, or the template's text
	// itself (a value holding "{{" or "{%").
	Template string `yaml:"chat_template"`
	// ContentFormat is --chat-template-content-format: auto (the default:
	// detected from the template, as vLLM detects it), string or openai.
	ContentFormat string `yaml:"chat_template_content_format"`
	// DefaultKwargs is --default-chat-template-kwargs, the same JSON object
	// (e.g. {"enable_thinking": false}): template arguments under each
	// request's own chat_template_kwargs.
	DefaultKwargs string `yaml:"default_chat_template_kwargs"`
	// DisabledThinkingEffort is --anthropic-disabled-thinking-effort: the
	// reasoning effort an Anthropic Messages request with thinking disabled
	// renders with. auto (the default) probes the template as vLLM does
	// ("none", or "low" when the template ignores "none"); none, low,
	// medium, high, xhigh or max fix it.
	DisabledThinkingEffort string `yaml:"anthropic_disabled_thinking_effort"`
	// ExcludeToolsWhenNone is --exclude-tools-when-tool-choice-none: a
	// request whose tool_choice is "none" renders without its tools.
	ExcludeToolsWhenNone bool `yaml:"exclude_tools_when_tool_choice_none"`
	// ReasoningEffortMap is --reasoning-effort-map, the same JSON object
	// (e.g. {"minimal": "low", "xhigh": "high"}): a request's reasoning
	// effort is rewritten through it before it reaches the template, as
	// vLLM rewrites it (an effort it does not name is kept).
	ReasoningEffortMap string `yaml:"reasoning_effort_map"`
}

// reasoningEfforts are the efforts --reasoning-effort-map may name (vLLM
// 0.33's ReasoningEffort).
var reasoningEfforts = map[string]bool{"none": true, "minimal": true, "low": true, "medium": true, "high": true, "xhigh": true, "max": true}

// effortMap is the parsed ReasoningEffortMap (nil when unset); the error
// says what is wrong with it.
func (e EngineChat) effortMap() (map[string]string, error) {
	if e.ReasoningEffortMap == "" {
		return nil, nil
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(e.ReasoningEffortMap), &m); err != nil || m == nil {
		return nil, errors.New("reasoning_effort_map must be a JSON object mapping reasoning efforts to strings")
	}
	for k := range m {
		if !reasoningEfforts[k] {
			return nil, fmt.Errorf("reasoning_effort_map: unknown effort %q (want none, minimal, low, medium, high, xhigh or max)", k)
		}
	}
	return m, nil
}

// mapEffort is effort rewritten through m, as vLLM's map_reasoning_effort.
func mapEffort(effort string, m map[string]string) string {
	if to, ok := m[effort]; ok && effort != "" {
		return to
	}
	return effort
}

// noToolChoice reports a request's tool_choice of "none" (raw JSON).
func noToolChoice(raw json.RawMessage) bool {
	return strings.TrimSpace(string(raw)) == `"none"`
}

// Validate reports the first problem of e.
func (e EngineChat) Validate() error {
	switch e.ContentFormat {
	case "", ContentFormatAuto, ContentFormatString, ContentFormatOpenAI:
	default:
		return fmt.Errorf("chat_template_content_format %q: want auto, string or openai", e.ContentFormat)
	}
	switch e.DisabledThinkingEffort {
	case "", "auto", "none", "low", "medium", "high", "xhigh", "max":
	default:
		return fmt.Errorf("anthropic_disabled_thinking_effort %q: want auto, none, low, medium, high, xhigh or max", e.DisabledThinkingEffort)
	}
	if _, err := e.effortMap(); err != nil {
		return err
	}
	if e.DefaultKwargs != "" {
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(e.DefaultKwargs), &m); err != nil {
			return fmt.Errorf("default_chat_template_kwargs is not a JSON object: %w", err)
		}
	}
	return nil
}

// load returns e with Template read from its file when it names one.
func (e EngineChat) load() (EngineChat, error) {
	if err := e.Validate(); err != nil {
		return e, err
	}
	if e.Template == "" || strings.Contains(e.Template, "{{") || strings.Contains(e.Template, "{%") {
		return e, nil
	}
	b, err := os.ReadFile(e.Template)
	if err != nil {
		return e, fmt.Errorf("chat_template: %w", err)
	}
	e.Template = string(b)
	return e, nil
}

// setEngine keeps the engine's default template arguments.
func (c *ChatTemplate) setEngine(e EngineChat) error {
	if e.DefaultKwargs == "" {
		return nil
	}
	v, err := jsonValue(json.RawMessage(e.DefaultKwargs))
	if err != nil || !v.IsDict() {
		return errors.New("default_chat_template_kwargs is not a JSON object")
	}
	if v.AsDict().Len() > 0 {
		c.defaults = v.AsDict()
	}
	return nil
}
