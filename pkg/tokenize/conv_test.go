package tokenize

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/openai"
	"github.com/kvroute/kvroute/pkg/route"
	"github.com/kvroute/kvroute/pkg/tokenize/parsedchat"
)

// parsedInput is the tokenizer input the request path builds for msgs:
// the body parsed by openai.Parse, its messages decoded (with their raw
// JSON, which keys the conversation memo).
func parsedInput(t testing.TB, msgs []map[string]any, tools []any, gen bool) route.TokenizeInput {
	t.Helper()
	req := map[string]any{"model": "m", "messages": msgs, "add_generation_prompt": gen}
	if tools != nil {
		req["tools"] = tools
	}
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	r, err := openai.Parse("/v1/chat/completions", body)
	if err != nil {
		t.Fatal(err)
	}
	return route.TokenizeInput{Chat: true, Messages: r.Messages, Tools: r.Tools, AddGenerationPrompt: r.AddGenerationPrompt,
		ChatMessages: parsedchat.Messages(r.ChatMessages)}
}

// agentTurns is an agent's conversation, one request per turn: reasoning
// (as reasoning_content and as <think> in content), tool calls and tool
// results, so that templates which render earlier turns differently once
// a new user message arrives (Qwen3 drops the reasoning of turns before
// the last query) do so here.
func agentTurns(rng *rand.Rand) ([][]map[string]any, []any) {
	tools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "search", "description": "Search the index.",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"q": map[string]any{"type": "string"}}, "required": []any{"q"}}}}}
	var turns [][]map[string]any
	msgs := []map[string]any{{"role": "system", "content": "You are a careful agent.\n" + longMessage(rng, 0)}}
	for turn := 1; turn <= 4; turn++ {
		msgs = append(msgs, map[string]any{"role": "user", "content": longMessage(rng, turn)})
		turns = append(turns, slices.Clone(msgs))
		call := map[string]any{"id": fmt.Sprintf("call_%d", turn), "type": "function",
			"function": map[string]any{"name": "search", "arguments": fmt.Sprintf(`{"q": "step %d"}`, turn)}}
		msgs = append(msgs, map[string]any{"role": "assistant", "content": "", "reasoning_content": "I should search.\n" + longMessage(rng, turn+50),
			"tool_calls": []any{call}})
		msgs = append(msgs, map[string]any{"role": "tool", "tool_call_id": call["id"], "content": longMessage(rng, turn+60)})
		turns = append(turns, slices.Clone(msgs))
		msgs = append(msgs, map[string]any{"role": "assistant", "content": "<think>\nchecking " + longMessage(rng, turn+70) + "</think>\n\n" + longMessage(rng, turn+80)})
	}
	return turns, tools
}

// plainTurns alternates long user and assistant messages after a system
// prompt; each request ends with a user message.
func plainTurns(rng *rand.Rand) [][]map[string]any {
	var turns [][]map[string]any
	msgs := []map[string]any{{"role": "system", "content": longMessage(rng, 0)}}
	for turn := 1; turn <= 8; turn++ {
		msgs = append(msgs, map[string]any{"role": "user", "content": longMessage(rng, turn)})
		turns = append(turns, slices.Clone(msgs))
		msgs = append(msgs, map[string]any{"role": "assistant", "content": longMessage(rng, turn+100)})
	}
	return turns
}

