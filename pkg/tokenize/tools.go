package tokenize

import (
	"fmt"

	"github.com/ardanlabs/jinja"
)

// engineTools rewrites a request's tools, in place, into the dicts vLLM
// hands the chat template. vLLM does not pass the client's JSON through: it
// validates each tool as a ChatCompletionToolsParam and renders
// tool.model_dump(), whose serializers (vLLM 0.33:
// entrypoints/openai/chat_completion/protocol.py and
// entrypoints/generate/base/protocol.py) give
//
//	{"type": "function",
//	 "function": {"name": ..., "description": ... or None,
//	              "parameters": ... or None,
//	              "strict": ...,          (only when set)
//	              "defer_loading": ...},  (only when set)
//	 "defer_loading": ...}                (only when set)
//
// in that key order, whatever order the client sent, with description and
// parameters present (None) when the client left them out, every other key
// dropped, and a tool-level defer_loading copied into a function that has
// none. A template that prints tools with tojson (most do) prints exactly
// these keys, so a client's own order or a missing description changes every
// token after the tools. A tool vLLM would refuse (no function object, a
// type other than "function", a name that is not a string) is ErrBadMessages;
// a flag that is not a JSON boolean (pydantic's lax parsing would coerce
// "yes" or 1) is ErrUnsupported, not guessed.
func engineTools(tools *jinja.List) error {
	for i, t := range tools.Items {
		out, err := engineTool(t)
		if err != nil {
			return fmt.Errorf("tools[%d]: %w", i, err)
		}
		tools.Items[i] = out
	}
	return nil
}

func engineTool(t jinja.Value) (jinja.Value, error) {
	if !t.IsDict() {
		return jinja.Value{}, fmt.Errorf("%w: a tool is not an object", ErrBadMessages)
	}
	tool := t.AsDict()
	if typ, ok := tool.Get("type"); ok && !(typ.IsString() && typ.AsString() == "function") {
		return jinja.Value{}, fmt.Errorf("%w: tool type %s is not \"function\"", ErrBadMessages, typ.String())
	}
	fv, ok := tool.Get("function")
	if !ok || !fv.IsDict() {
		return jinja.Value{}, fmt.Errorf("%w: a tool has no function object", ErrBadMessages)
	}
	fn := fv.AsDict()
	toolDefer, err := optionalBool(tool, "defer_loading")
	if err != nil {
		return jinja.Value{}, err
	}
	name, ok := fn.Get("name")
	if !ok || !name.IsString() {
		return jinja.Value{}, fmt.Errorf("%w: a tool's function has no name string", ErrBadMessages)
	}
	outFn := jinja.NewDict()
	f := outFn.AsDict()
	f.Set("name", name)
	for _, k := range []string{"description", "parameters"} {
		v, ok := fn.Get(k)
		switch {
		case !ok || v.IsNone():
			f.Set(k, jinja.None())
		case k == "description" && !v.IsString(), k == "parameters" && !v.IsDict():
			return jinja.Value{}, fmt.Errorf("%w: a tool's function %s has the wrong type", ErrBadMessages, k)
		default:
			f.Set(k, v)
		}
	}
	strict, err := optionalBool(fn, "strict")
	if err != nil {
		return jinja.Value{}, err
	}
	if !strict.IsNone() {
		f.Set("strict", strict)
	}
	fnDefer, err := optionalBool(fn, "defer_loading")
	if err != nil {
		return jinja.Value{}, err
	}
	if fnDefer.IsNone() {
		fnDefer = toolDefer
	}
	if !fnDefer.IsNone() {
		f.Set("defer_loading", fnDefer)
	}
	out := jinja.NewDict()
	d := out.AsDict()
	d.Set("type", jinja.NewString("function"))
	d.Set("function", outFn)
	if !toolDefer.IsNone() {
		d.Set("defer_loading", toolDefer)
	}
	return out, nil
}

// optionalBool reads an optional boolean field: None when absent or null.
func optionalBool(d *jinja.Dict, key string) (jinja.Value, error) {
	v, ok := d.Get(key)
	switch {
	case !ok || v.IsNone():
		return jinja.None(), nil
	case v.IsBool():
		return v, nil
	}
	return jinja.Value{}, fmt.Errorf("%w: a tool's %s is not a JSON boolean", ErrUnsupported, key)
}
