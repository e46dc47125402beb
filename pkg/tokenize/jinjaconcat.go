package tokenize

import "strings"

// Chat templates build each message with string concatenation:
//
//	{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
//
// The engine evaluates that left to right, copying the growing string at
// every '+', so a 14 KB message is copied four times before it is written
// to the output. When the leftmost operand is a string literal, every
// partial sum is a string and the engine's '+' prints its right operand
// exactly as an output tag would (the string's own text; a number, list or
// None in their printed form). So the tag writes the same bytes as one tag
// per operand:
//
//	{{- '<|im_start|>' }}{{ message.role }}{{ '\n' }}{{ content }}{{ '<|im_end|>' }}{{ '\n' }}
//
// splitConcat rewrites a template's source that way before it is compiled.
// It only touches an output tag whose expression is, at its top level, a
// string literal followed by one or more '+' operands, with no other
// operator at the top level that binds as loosely as '+' or looser ('-',
// '~', comparisons, and/or/not, in/is, if/else, a tuple's ',') and nothing
// else a split could change; everything else,
// statements and comments included, is copied unchanged.
func splitConcat(src string) string {
	return mapOutputTags(src, concatOperands)
}

// mapOutputTags rewrites src's output tags: a tag whose expression f maps
// to a non-nil list becomes one tag per expression in it, the first
// keeping the tag's left trim flag and the last its right one; the rest of
// src is copied unchanged. The tag scan follows the engine's own (quotes
// skip closers in tags but not in comments; '-' next to a delimiter
// trims), and a template with a raw block is left alone, since a raw block
// keeps its tags as text.
func mapOutputTags(src string, f func(expr string) []string) string {
	return mapTags(src, f, nil)
}

// mapTags is mapOutputTags that also rewrites statements: a statement
// whose body stmt maps to (body', true) becomes {% body' %} with its trim
// flags (stmt may be nil).
func mapTags(src string, f func(expr string) []string, stmt func(body string) (string, bool)) string {
	var b strings.Builder
	i, last := 0, 0
	for i+1 < len(src) {
		if src[i] != '{' {
			i++
			continue
		}
		var closer string
		switch src[i+1] {
		case '{':
			closer = "}}"
		case '%':
			closer = "%}"
		case '#':
			closer = "#}"
		default:
			i++
			continue
		}
		start := i
		i += 2
		trimLeft := i < len(src) && src[i] == '-'
		if trimLeft {
			i++
		}
		body, end, trimRight, ok := scanTag(src, i, closer)
		if !ok {
			return src // unclosed: the engine reports it
		}
		i = end
		switch closer {
		case "%}":
			if stmtWord(body) == "raw" {
				return src
			}
			if stmt == nil {
				continue
			}
			nb, ok := stmt(body)
			if !ok {
				continue
			}
			if b.Len() == 0 {
				b.Grow(len(src) + 64)
			}
			b.WriteString(src[last:start])
			b.WriteString("{%")
			if trimLeft {
				b.WriteByte('-')
			}
			b.WriteByte(' ')
			b.WriteString(nb)
			b.WriteByte(' ')
			if trimRight {
				b.WriteByte('-')
			}
			b.WriteString("%}")
			last = end
			continue
		case "#}":
			continue
		}
		parts := f(body)
		if parts == nil {
			continue
		}
		if b.Len() == 0 {
			b.Grow(len(src) + 64)
		}
		b.WriteString(src[last:start])
		for k, p := range parts {
			b.WriteString("{{")
			if k == 0 && trimLeft {
				b.WriteByte('-')
			}
			b.WriteByte(' ')
			b.WriteString(p)
			b.WriteByte(' ')
			if k == len(parts)-1 && trimRight {
				b.WriteByte('-')
			}
			b.WriteString("}}")
		}
		last = end
	}
	if last == 0 {
		return src
	}
	b.WriteString(src[last:])
	return b.String()
}

