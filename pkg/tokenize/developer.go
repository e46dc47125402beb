package tokenize

import (
	"strings"

	"github.com/ardanlabs/jinja"
)

// namesDeveloper reports whether a template source names the developer role,
// vLLM's test for whether the template supports it (a quoted "developer" or
// 'developer' anywhere in the source).
func namesDeveloper(src string) bool {
	return strings.Contains(src, `"developer"`) || strings.Contains(src, `'developer'`)
}

// developerAsSystem is what vLLM (0.33, renderers/hf.py
// safe_apply_chat_template) does to a conversation with a developer message
// when the template does not name that role: every developer message becomes
// a system message (its other fields kept, a "tools" field dropped), and then,
// if a system message is not first or there is more than one, all system
// messages are merged into one at the front, holding only role and content:
// their non-empty contents (a list of parts joined with "\n") joined with a
// blank line. The other messages keep
// their order. A conversation without a developer message is returned as it
// is; msgs itself is never modified.
func developerAsSystem(msgs []jinja.Value) []jinja.Value {
	if !hasRole(msgs, "developer") {
		return msgs
	}
	system := jinja.NewString("system")
	out := make([]jinja.Value, 0, len(msgs))
	for _, m := range msgs {
		if roleOf(m) != "developer" {
			out = append(out, m)
			continue
		}
		src := m.AsDict()
		cp := jinja.NewDict()
		d := cp.AsDict()
		for _, k := range src.Keys {
			switch k {
			case "tools":
			case "role":
				d.Set(k, system)
			default:
				v, _ := src.Get(k)
				d.Set(k, v)
			}
		}
		out = append(out, cp)
	}
	merge, seen := false, 0
	for i, m := range out {
		if roleOf(m) == "system" {
			if i > 0 || seen > 0 {
				merge = true
			}
			seen++
		}
	}
	if !merge {
		return out
	}
	var contents []string
	rest := make([]jinja.Value, 0, len(out))
	for _, m := range out {
		if roleOf(m) != "system" {
			rest = append(rest, m)
			continue
		}
		if c := joinedContent(m); c != "" {
			contents = append(contents, c)
		}
	}
	merged := jinja.NewDict()
	merged.AsDict().Set("role", system)
	merged.AsDict().Set("content", jinja.NewString(strings.Join(contents, "\n\n")))
	return append([]jinja.Value{merged}, rest...)
}

func hasRole(msgs []jinja.Value, role string) bool {
	for _, m := range msgs {
		if roleOf(m) == role {
			return true
		}
	}
	return false
}

func roleOf(m jinja.Value) string {
	if !m.IsDict() {
		return ""
	}
	r, ok := m.AsDict().Get("role")
	if !ok || !r.IsString() {
		return ""
	}
	return r.AsString()
}

// joinedContent is a message's content as one string: a list of text parts
// (the parts content format) joined with "\n".
func joinedContent(m jinja.Value) string {
	c, ok := m.AsDict().Get("content")
	switch {
	case !ok:
		return ""
	case c.IsString():
		return c.AsString()
	case !c.IsList():
		return ""
	}
	var texts []string
	for _, p := range c.AsList().Items {
		switch {
		case p.IsString():
			texts = append(texts, p.AsString())
		case p.IsDict():
			if t, ok := p.AsDict().Get("text"); ok && t.IsString() {
				texts = append(texts, t.AsString())
			}
		}
	}
	return strings.Join(texts, "\n")
}
