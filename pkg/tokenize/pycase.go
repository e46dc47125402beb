package tokenize

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
	"golang.org/x/text/cases"
	"golang.org/x/text/language"
)

// Jinja2's upper, lower, capitalize and title filters, as Python runs them
// on str() of the value. The engine's own print None as nothing, map case
// one code point to one (Python's str.upper turns ß into SS and ﬁ into
// FI, and lower keeps a word's final sigma), and its title starts a word
// after any non-letter ("user_id" becomes "User_Id"; Jinja2's "User_id":
// MiniCPM3 titles its tools' parameter names). Full case mapping is
// golang.org/x/text/cases, whose Unicode 15.0 tables (with Go before 1.27)
// are CPython 3.12's version. A marked number keeps its mark (pyText): the
// render's check refuses it.

// caseFilter is a filter that maps str() of its value with f.
func caseFilter(name string, f func(string) string) func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
	return func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) == 0 {
			return jinja.Value{}, errors.New(name + ": missing value")
		}
		s, err := pyText(args[0])
		if err != nil {
			return jinja.Value{}, err
		}
		return jinja.NewString(f(s)), nil
	}
}

// pyUpper is str.upper: full case mapping, no locale (ASCII by the
// strings package, which maps it the same).
func pyUpper(s string) string {
	if isASCII(s) {
		return strings.ToUpper(s)
	}
	return cases.Upper(language.Und).String(s)
}

// pyLower is str.lower: full case mapping, a final sigma as ς.
func pyLower(s string) string {
	if isASCII(s) {
		return strings.ToLower(s)
	}
	return cases.Lower(language.Und).String(s)
}

// pyCapitalize is str.capitalize (Python 3.8 on): the first character in
// title case, the rest lower-cased in the whole string's context (a final
// sigma after the first letter is still final).
func pyCapitalize(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	if n == 0 {
		return s
	}
	first := string(r)
	return cases.Title(language.Und, cases.NoLower).String(first) + strings.TrimPrefix(pyLower(s), pyLower(first))
}

// pyTitle is Jinja2's title filter: s split into runs of word breakers
// ('-', white space as str.isspace, '(', '{', '[', '<') and runs of the
// rest, each run's first character upper-cased (str.upper, not title
// case) and the run's rest lower-cased on its own.
func pyTitle(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	breaker := func(r rune) bool {
		return r == '-' || r == '(' || r == '{' || r == '[' || r == '<' || pyIsSpace(r)
	}
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		kind := breaker(r)
		j := i + n
		for j < len(s) {
			r2, n2 := utf8.DecodeRuneInString(s[j:])
			if breaker(r2) != kind {
				break
			}
			j += n2
		}
		b.WriteString(pyUpper(s[i : i+n]))
		b.WriteString(pyLower(s[i+n : j]))
		i = j
	}
	return b.String()
}

// isASCII reports whether s is all ASCII.
func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// Jinja2's first, last and list filters iterate their value as Python
// does: a list's items, a dict's keys, a string's characters. The engine's
// take only lists (first and last give nothing otherwise, and list wraps a
// dict or None in a list of one). A value Python cannot iterate is
// refused.

// pyItems is what iter(v) yields, for a list, a dict or a string.
func pyItems(v jinja.Value, filter string) ([]jinja.Value, error) {
	switch {
	case v.IsList():
		return v.AsList().Items, nil
	case v.IsDict():
		keys := v.AsDict().Keys
		items := make([]jinja.Value, len(keys))
		for i, k := range keys {
			items[i] = jinja.NewString(k)
		}
		return items, nil
	case v.IsString() && !strings.HasPrefix(v.AsString(), pyNumMark):
		var items []jinja.Value
		for _, r := range v.AsString() {
			items = append(items, jinja.NewString(string(r)))
		}
		return items, nil
	}
	return nil, fmt.Errorf("%w: %s of a %s in a template", ErrUnsupported, filter, pyTypeName(v))
}

// pyEnd is Jinja2's first (last false) or last: that item, or undefined
// when there is none.
func pyEnd(name string, last bool) func([]jinja.Value, map[string]jinja.Value) (jinja.Value, error) {
	return func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) == 0 {
			return jinja.Value{}, errors.New(name + ": missing value")
		}
		items, err := pyItems(args[0], name)
		if err != nil || len(items) == 0 {
			return jinja.Undefined(), err
		}
		if last {
			return items[len(items)-1], nil
		}
		return items[0], nil
	}
}

// pyList is Jinja2's list: a new list of the items.
func pyList(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Value{}, errors.New("list: missing value")
	}
	items, err := pyItems(args[0], "list")
	if err != nil {
		return jinja.Value{}, err
	}
	return jinja.NewList(slices.Clone(items)), nil
}
