package tokenize

import (
	"regexp"
	"strings"
)

// loopsOverContent reports whether vLLM gives a template its messages'
// content as lists of text parts (its "openai" content format) rather than
// strings: whether some for loop of the template iterates over a message's
// content. vLLM 0.33 (renderers/hf.py _detect_content_format) decides this on
// the template's Jinja syntax tree; this is the same search on the source's
// statements:
//
//   - the names bound to the messages: messages itself, and every name set
//     from one of them, whole, sliced or filtered ({% set loop_messages =
//     messages[1:] %}), or as a namespace attribute ({% set ns =
//     namespace(rest=messages) %}, {% set ns.rest = messages %});
//   - the loop variables over those ({% for message in loop_messages %});
//   - a loop over such a variable's content ({% for part in
//     message['content'] %}, message.content, sliced or filtered), or over a
//     name content outside any macro;
//   - a loop, inside a macro, over a parameter that some call of the macro
//     passes a message's content ({% macro render(c) %}{% for p in c %}...
//     with {{ render(message.content) }}), by position or keyword.
func loopsOverContent(src string) bool {
	stmts := templateStatements(src)
	lists := map[string]bool{"messages": true}
	for changed := true; changed; {
		changed = false
		for _, st := range stmts {
			m := setStmt.FindStringSubmatch(st.text)
			if m == nil {
				continue
			}
			target, rhs := m[1], strings.TrimSpace(m[2])
			var aliases []string
			if call := namespaceCall.FindStringSubmatch(rhs); call != nil && !strings.Contains(target, ".") {
				for _, kw := range splitTopLevel(call[1], ',') {
					k, v, ok := strings.Cut(kw, "=")
					if ok && elemsAccessOfAny(strings.TrimSpace(v), lists) {
						aliases = append(aliases, target+"."+strings.TrimSpace(k))
					}
				}
			} else if elemsAccessOfAny(rhs, lists) {
				aliases = append(aliases, target)
			}
			for _, a := range aliases {
				if !lists[a] {
					lists[a], changed = true, true
				}
			}
		}
	}
	messageVars := map[string]bool{}
	for _, st := range stmts {
		if m := forStmt.FindStringSubmatch(st.text); m != nil && elemsAccessOfAny(loopIter(m[2]), lists) {
			messageVars[m[1]] = true
		}
	}
	for _, st := range stmts {
		m := forStmt.FindStringSubmatch(st.text)
		if m == nil {
			continue
		}
		iter := loopIter(m[2])
		for v := range messageVars {
			if contentAccess(iter, v) {
				return true
			}
		}
		if st.macro == "" && iter == "content" {
			return true
		}
	}
	params := contentParams(src, stmts, messageVars)
	for _, st := range stmts {
		if m := forStmt.FindStringSubmatch(st.text); m != nil && st.macro != "" && params[st.macro][loopIter(m[2])] {
			return true
		}
	}
	return false
}

// contentParams maps each macro to its parameters that some call passes a
// message's content, by position or by keyword.
func contentParams(src string, stmts []statement, messageVars map[string]bool) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for _, st := range stmts {
		m := macroStmt.FindStringSubmatch(st.text)
		if m == nil {
			continue
		}
		name := m[1]
		var params []string
		for _, p := range splitTopLevel(m[2], ',') {
			p, _, _ = strings.Cut(p, "=")
			if p = strings.TrimSpace(p); p != "" {
				params = append(params, p)
			}
		}
		call := regexp.MustCompile(`\b` + regexp.QuoteMeta(name) + `\s*\(`)
		for _, loc := range call.FindAllStringIndex(src, -1) {
			open := loc[1] - 1
			end := matchingParen(src[open:])
			if end < 0 {
				continue
			}
			for i, arg := range splitTopLevel(src[open+1:open+end], ',') {
				param := ""
				if k, v, ok := strings.Cut(arg, "="); ok && keyword.MatchString(k) && !strings.HasPrefix(v, "=") {
					param, arg = strings.TrimSpace(k), v
				} else if i < len(params) {
					param = params[i]
				}
				for v := range messageVars {
					if param != "" && contentAccess(arg, v) {
						if out[name] == nil {
							out[name] = map[string]bool{}
						}
						out[name][param] = true
					}
				}
			}
		}
	}
	return out
}

