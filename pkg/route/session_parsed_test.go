package route_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/openai"
	"github.com/kvroute/kvroute/pkg/route"
	"github.com/kvroute/kvroute/pkg/tokenize/parsedchat"
)

const model = "m"

func chat(msgs string) route.Request {
	return route.Request{Model: model, Input: route.TokenizeInput{Chat: true, Messages: json.RawMessage(msgs)}}
}

// The request parser's messages give the same key as decoding the raw
// array: a router fed by ext_proc (parsed) and one fed raw messages agree.
func TestSessionKeyParsedMatchesRaw(t *testing.T) {
	bodies := []string{
		`[{"role":"system","content":"tools"},{"role":"user","content":[{"type":"text","text":"fix"}]},{"role":"assistant","content":null,"tool_calls":[{"id":"c1"}]},{"role":"tool","content":"out"}]`,
		`[ {"role":"user", "content":"h\u00e9"} ,
		  {"role":"assistant","content":"hi","name":"bot"}, {"role":"user","content":"again"}]`,
		`[{"role":"user","content":"first turn only"}]`,
	}
	for _, b := range bodies {
		body := `{"model":"` + model + `","messages":` + b + `}`
		p, err := openai.ParseChat([]byte(body))
		if err != nil {
			t.Fatalf("parse %s: %v", body, err)
		}
		raw := chat(string(p.Messages))
		parsed := raw
		parsed.Input.ChatMessages = parsedchat.Messages(p.ChatMessages)
		if kr, kp := route.SessionKey(raw), route.SessionKey(parsed); kr != kp {
			t.Errorf("%s: raw key %q, parsed key %q", b, kr, kp)
		}
	}
	// The parsed path reads only the parsed messages.
	r := chat(`[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]`)
	k := route.SessionKey(r)
	r.Input.ChatMessages = []route.ChatMessage{{Role: "user", Raw: json.RawMessage(`{"role":"user","content":"zzz"}`)}, {Role: "assistant", Raw: json.RawMessage(`{"role":"assistant","content":"b"}`)}}
	if route.SessionKey(r) == k {
		t.Error("parsed messages ignored")
	}
}

// BenchmarkSessionKey: a tool-using conversation's fourth turn, keyed from
// the raw messages and from the parser's.
func BenchmarkSessionKey(b *testing.B) {
	body := `{"model":"` + model + `","messages":[{"role":"system","content":"` + strings.Repeat("You are a coding agent. ", 200) + `"},{"role":"user","content":"fix the bug"},{"role":"assistant","content":"looking"},{"role":"tool","content":"` + strings.Repeat(`line of output\n`, 300) + `"}]}`
	p, err := openai.ParseChat([]byte(body))
	if err != nil {
		b.Fatal(err)
	}
	raw := chat(string(p.Messages))
	parsed := raw
	parsed.Input.ChatMessages = parsedchat.Messages(p.ChatMessages)
	b.Run("raw", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = route.SessionKey(raw)
		}
	})
	b.Run("parsed", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = route.SessionKey(parsed)
		}
	})
}
