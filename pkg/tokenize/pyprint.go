package tokenize

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/kvroute/kvroute/pkg/pyfmt"
)

// What a template prints, printed as Python prints it.
//
// HuggingFace renders a chat template with Jinja2, where an output tag
// writes str() of its value: None is "None", 1.5e-05 is "1.5e-05", a list
// or a dict is its repr ("[{'type': 'text', 'text': 'hi'}]"). The Go engine
// prints None as nothing, floats with Go's %g, and lists and dicts without
// Python's quoting and escapes. Requests meet these: vLLM hands a template a
// tool without a description as description None (pydantic dumps the
// field), and Gemma's and Cohere's templates print it; a system message in
// OpenAI's content format is a list that Llama 3.2 Vision's template trims
// and prints. The engine has no hook for its printer, so printTags routes
// every output tag through the kvroute_print filter (pyPrint) in the
// template's source before it is compiled, and the engine's string and join
// filters are replaced (see jinjafix.go) with ones that call the same str()
// (its case filters too: pycase.go).

// printFilter is the filter name printTags wraps output tags in.
const printFilter = "kvroute_print"

// printTags rewrites each output tag of src, {{ expr }}, as
// {{ (expr)|kvroute_print }}, keeping its trim flags. A tag whose value is
// a string whatever the data (stringValued) is left as it is: the engine
// prints a string as Python does, and the filter call costs about a third
// of a loop iteration in this engine (BenchmarkPrintTags). So is the whole
// template when it has a raw block (the block keeps its tags as text).
// Statements and comments are copied unchanged; the tag scan is
// splitConcat's.
//
// A tag joining operands with '~' at its top level becomes one tag per
// operand, each printed so: Jinja2's '~' is str() of each operand,
// concatenated, where the engine's prints None as nothing and lists its
// own way; the split also spares the engine's copies of the growing
// string, as splitConcat does for '+'.
//
// A set statement whose value is such a '~' chain ({% set s = a ~ b %})
// keeps its chain with every operand printed so, the engine's '~' then
// joining strings.
func printTags(src string) string {
	return mapTags(src, func(expr string) []string {
		e := strings.TrimSpace(expr)
		if parts := printedOperands(e); parts != nil {
			return parts
		}
		if e == "" || stringValued(e) {
			return nil
		}
		return []string{"(" + e + ")|" + printFilter}
	}, printSet)
}

// printedOperands is e's top-level '~' operands, each not stringValued
// routed through kvroute_print, or nil when e is not a '~' chain.
func printedOperands(e string) []string {
	parts := operands(e, '~')
	for i, p := range parts {
		if !stringValued(p) {
			parts[i] = "(" + p + ")|" + printFilter
		}
	}
	return parts
}

// printSet rewrites a statement "set target = a ~ b ~ ..." with its
// operands printed (printedOperands); any other statement is left alone.
func printSet(body string) (string, bool) {
	t := strings.TrimSpace(body)
	if stmtWord(t) != "set" {
		return "", false
	}
	rest := t[len("set"):]
	// The target is a name or an attribute: a quote or a bracket before
	// the first '=' (or '==') means this is no plain assignment, and no
	// '=' is a block set, whose body is tags of its own.
	eq := strings.IndexByte(rest, '=')
	if eq < 0 || strings.ContainsAny(rest[:eq], "'\"([{") || strings.HasPrefix(rest[eq:], "==") {
		return "", false
	}
	parts := printedOperands(strings.TrimSpace(rest[eq+1:]))
	if parts == nil {
		return "", false
	}
	return "set " + strings.TrimSpace(rest[:eq]) + " = " + strings.Join(parts, " ~ "), true
}

// stringFilters are the filters whose result is a string for any input
// they accept (Jinja2's, and this package's replacements of tojson, trim,
// string, join and the case filters).
var stringFilters = map[string]bool{
	"tojson": true, "trim": true, "string": true, "join": true, "upper": true, "lower": true,
	"title": true, "capitalize": true, "replace": true, "indent": true, "center": true,
	"format": true, "striptags": true, "truncate": true, "wordwrap": true, printFilter: true,
}

