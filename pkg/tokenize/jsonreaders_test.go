package tokenize

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/jsonscan"
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

// TestReadersRefuseWhatEncodingJSONRefuses: members skipped by the
// response readers are checked whole, nested keys and nesting included.
func TestReadersRefuseWhatEncodingJSONRefuses(t *testing.T) {
	deep := strings.Repeat("[", jsonscan.MaxDepth) + strings.Repeat("]", jsonscan.MaxDepth)
	for _, c := range []string{
		`{"a":{"\q":1},"token_ids":[1],"tokens":[1]}`,
		`{"a":{"x\u12":1},"token_ids":[1],"tokens":[1]}`,
		`{"a":` + deep + `,"token_ids":[1],"tokens":[1]}`,
		`[{"token_ids":[1]},{"\q":1}]`,
		`[{"token_ids":[1]},` + deep + `]`,
	} {
		if json.Valid([]byte(c)) {
			t.Fatalf("%.40s: valid", c)
		}
		if _, err := parseRenderResponse([]byte(c)); err == nil {
			t.Errorf("%.60s: parseRenderResponse accepted it", c)
		}
		if c[0] == '{' {
			if _, err := parseTokenizeResponse([]byte(c)); err == nil {
				t.Errorf("%.60s: parseTokenizeResponse accepted it", c)
			}
		}
	}
	ok := `[{"token_ids":[1]},` + deep[1:len(deep)-1] + `]`
	if got, err := parseRenderResponse([]byte(ok)); err != nil || !json.Valid([]byte(ok)) || len(got) != 1 {
		t.Errorf("nesting at encoding/json's bound: %v, %v", got, err)
	}
}

// refTokenizeResponse reads a /tokenize answer with encoding/json, member
// by member as parseTokenizeResponse does (exact keys, the last of a
// repeated one; encoding/json's struct decoding matches keys without
// case).
func refTokenizeResponse(b []byte) (tokenizeResponse, error) {
	var out tokenizeResponse
	if !json.Valid(b) {
		return out, errors.New("invalid JSON")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return out, errors.New("not an object")
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return out, err
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return out, err
		}
		switch tok {
		case "tokens":
			err = json.Unmarshal(raw, &out.Tokens)
		case "count":
			err = json.Unmarshal(raw, &out.Count)
		}
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// FuzzParseTokenizeResponse: parseTokenizeResponse accepts what
// encoding/json reads (member by member) and returns the same ids and
// count, and refuses the rest.
func FuzzParseTokenizeResponse(f *testing.F) {
	for _, s := range []string{`{"count":3,"tokens":[1,2,3]}`, ` { "tokens" : [ 0 , 4294967295 ] } `, `{"tokens":null,"x":[{"a":"\u00e9"},-1.5e3,true]}`,
		`{"t\u006fkens":[7],"tokens":[8]}`, `{"tokens":[01]}`, `{"a":{"\q":1},"tokens":[1]}`, `{"count":"3"}`, `{"tokens":[1e3]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := parseTokenizeResponse(b)
		want, werr := refTokenizeResponse(b)
		if (err == nil) != (werr == nil) {
			t.Fatalf("%q: parser err %v, encoding/json err %v", b, err, werr)
		}
		if err == nil && (got.Count != want.Count || !slices.Equal(got.Tokens, want.Tokens) || (got.Tokens == nil) != (want.Tokens == nil)) {
			t.Fatalf("%q: got %d %v, encoding/json %d %v", b, got.Count, got.Tokens, want.Count, want.Tokens)
		}
	})
}