var (
	stmtRe        = regexp.MustCompile(`(?s)\{%[-+]?\s*(.*?)\s*[-+]?%\}`)
	setStmt       = regexp.MustCompile(`(?s)^set\s+([A-Za-z_][\w.]*)\s*=\s*(.+)$`)
	forStmt       = regexp.MustCompile(`(?s)^for\s+([A-Za-z_]\w*)\s+in\s+(.+)$`)
	namespaceCall = regexp.MustCompile(`(?s)^namespace\((.*)\)$`)
	macroStmt     = regexp.MustCompile(`(?s)^macro\s+([A-Za-z_]\w*)\s*\((.*)\)$`)
	keyword       = regexp.MustCompile(`^\s*[A-Za-z_]\w*\s*$`)
	contentKey    = regexp.MustCompile(`^(.+?)(?:\.content|\[\s*(?:'content'|"content")\s*\])$`)
	trailingSlice = regexp.MustCompile(`\[[^\[\]]*:[^\[\]]*\]$`)
)

type statement struct {
	text string
	// macro names the macro the statement lies in ("" outside any).
	macro string
}

// templateStatements lists the source's {% %} statements, each with the
// macro it lies in.
func templateStatements(src string) []statement {
	var out []statement
	var macros []string
	for _, m := range stmtRe.FindAllStringSubmatch(src, -1) {
		text := strings.TrimSpace(m[1])
		if mm := macroStmt.FindStringSubmatch(text); mm != nil {
			macros = append(macros, mm[1])
		}
		cur := ""
		if len(macros) > 0 {
			cur = macros[len(macros)-1]
		}
		out = append(out, statement{text: text, macro: cur})
		if (text == "endmacro" || strings.HasPrefix(text, "endmacro ")) && len(macros) > 0 {
			macros = macros[:len(macros)-1]
		}
	}
	return out
}

// loopIter is a for statement's iterable: what follows "in", without a
// trailing condition or "recursive".
func loopIter(s string) string {
	s = strings.TrimSpace(s)
	s = strings.TrimSuffix(s, " recursive")
	if parts := splitTopLevelWord(s, " if "); len(parts) > 1 {
		s = parts[0]
	}
	return strings.TrimSpace(s)
}

// baseOf strips what vLLM looks through around a variable: filters, tests,
// slices and enclosing parentheses.
func baseOf(e string) string {
	for {
		e = strings.TrimSpace(e)
		prev := e
		if parts := splitTopLevel(e, '|'); len(parts) > 1 {
			e = parts[0]
		}
		if parts := splitTopLevelWord(e, " is "); len(parts) > 1 {
			e = parts[0]
		}
		e = strings.TrimSpace(e)
		if strings.HasPrefix(e, "(") && strings.HasSuffix(e, ")") && matchingParen(e) == len(e)-1 {
			e = e[1 : len(e)-1]
		}
		e = trailingSlice.ReplaceAllString(strings.TrimSpace(e), "")
		if e == prev {
			return e
		}
	}
}

// elemsAccessOfAny: e is one of names, whole, sliced, filtered or tested.
func elemsAccessOfAny(e string, names map[string]bool) bool {
	return names[baseOf(e)]
}

// contentAccess: e is v's content (attribute or item), sliced, filtered or
// tested.
func contentAccess(e, v string) bool {
	m := contentKey.FindStringSubmatch(baseOf(e))
	return m != nil && strings.TrimSpace(m[1]) == v
}

// splitTopLevel splits s at every sep outside brackets and quotes.
func splitTopLevel(s string, sep byte) []string {
	var out []string
	for {
		i := topLevelIndex(s, string(sep))
		if i < 0 {
			return append(out, s)
		}
		out, s = append(out, s[:i]), s[i+1:]
	}
}

// splitTopLevelWord splits s at the first sep outside brackets and quotes.
func splitTopLevelWord(s, sep string) []string {
	if i := topLevelIndex(s, sep); i >= 0 {
		return []string{s[:i], s[i+len(sep):]}
	}
	return []string{s}
}

// topLevelIndex is the index of the first sep in s outside brackets and
// quotes, or -1.
func topLevelIndex(s, sep string) int {
	depth := 0
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '(' || c == '[' || c == '{':
			depth++
		case c == ')' || c == ']' || c == '}':
			depth--
		case depth == 0 && strings.HasPrefix(s[i:], sep):
			return i
		}
	}
	return -1
}

// matchingParen returns the index of the parenthesis closing s[0], or -1.
func matchingParen(s string) int {
	depth := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return i
			}
		}
	}
	return -1
}
