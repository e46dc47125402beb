package route

import (
	"bytes"
	"encoding/json"
	"strings"
)

// BillingHeader begins the attribution line Claude Code puts first in its
// system prompt (reaching an OpenAI-compatible engine through a gateway
// that translates its requests); the line's value changes on every request.
const BillingHeader = "x-anthropic-billing-header"

// WithoutBillingHeader is what vLLM (0.33, renderers/chat_utils/
// chat_message.py _strip_claude_code_billing_header) does to each string or
// "text" part of a system message: a text that begins with the billing
// header loses its first line, and is dropped (keep false) when nothing
// follows that line. Other texts are returned as they are. The tokenizer
// applies it before the chat template, and the conversation key below, so
// that one conversation keeps one key.
func WithoutBillingHeader(text string) (rest string, keep bool) {
	if !strings.HasPrefix(text, BillingHeader) {
		return text, true
	}
	_, rest, _ = strings.Cut(text, "\n")
	return rest, rest != ""
}

// systemContentKey is the bytes a system message's content adds to a
// conversation's opening hash: the raw JSON, unless the content holds the
// billing header, when it is the content's texts as vLLM keeps them (each
// followed by a NUL; a part that is not text adds its raw JSON).
func systemContentKey(content []byte) []byte {
	if !bytes.Contains(content, []byte(BillingHeader)) {
		return content
	}
	var s string
	if json.Unmarshal(content, &s) == nil {
		rest, keep := WithoutBillingHeader(s)
		if !keep {
			return nil
		}
		return append([]byte(rest), 0)
	}
	var parts []json.RawMessage
	if json.Unmarshal(content, &parts) != nil {
		return content
	}
	var out []byte
	for _, p := range parts {
		var text string
		var part struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		switch {
		case json.Unmarshal(p, &text) == nil:
		case json.Unmarshal(p, &part) == nil && part.Type == "text" && part.Text != nil:
			text = *part.Text
		default:
			out = append(append(out, p...), 0)
			continue
		}
		if rest, keep := WithoutBillingHeader(text); keep {
			out = append(append(out, rest...), 0)
		}
	}
	return out
}
