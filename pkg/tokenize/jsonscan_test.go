package tokenize

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// benchMessages is a converted agent conversation's messages array: user
// turns as text parts, assistant turns with tool calls (arguments as JSON
// strings), tool results, about size bytes of JSON.
func benchMessages(b *testing.B, size int) []byte {
	rng := rand.New(rand.NewPCG(21, 22))
	var msgs []map[string]any
	var raw []byte
	for len(raw) < size {
		n := len(msgs)
		text := longMessage(rng, n)
		if size < 8<<10 {
			text = text[:min(len(text), size/4)]
		}
		switch n % 3 {
		case 0:
			msgs = append(msgs, map[string]any{"role": "user", "content": []map[string]any{{"type": "text", "text": text}}})
		case 1:
			msgs = append(msgs, map[string]any{"role": "assistant", "content": nil, "tool_calls": []map[string]any{{
				"id": fmt.Sprintf("call_%d", n), "type": "function", "function": map[string]any{
					"name": "grep", "arguments": fmt.Sprintf(`{"pattern":"index %d","limit":%d,"regex":true}`, n, 10+n)}}}})
		default:
			msgs = append(msgs, map[string]any{"role": "tool", "tool_call_id": fmt.Sprintf("call_%d", n-1), "content": text,
				"meta": map[string]any{"rows": n * 17, "score": 0.25 * float64(n), "cached": n%2 == 0}})
		}
		var err error
		if raw, err = json.Marshal(msgs); err != nil {
			b.Fatal(err)
		}
	}
	return raw
}

// BenchmarkJSONReaders times the package's JSON readers on their own:
// jsonValue (the template values of a request that is not a plain chat)
// on a small and a ≈229 KB messages array, arrayElements (a converted
// request's conversation keys) on the large one, and parseRenderResponse
// on a render endpoint's answer of 60k token ids.
func BenchmarkJSONReaders(b *testing.B) {
	small, large := benchMessages(b, 1<<10), benchMessages(b, 229<<10)
	var sb strings.Builder
	sb.WriteString(`{"request_id":"cmpl-0","token_ids":[`)
	for i := range 60000 {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprint(&sb, (i*7919)%151000)
	}
	sb.WriteString(`],"sampling_params":{"max_tokens":64,"temperature":0.7,"stop":["</s>","\n\n"],"n":1},"features":null,"cache_salt":null}`)
	render := []byte(sb.String())
	for _, c := range []struct {
		name string
		raw  []byte
		read func([]byte) error
	}{
		{"jsonValue/small", small, func(raw []byte) error { _, err := jsonValue(raw); return err }},
		{"jsonValue/229KB", large, func(raw []byte) error { _, err := jsonValue(raw); return err }},
		{"arrayElements/229KB", large, func(raw []byte) error {
			if arrayElements(raw) == nil {
				return fmt.Errorf("not split")
			}
			return nil
		}},
		{"parseRenderResponse/60k", render, func(raw []byte) error { _, err := parseRenderResponse(raw); return err }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.raw)))
			b.ReportAllocs()
			for b.Loop() {
				if err := c.read(c.raw); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
