package tokenize

import (
	"encoding/json"
	"fmt"
	"sync"

	"github.com/ardanlabs/jinja"
	"github.com/zeebo/xxh3"
)

// toolsCacheBytes bounds the raw tools JSON a template's cache holds; the
// decoded values take about five times as much (BenchmarkAgentTools: 236
// KB allocated for 47 KB of JSON), so about 5 MB a model. A fleet's
// agents send a handful of distinct lists.
const toolsCacheBytes = 1 << 20

// minCachedTools is the smallest tools JSON worth caching: decoding a
// short list costs about what hashing and copying it does.
const minCachedTools = 2 << 10

// toolsCache maps a request's raw tools (by hash and length) to what
// requestTools made of them. Agents resend one tools list on every turn,
// and decoding a coding agent's (tens of KB) costs more than the rest of
// the render; copying the cached value costs a fraction of that. Each
// render gets its own copy (copyValue), so a template that changes its
// tools cannot change the next request's. The zero value is ready; it is
// safe for concurrent use.
type toolsCache struct {
	mu           sync.Mutex
	lru          *lru[toolsKey, jinja.Value]
	hits, misses uint64 // lookups of tools lists large enough to cache
}

// stats returns the cache's hits and misses and the raw JSON bytes it
// holds.
func (tc *toolsCache) stats() (hits, misses uint64, bytes int) {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.lru != nil {
		bytes = tc.lru.size()
	}
	return tc.hits, tc.misses, bytes
}

type toolsKey struct {
	h xxh3.Uint128
	n int
}

// toolsValue is requestTools(raw), from the cache when raw was seen.
func (c *ChatTemplate) toolsValue(raw json.RawMessage) (jinja.Value, error) {
	if len(raw) < minCachedTools {
		return requestTools(raw)
	}
	tc := &c.toolsCache
	k := toolsKey{xxh3.Hash128(raw), len(raw)}
	tc.mu.Lock()
	if tc.lru == nil {
		tc.lru = newLRU[toolsKey, jinja.Value](toolsCacheBytes)
	}
	v, ok := tc.lru.get(k)
	if ok {
		tc.hits++
	} else {
		tc.misses++
	}
	tc.mu.Unlock()
	if ok {
		return copyValue(v), nil
	}
	v, err := requestTools(raw)
	if err != nil {
		return v, err
	}
	tc.mu.Lock()
	tc.lru.put(k, copyValue(v), len(raw))
	tc.mu.Unlock()
	return v, nil
}

// copyValue is a deep copy of a decoded JSON value: new lists and dicts
// (keys in order), the same immutable scalars.
func copyValue(v jinja.Value) jinja.Value {
	switch {
	case v.IsList():
		src := v.AsList().Items
		items := make([]jinja.Value, len(src))
		for i, x := range src {
			items[i] = copyValue(x)
		}
		return jinja.NewList(items)
	case v.IsDict():
		src := v.AsDict()
		out := jinja.NewDict()
		d := out.AsDict()
		for _, k := range src.Keys {
			d.Set(k, copyValue(src.Data[k]))
		}
		return out
	}
	return v
}

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