// scanTag finds the closer of the tag whose content starts at i, as the
// engine's scanner does: in expressions and statements a quoted string is
// skipped whole (a backslash skips the next byte), and a '-' just before
// the closer is a trim flag. It returns the content, the index after the
// closer and the flag.
func scanTag(src string, i int, closer string) (body string, end int, trimRight, ok bool) {
	start := i
	for i < len(src) {
		c := src[i]
		if closer != "#}" && (c == '\'' || c == '"') {
			i = min(quoteEnd(src, i)+1, len(src))
			continue
		}
		if c == '-' && i+2 < len(src) && src[i+1] == closer[0] && src[i+2] == closer[1] {
			return src[start:i], i + 3, true, true
		}
		if c == closer[0] && i+1 < len(src) && src[i+1] == closer[1] {
			return src[start:i], i + 2, false, true
		}
		i++
	}
	return "", 0, false, false
}

// stmtWord is a statement's first word.
func stmtWord(body string) string {
	body = strings.TrimLeft(body, " \t\r\n")
	n := 0
	for n < len(body) && (body[n] == '_' || body[n]|0x20 >= 'a' && body[n]|0x20 <= 'z') {
		n++
	}
	return body[:n]
}

// concatOperands splits an output expression at its top-level '+' signs
// when its first operand is a lone string literal (plusOperands, and see
// splitConcat).
func concatOperands(expr string) []string {
	parts := plusOperands(expr)
	if parts == nil || !isStringLiteral(parts[0]) {
		return nil
	}
	return parts
}

// plusOperands splits an expression at its top-level '+' signs. It returns
// nil unless there are at least two operands, none empty, and no top-level
// token binds looser than '+' (see splitConcat). Operands are trimmed of
// white space.
func plusOperands(expr string) []string { return operands(expr, '+') }

// operands splits an expression at its top-level op ('+' or '~'), under
// plusOperands' conditions; for '~' (which binds tighter than '+' and '-'
// in Jinja2) a top-level '+' or '-' refuses the split as '~' does for '+'.
func operands(expr string, op byte) []string {
	var parts []string
	depth, from := 0, 0
	prevDot := false
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
			continue
		case c == '\'' || c == '"':
			if i = quoteEnd(expr, i); i >= len(expr) {
				return nil
			}
			i++
			prevDot = false
			continue
		case c == '(' || c == '[' || c == '{':
			depth++
		case c == ')' || c == ']' || c == '}':
			if depth--; depth < 0 {
				return nil
			}
		case c == '_' || c|0x20 >= 'a' && c|0x20 <= 'z':
			j := i
			for j < len(expr) && (expr[j] == '_' || expr[j]|0x20 >= 'a' && expr[j]|0x20 <= 'z' || expr[j] >= '0' && expr[j] <= '9') {
				j++
			}
			if depth == 0 && !prevDot {
				switch expr[i:j] {
				case "if", "else", "and", "or", "not", "in", "is":
					return nil
				}
			}
			i = j
			prevDot = false
			continue
		case depth > 0:
		case c == op:
			p := strings.TrimSpace(expr[from:i])
			if p == "" {
				return nil
			}
			parts = append(parts, p)
			from = i + 1
		case c == '-' || c == '+' || c == '~' || c == '=' || c == '!' || c == '<' || c == '>' || c == ',' || c == ':':
			return nil
		}
		prevDot = c == '.'
		i++
	}
	if depth != 0 || len(parts) == 0 {
		return nil
	}
	p := strings.TrimSpace(expr[from:])
	if p == "" {
		return nil
	}
	parts = append(parts, p)
	return parts
}

// isStringLiteral reports whether s is one quoted string and nothing else.
func isStringLiteral(s string) bool {
	return len(s) >= 2 && (s[0] == '\'' || s[0] == '"') && quoteEnd(s, 0) == len(s)-1
}

// quoteEnd is the index of the quote closing the string that opens at
// s[i], as the engine reads it (a backslash skips the next byte), or
// len(s) if it is not closed.
func quoteEnd(s string, i int) int {
	q := s[i]
	for i++; i < len(s) && s[i] != q; i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
	}
	return i
}