// TestConversationReuseEqualsColdEncoding drives conversations through a
// Local with its memo and checks every turn's ids against a Local with
// no cache at all (render and encode from scratch), for every family with
// a chat template: plain turns, an agent's turns (tool calls, reasoning),
// a retried request, an edited history and a request without the
// generation prompt. Where a template refuses an input, both must refuse
// it. The memo must actually have served ids.
func TestConversationReuseEqualsColdEncoding(t *testing.T) {
	for _, name := range fixtureNames {
		if noChatTemplate[name] {
			continue
		}
		t.Run(name, func(t *testing.T) {
			enc := loadEncoder(t, name)
			tmpl := loadTemplate(t, name)
			cold := NewLocal(enc, tmpl, 0, 0)
			memo := NewLocal(enc, tmpl, 0, 64<<20)
			rng := rand.New(rand.NewPCG(5, 6))
			check := func(what string, in route.TokenizeInput) bool {
				t.Helper()
				want, errW := cold.Tokenize(in)
				got, errG := memo.Tokenize(in)
				if (errW != nil) != (errG != nil) {
					t.Fatalf("%s: cold error %v, memo error %v", what, errW, errG)
				}
				if errW != nil {
					return false
				}
				if !slices.Equal(got.IDs, want.IDs) {
					i := 0
					for i < min(len(got.IDs), len(want.IDs)) && got.IDs[i] == want.IDs[i] {
						i++
					}
					t.Fatalf("%s: memo ids differ from cold ids at %d (of %d / %d)", what, i, len(got.IDs), len(want.IDs))
				}
				return true
			}
			plain := plainTurns(rng)
			for i, msgs := range plain {
				if !check(fmt.Sprintf("plain turn %d", i+1), parsedInput(t, msgs, nil, true)) {
					t.Fatalf("plain turn %d: refused", i+1)
				}
			}
			_, _, reused, _ := memo.conv.stats()
			if reused == 0 {
				t.Fatal("no ids were reused from the memo over 8 plain turns")
			}
			last := plain[len(plain)-1]
			check("retried request", parsedInput(t, last, nil, true))
			check("no generation prompt", parsedInput(t, last, nil, false))
			edited := slices.Clone(last)
			edited[1] = map[string]any{"role": "user", "content": "edited: " + longMessage(rng, 999)}
			check("edited history", parsedInput(t, append(edited, map[string]any{"role": "assistant", "content": "ok"},
				map[string]any{"role": "user", "content": longMessage(rng, 1000)}), nil, true))

			turns, tools := agentTurns(rng)
			rendered := 0
			for i, msgs := range turns {
				if check(fmt.Sprintf("agent turn %d", i+1), parsedInput(t, msgs, tools, true)) {
					rendered++
				}
			}
			t.Logf("%d of %d agent turns rendered", rendered, len(turns))

			// The same turns unparsed, as Responses and Anthropic Messages
			// requests arrive (their converted messages are keyed by the
			// array's elements), on a fresh memo.
			memo = NewLocal(enc, tmpl, 0, 64<<20)
			for i, msgs := range plain {
				in := parsedInput(t, msgs, nil, true)
				in.ChatMessages = nil
				check(fmt.Sprintf("unparsed plain turn %d", i+1), in)
			}
			for i, msgs := range turns {
				in := parsedInput(t, msgs, tools, true)
				in.ChatMessages = nil
				check(fmt.Sprintf("unparsed agent turn %d", i+1), in)
			}
			if _, _, reused, _ := memo.conv.stats(); reused == 0 {
				t.Fatal("no ids were reused from the memo for unparsed messages")
			}
		})
	}
}

func TestArrayElements(t *testing.T) {
	for raw, want := range map[string][]string{
		`[]`:    {},
		` [ ] `: {},
		`[{"a":"],}"}, {"b":[1,{"c":"\"]"}]} ,"x"]`: {`{"a":"],}"}`, `{"b":[1,{"c":"\"]"}]}`, `"x"`},
		`[1]`:             {`1`},
		`{}`:              nil,
		`[1,`:             nil,
		`[,1]`:            nil,
		`["unterminated]`: nil,
		`[tru]`:           nil,
		`[1 2]`:           nil,
		`[1] x`:           nil,
		`[}]`:             nil,
		`[{"\q":1}]`:      nil,
	} {
		got := arrayElements([]byte(raw))
		if (got == nil) != (want == nil) || len(got) != len(want) {
			t.Errorf("%s: %q, want %q", raw, got, want)
			continue
		}
		for i := range got {
			if string(got[i]) != want[i] {
				t.Errorf("%s: element %d %q, want %q", raw, i, got[i], want[i])
			}
		}
	}
}

// TestQwen3HistoryRendersDifferently: the agent script does exercise a
// history whose rendering changes between turns (Qwen3 keeps an earlier
// turn's reasoning only until the next user query), so the memo's reuse
// must stop inside the previous prompt, not at its end.
func TestQwen3HistoryRendersDifferently(t *testing.T) {
	tmpl := loadTemplate(t, "qwen3")
	turns, tools := agentTurns(rand.New(rand.NewPCG(5, 6)))
	toolsJSON, _ := json.Marshal(tools)
	changed := 0
	var prev string
	for _, msgs := range turns {
		raw, _ := json.Marshal(msgs)
		text, err := tmpl.Render(ChatInput{Messages: raw, Tools: toolsJSON, AddGenerationPrompt: false})
		if err != nil {
			t.Fatal(err)
		}
		if prev != "" && !strings.HasPrefix(text, prev) {
			changed++
		}
		prev = text
	}
	if changed == 0 {
		t.Fatal("every turn's prompt extends the previous one: the script does not test a changing history")
	}
}