// stringMethods are the str methods whose result is a string (called on
// anything else, Python raises).
var stringMethods = map[string]bool{
	"strip": true, "lstrip": true, "rstrip": true, "upper": true, "lower": true, "title": true,
	"capitalize": true, "replace": true, "format": true, "join": true,
}

// stringValued reports whether an output expression's value is a string
// for any data that Python renders without an error: a string literal; a
// sum whose top-level operands include a string literal (str + str, or a
// TypeError); or an expression whose last operation is a filter of
// stringFilters or a call of a method of stringMethods.
func stringValued(expr string) bool {
	if isStringLiteral(expr) {
		return true
	}
	for _, op := range plusOperands(expr) {
		if isStringLiteral(op) {
			return true
		}
	}
	return endsWithCall(expr, '|', stringFilters) || endsWithCall(expr, '.', stringMethods)
}

// endsWithCall reports whether expr's last top-level sep ('|' for a
// filter, '.' for a method) is followed by a name in names and, for a
// method, exactly one parenthesised argument list (for a filter, at most
// one), closing at the expression's end. Anything else after the name (a
// conditional, an operator, a subscript) means the call is not the
// expression's last operation.
func endsWithCall(expr string, sep byte, names map[string]bool) bool {
	at, depth := -1, 0
	for i := 0; i < len(expr); i++ {
		switch c := expr[i]; {
		case c == '\'' || c == '"':
			if i = quoteEnd(expr, i); i >= len(expr) {
				return false
			}
		case c == '(' || c == '[' || c == '{':
			depth++
		case c == ')' || c == ']' || c == '}':
			depth--
		case c == sep && depth == 0:
			at = i
		}
	}
	if at < 0 || depth != 0 {
		return false
	}
	rest := strings.TrimLeft(expr[at+1:], " \t\r\n")
	n := 0
	for n < len(rest) && (rest[n] == '_' || rest[n]|0x20 >= 'a' && rest[n]|0x20 <= 'z' || n > 0 && rest[n] >= '0' && rest[n] <= '9') {
		n++
	}
	if n == 0 || !names[rest[:n]] {
		return false
	}
	rest = strings.TrimSpace(rest[n:])
	if rest == "" {
		return sep == '|'
	}
	if rest[0] != '(' {
		return false
	}
	depth = 0
	for i := 0; i < len(rest); i++ {
		switch c := rest[i]; {
		case c == '\'' || c == '"':
			i = quoteEnd(rest, i)
		case c == '(' || c == '[' || c == '{':
			depth++
		case c == ')' || c == ']' || c == '}':
			if depth--; depth == 0 {
				return i == len(rest)-1
			}
		}
	}
	return false
}

// pyPrint is the kvroute_print filter: str() of its value as an output
// tag writes it. Undefined prints as nothing, as in Jinja2. A number
// behind pyNumMark is passed through with its mark, and the render is
// refused: the engine's tests take it for a string ('is string' true, 'is
// number' false), so a template that branched on it may have gone another
// way than Python's, and printing its digits would hide that.
func pyPrint(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Value{}, errors.New(printFilter + ": missing value")
	}
	v := args[0]
	if v.IsString() || v.IsUndefined() {
		return v, nil
	}
	s, err := pyStr(v)
	if err != nil {
		return jinja.Value{}, err
	}
	return jinja.NewString(s), nil
}

// pyText is str(v) as pyPrint prints it: a string as it is (a marked
// number with its mark, which the render's check refuses), else pyStr.
func pyText(v jinja.Value) (string, error) {
	if v.IsString() {
		return v.AsString(), nil
	}
	return pyStr(v)
}

