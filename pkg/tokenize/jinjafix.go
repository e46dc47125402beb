package tokenize

import (
	"reflect"
	_ "unsafe" // go:linkname

	"github.com/ardanlabs/jinja"
)

// The Jinja engine (github.com/ardanlabs/jinja v1.8.0, pinned in go.mod)
// implements tojson and trim the Go way: tojson prints 2.0 as 2, 1e16 as
// 1e+16's Go spelling, integers beyond int64 as floats, ignores ensure_ascii
// and sort_keys and escapes U+2028/U+2029; trim strips Go's white space,
// which lacks U+001C..U+001F. Its newer releases need a newer Go than this
// module builds with, and it has no public way to register filters, so the
// two filters are replaced in its shared built-in scope, once, at package
// initialisation (before any render can run). TestJinjaFiltersReplaced
// fails if a version bump changes the engine's layout.

// jinjaScope mirrors the engine's unexported scope struct.
type jinjaScope struct {
	vars   map[string]jinja.Value
	parent *jinjaScope
}

//go:linkname jinjaBuiltins github.com/ardanlabs/jinja.cachedBuiltins
var jinjaBuiltins *jinjaScope

// jinjaFiltersReplaced reports whether init could install the filters.
var jinjaFiltersReplaced bool

func init() {
	s := jinjaBuiltins
	if s == nil || s.vars == nil {
		return
	}
	old, ok := s.vars["__filter_tojson"]
	if !ok || reflect.TypeOf(old) != reflect.TypeOf(jinja.Value{}) || !old.IsCallable() {
		return
	}
	s.vars["__filter_tojson"] = jinja.NewCallable("tojson", pyTojson)
	s.vars["__filter_trim"] = jinja.NewCallable("trim", pyTrim)
	jinjaFiltersReplaced = true
}