// TestEncodeReusingEqualsEncode checks reuse at the encoder level for all
// seven families (gpt-oss ships no chat template): a prompt grown turn by
// turn from the family's own added tokens, each turn encoded reusing the
// previous one, equals encoding it whole; and an earlier turn's text
// edited in the middle still equals it.
func TestEncodeReusingEqualsEncode(t *testing.T) {
	for _, name := range fixtureNames {
		t.Run(name, func(t *testing.T) {
			enc := loadEncoder(t, name)
			var marks []string
			for i, a := range enc.added {
				if enc.safeCut[i] && len(marks) < 2 {
					marks = append(marks, a.content)
				}
			}
			if len(marks) < 2 {
				t.Fatalf("%d safe added tokens: cannot build turns", len(marks))
			}
			rng := rand.New(rand.NewPCG(9, 10))
			fx := loadFixtures(t, name)
			var text strings.Builder
			var base *convEntry
			reusedAll := 0
			for turn := 0; turn < 12; turn++ {
				fmt.Fprintf(&text, "%suser\n%s%s\n%sassistant\n%s", marks[0], fx.Plain[rng.IntN(len(fx.Plain))].Text, marks[1],
					marks[0], longMessage(rng, turn))
				s := text.String()
				if turn%4 == 3 { // an edit in the middle of the history
					mid := len(s) / 2
					for !utf8.RuneStart(s[mid]) {
						mid++
					}
					s = s[:mid] + "EDIT" + s[mid:]
				}
				e, reused, err := enc.encodeReusing(context.Background(), base, s, nil)
				if err != nil {
					t.Fatal(err)
				}
				want, err := enc.Encode(s, false)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(e.ids, want) {
					t.Fatalf("turn %d: reusing encoding differs from whole encoding", turn)
				}
				for _, c := range e.cuts {
					w, _ := enc.Encode(s[:c.off], false)
					if !slices.Equal(w, want[:c.ids]) {
						t.Fatalf("turn %d: cut at %d: ids before it are not the prefix's own encoding", turn, c.off)
					}
				}
				reusedAll += reused
				base = e
			}
			if reusedAll == 0 {
				t.Fatal("nothing was reused")
			}
		})
	}
}

// TestSafeCuts: a token is no safe cut when it right-strips or when a
// longer added token contains it.
func TestSafeCuts(t *testing.T) {
	got := safeCuts([]addedToken{{content: "<e>"}, {content: "<e>x"}, {content: "<s>", rstrip: true}, {content: "y<t>"}, {content: "<t>"}, {content: "<u>", lstrip: true}})
	want := []bool{false, true, false, true, false, true}
	if !slices.Equal(got, want) {
		t.Fatalf("safeCuts %v, want %v", got, want)
	}
}

// TestConversationMetrics: a conversation's later turns find their
// previous turn in the memo, and the per-model figures say so.
func TestConversationMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	tok, err := New(Config{Models: map[string]ModelConfig{"q": localConfig(t, "qwen3")}}, Options{Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	for i, msgs := range plainTurns(rand.New(rand.NewPCG(1, 1)))[:3] {
		if _, err := tok.Tokenize(context.Background(), "q", parsedInput(t, msgs, nil, true)); err != nil {
			t.Fatalf("turn %d: %v", i+1, err)
		}
	}
	hits := counterValue(t, reg, "kvroute_tokenizer_conversation_hits_total", "q")
	misses := counterValue(t, reg, "kvroute_tokenizer_conversation_misses_total", "q")
	reused := counterValue(t, reg, "kvroute_tokenizer_conversation_reused_tokens_total", "q")
	bytes := gaugeValue(t, reg, "kvroute_tokenizer_conversation_bytes", "q")
	if hits != 2 || misses != 1 || reused < 1000 || bytes <= 0 {
		t.Fatalf("conversation memo: %v hits, %v misses, %v reused tokens, %v bytes; want 2 hits, 1 miss, the history reused", hits, misses, reused, bytes)
	}
}

// FuzzArrayElements: arrayElements splits exactly the JSON arrays
// encoding/json reads, as encoding/json splits them.
func FuzzArrayElements(f *testing.F) {
	for _, s := range []string{`[]`, `[1, "a,]", {"b": [2, {"c": "\\\""}]}, null]`, ` [ {"k": "]"} ] `, `[tru]`, `[1 2]`, `[{"\q":1}]`, `[1] x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var want []json.RawMessage
		ok := json.Unmarshal(raw, &want) == nil && want != nil
		got := arrayElements(raw)
		if (got != nil) != ok {
			t.Fatalf("%q: split %v, encoding/json reads an array %v", raw, got != nil, ok)
		}
		if !ok {
			return
		}
		if len(got) != len(want) {
			t.Fatalf("%q: %d elements, encoding/json %d", raw, len(got), len(want))
		}
		for i := range got {
			if string(got[i]) != string(bytes.TrimSpace(want[i])) {
				t.Fatalf("%q: element %d %q, encoding/json %q", raw, i, got[i], want[i])
			}
		}
	})
}
