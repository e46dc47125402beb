package tokenize

import (
	"reflect"
	"strings"
	"unsafe"

	"github.com/ardanlabs/jinja"
)

// The Jinja engine (github.com/ardanlabs/jinja v1.8.0, pinned in go.mod)
// implements tojson and trim the Go way: tojson prints 2.0 as 2, 1e16 as
// 1e+16's Go spelling, integers beyond int64 as floats, ignores ensure_ascii
// and sort_keys and escapes U+2028/U+2029; trim strips Go's white space,
// which lacks U+001C..U+001F. Its string and join filters print None as
// nothing and lists without Python's repr, its upper, lower, capitalize
// and title map case otherwise than Python, and its first, last and list
// iterate only lists (pycase.go). Its newer releases need a newer Go than
// this module builds with, and it has no public way to register filters,
// so those eleven are replaced, and
// kvroute_print (pyprint.go) added, in its shared built-in scope, once, at
// package initialisation (before any render can run).
// TestJinjaFiltersReplaced fails if a version bump changes the engine's
// layout.

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
	s.vars["__filter_string"] = jinja.NewCallable("string", pyStringFilter)
	s.vars["__filter_join"] = jinja.NewCallable("join", pyJoin)
	s.vars["__filter_"+printFilter] = jinja.NewCallable(printFilter, pyPrint)
	s.vars["__filter_upper"] = jinja.NewCallable("upper", caseFilter("upper", pyUpper))
	s.vars["__filter_lower"] = jinja.NewCallable("lower", caseFilter("lower", pyLower))
	s.vars["__filter_capitalize"] = jinja.NewCallable("capitalize", caseFilter("capitalize", pyCapitalize))
	s.vars["__filter_title"] = jinja.NewCallable("title", caseFilter("title", pyTitle))
	s.vars["__filter_first"] = jinja.NewCallable("first", pyEnd("first", false))
	s.vars["__filter_last"] = jinja.NewCallable("last", pyEnd("last", true))
	s.vars["__filter_list"] = jinja.NewCallable("list", pyList)
	jinjaFiltersReplaced = true
}

// The engine renders into a strings.Builder that starts empty and doubles:
// a 229 KB prompt is copied about twice over and allocates four times its
// size before the render returns, and every one of those bytes is garbage
// the collector then walks past. renderSized runs the engine's own node
// walk with the builder grown first to the caller's size hint. It needs the
// layouts of the engine's unexported Template and evaluator (pinned at
// v1.8.0); sizedRenderOK, set once at initialisation by rendering a probe
// template both ways, turns it off if they do not agree, and
// TestRenderSized fails on a version bump that changes them.

// jinjaTemplate mirrors jinja.Template: the compiled nodes (a slice of the
// engine's unexported node interface, passed through untouched) and the
// source.
type jinjaTemplate struct {
	nodes jinjaNodes
	src   string
}

// jinjaNodes is the header of the engine's []node.
type jinjaNodes struct {
	ptr      unsafe.Pointer
	len, cap int
}

// jinjaEvaluator mirrors the engine's unexported evaluator struct.
type jinjaEvaluator struct {
	scope    *jinjaScope
	builtins *jinjaScope
	output   strings.Builder
}

//go:linkname jinjaExecNodes github.com/ardanlabs/jinja.(*evaluator).execNodes
func jinjaExecNodes(e *jinjaEvaluator, nodes jinjaNodes) error

// renderSized renders t with data like t.RenderValues, into an output
// buffer of at least hint bytes.
func renderSized(t *jinja.Template, data map[string]jinja.Value, hint int) (string, error) {
	if !sizedRenderOK {
		return t.RenderValues(data)
	}
	return walkSized(t, data, hint)
}

// walkSized is the engine's render (a scope of its own holding a copy of
// data, over the shared built-ins) with the output grown to hint first.
func walkSized(t *jinja.Template, data map[string]jinja.Value, hint int) (string, error) {
	e := &jinjaEvaluator{builtins: jinjaBuiltins}
	e.output.Grow(hint)
	e.scope = &jinjaScope{vars: make(map[string]jinja.Value, len(data)), parent: jinjaBuiltins}
	for k, v := range data {
		e.scope.vars[k] = v
	}
	if err := jinjaExecNodes(e, (*jinjaTemplate)(unsafe.Pointer(t)).nodes); err != nil {
		return "", err
	}
	return e.output.String(), nil
}

// sizedRenderOK reports whether renderSized may run the engine's node walk
// itself: jinja.Template has the layout jinjaTemplate mirrors, and a probe
// template renders the same both ways.
var sizedRenderOK = checkSizedRender()

func checkSizedRender() (ok bool) {
	tt := reflect.TypeFor[jinja.Template]()
	if tt.NumField() != 2 || tt.Size() != unsafe.Sizeof(jinjaTemplate{}) ||
		tt.Field(0).Name != "nodes" || tt.Field(0).Type.Kind() != reflect.Slice || tt.Field(0).Offset != 0 ||
		tt.Field(1).Name != "src" || tt.Field(1).Type.Kind() != reflect.String ||
		tt.Field(1).Offset != unsafe.Offsetof(jinjaTemplate{}.src) {
		return false
	}
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	const probe = `{% macro m(x) %}[{{ x }}]{% endmacro %}{% set ns = namespace(n=0) %}` +
		`{%- for s in items %}{{ m(s) }}{% set ns.n = ns.n + 1 %}{% if loop.last %}{{ ns.n }}{{ tail | trim }}{% endif %}{% endfor %}`
	t, err := jinja.Compile(probe)
	if err != nil {
		return false
	}
	data := map[string]jinja.Value{
		"items": jinja.NewList([]jinja.Value{jinja.NewString("a"), jinja.NewString("b")}),
		"tail":  jinja.NewString(" z "),
	}
	want, err := t.RenderValues(data)
	if err != nil || want != "[a][b]2z" {
		return false
	}
	got, err := walkSized(t, data, 0)
	return err == nil && got == want
}