// pyStringFilter is Jinja2's string filter: str() of the value.
func pyStringFilter(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.NewString(""), nil
	}
	return pyPrint(args, nil)
}

// pyJoin is Jinja2's join filter: str() of each item (or of each item's
// attribute), joined by d. A string is joined by its characters and a dict
// by its keys, as Python iterates them.
func pyJoin(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Value{}, errors.New("join: missing value")
	}
	sep := ""
	if d, ok := filterArg(args, kwargs, 1, "d"); ok {
		s, err := pyText(d)
		if err != nil {
			return jinja.Value{}, err
		}
		sep = s
	}
	items, err := pyItems(args[0], "join")
	if err != nil {
		return jinja.Value{}, err
	}
	attr, hasAttr := filterArg(args, kwargs, 2, "attribute")
	if hasAttr && (attr.IsNone() || attr.IsUndefined()) {
		hasAttr = false
	}
	var b strings.Builder
	for i, item := range items {
		if hasAttr {
			if !attr.IsString() || !item.IsDict() {
				return jinja.Value{}, fmt.Errorf("%w: join by an attribute of a %s", ErrUnsupported, pyTypeName(item))
			}
			// Jinja2's attribute lookup gives Undefined for a missing key,
			// and str(Undefined) is "".
			got, ok := item.AsDict().Get(attr.AsString())
			if !ok {
				got = jinja.Undefined()
			}
			item = got
		}
		s, err := pyText(item)
		if err != nil {
			return jinja.Value{}, err
		}
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteString(s)
	}
	return jinja.NewString(b.String()), nil
}

// pyTypeName names a value's Python type, for errors.
func pyTypeName(v jinja.Value) string {
	switch {
	case v.IsList():
		return "list"
	case v.IsDict():
		return "dict"
	case v.IsString():
		return "str"
	case v.IsInt(), v.IsFloat():
		return "number"
	case v.IsBool():
		return "bool"
	case v.IsNone():
		return "None"
	case v.IsUndefined():
		return "undefined"
	}
	return "callable"
}

// pyRepr writes repr(v) for the values a template sees from a request:
// strings, numbers, booleans, None, lists and dicts, and an undefined
// value as Jinja2's Undefined prints. A marked number is written with its
// mark, for the render's check to refuse (see pyPrint). A callable inside
// a container is refused: Jinja2 would print a name this engine does not
// have.
func pyRepr(b *strings.Builder, v jinja.Value, depth int) error {
	if depth > maxJSONDepth {
		return fmt.Errorf("%w: a value nested too deep to print", ErrUnsupported)
	}
	switch {
	case v.IsString():
		s := v.AsString()
		if strings.HasPrefix(s, pyNumMark) {
			b.WriteString(s)
			return nil
		}
		pyfmt.WriteStringRepr(b, s)
	case v.IsList():
		b.WriteByte('[')
		for i, item := range v.AsList().Items {
			if i > 0 {
				b.WriteString(", ")
			}
			if err := pyRepr(b, item, depth+1); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		b.WriteByte('{')
		for i, k := range d.Keys {
			if i > 0 {
				b.WriteString(", ")
			}
			pyfmt.WriteStringRepr(b, k)
			b.WriteString(": ")
			if err := pyRepr(b, d.Data[k], depth+1); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case v.IsUndefined():
		b.WriteString("Undefined") // Jinja2's Undefined.__repr__
	case v.IsCallable():
		return fmt.Errorf("%w: repr() of a %s in a template", ErrUnsupported, pyTypeName(v))
	default:
		s, err := pyStr(v)
		if err != nil {
			return err
		}
		b.WriteString(s)
	}
	return nil
}

// pyNumberStr is str() of a number carried as its json.dumps text behind
// pyNumMark: the same digits, with Python's spelling of the infinities.
func pyNumberStr(text string) string {
	switch text {
	case "Infinity":
		return "inf"
	case "-Infinity":
		return "-inf"
	case "NaN":
		return "nan"
	}
	return text
}
