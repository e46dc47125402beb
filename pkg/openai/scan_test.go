package openai

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kvroute/kvroute/pkg/tokenize"
)

func TestParseIdentityFields(t *testing.T) {
	for _, tc := range []struct {
		body                      string
		user, cacheKey, sessionID string
	}{
		{`{"model":"m","messages":[{}]}`, "", "", ""},
		{`{"model":"m","messages":[{}],"user":"u1","prompt_cache_key":"k"}`, "u1", "k", ""},
		{`{"model":"m","messages":[{}],"metadata":{"conversation_id":"c9","x":"y"}}`, "", "", "c9"},
		{`{"model":"m","messages":[{}],"metadata":{"session_id":"s1","conversation_id":"c9"}}`, "", "", "s1"},
		{`{"model":"m","messages":[{}],"conversation":{"id":"conv_1"},"metadata":{"session_id":"s1"}}`, "", "", "conv_1"},
		{`{"model":"m","messages":[{}],"conversation":"conv_2","session_id":"top"}`, "", "", "top"},
		{`{"model":"m","messages":[{}],"conversation_id":"cid","prompt_cache_key":7,"metadata":"x"}`, "", "", "cid"},
		{`{"model":"m","messages":[{}],"user":null,"session_id":["x"]}`, "", "", ""},
	} {
		got, err := ParseChat([]byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		if got.User != tc.user || got.PromptCacheKey != tc.cacheKey || got.SessionID != tc.sessionID {
			t.Errorf("%s: user %q key %q session %q; want %q %q %q", tc.body, got.User, got.PromptCacheKey, got.SessionID, tc.user, tc.cacheKey, tc.sessionID)
		}
	}
}

func TestParseChatMessages(t *testing.T) {
	body := `{"messages":[` +
		`{"role":"user","content":"a\u00e9\ud83d\ude00\n\"q\"\/"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]},` +
		`{"role":"user","content":[{"type":"text","text":"one"},"two",{"type":"image_url","image_url":{"url":"x"}},{"text":"three","type":"text"}]},` +
		`{"role":"tool","name":"f","content":"ok","content":"last wins"},` +
		`{"ro\u006ce":"system","content":"\ud800 lone"}` +
		`],"model":"m"}`
	got, err := ParseChat([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	want := []Message{
		{Role: "user", Content: "aé😀\n\"q\"/"},
		{Role: "assistant"},
		{Role: "user", Content: "one\ntwo\nthree", NonText: true},
		{Role: "tool", Name: "f", Content: "last wins"},
		{Role: "system", Content: "\uFFFD lone"},
	}
	for i := range got.ChatMessages {
		got.ChatMessages[i].Raw = nil
	}
	if d := cmp.Diff(want, got.ChatMessages); d != "" {
		t.Errorf("messages (-want +got):\n%s", d)
	}
	if !json.Valid(got.Messages) || !strings.HasPrefix(string(got.Messages), `[{"role":"user"`) || !strings.HasSuffix(string(got.Messages), `lone"}]`) {
		t.Errorf("raw messages %s", got.Messages)
	}
}

// textTemplate renders role and content of every message, delimited, so
// that a message's text can be compared byte for byte with what the local
// tokenizer's chat templates see.
// textTemplate prints each message's role and text. It names the developer
// role, so that the renderer keeps developer messages as sent (vLLM turns
// them into system messages only for templates that do not).
const textTemplate = `{"chat_template": "{# 'developer' #}{% for m in messages %}{{ m['role'] }}\u0002{{ m['content'] }}\u0003{% endfor %}"}`

func renderedTexts(t testing.TB, tmpl *tokenize.ChatTemplate, messages json.RawMessage) (string, bool) {
	t.Helper()
	out, err := tmpl.Render(tokenize.ChatInput{Messages: messages})
	if err != nil {
		return "", false
	}
	return out, true
}

func parsedTexts(msgs []Message) string {
	var sb strings.Builder
	for _, m := range msgs {
		sb.WriteString(m.Role + "\x02" + m.Content + "\x03")
	}
	return sb.String()
}

// TestMessageTextMatchesChatTemplate: the decoded message text is byte
// for byte what the tokenizer's template renders, on the tokenizer
// fixtures' chats (Unicode, CJK, emoji, code, tool calls) and edge cases.
func TestMessageTextMatchesChatTemplate(t *testing.T) {
	tmpl, err := tokenize.ParseChatTemplate([]byte(textTemplate))
	if err != nil {
		t.Fatal(err)
	}
	var cases []json.RawMessage
	for _, name := range []string{"qwen3", "llama3_1"} {
		fh, err := os.Open(filepath.Join("..", "tokenize", "testdata", name+".json.gz"))
		if err != nil {
			t.Fatalf("tokenizer fixtures: %v", err)
		}
		zr, err := gzip.NewReader(fh)
		if err != nil {
			t.Fatal(err)
		}
		var fx struct {
			Chat []struct {
				Messages     json.RawMessage `json:"messages"`
				MessagesJSON string          `json:"messages_json"` // the byte-exact form
			} `json:"chat"`
		}
		if err := json.NewDecoder(zr).Decode(&fx); err != nil {
			t.Fatal(err)
		}
		fh.Close()
		for _, c := range fx.Chat {
			if c.MessagesJSON != "" {
				c.Messages = json.RawMessage(c.MessagesJSON)
			}
			if bytes.Contains(c.Messages, []byte("x-anthropic-billing-header")) {
				continue // the renderer strips that line from system texts; the parser keeps what was sent
			}
			cases = append(cases, c.Messages)
		}
	}
	if len(cases) < 100 {
		t.Fatalf("only %d fixture chats", len(cases))
	}
	cases = append(cases,
		json.RawMessage(`[{"role":"user","content":"\ud83d\ude00 \udc00 \ud800\u0041 \u0000 \t"}]`),
		json.RawMessage("[{\"role\":\"user\",\"content\":\"bad \xff\xfe utf8 \xe2\x82\"}]"),
		json.RawMessage(`[{"role":"user","content":[{"type":"text","text":"a"},"b"]},{"role":"assistant","content":null}]`),
		json.RawMessage(`[{"role":"user","content":"x","content":"y"}]`),
	)
	for i, msgs := range cases {
		want, err := tmpl.Render(tokenize.ChatInput{Messages: msgs})
		if err != nil {
			t.Fatalf("case %d: template failed: %v\n%.300s", i, err, msgs)
		}
		req, err := ParseChat([]byte(`{"model":"m","messages":` + string(msgs) + `}`))
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if got := parsedTexts(req.ChatMessages); got != want {
			t.Errorf("case %d:\n got %q\nwant %q", i, got, want)
		}
	}
}

func FuzzMessageText(f *testing.F) {
	tmpl, err := tokenize.ParseChatTemplate([]byte(textTemplate))
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		`[{"role":"user","content":"hi"}]`,
		`[{"role":"user","content":"\ud83d\ude00\udc00"}]`,
		`[{"role":"user","content":[{"type":"text","text":"a"},"b"]}]`,
		"[{\"role\":\"user\",\"content\":\"\xff\"}]",
		`[{"role":"a","content":null},{"role":"b"}]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msgs []byte) {
		req, err := ParseChat([]byte(`{"model":"m","messages":` + string(msgs) + `}`))
		want, ok := renderedTexts(t, tmpl, msgs)
		if err != nil || !ok {
			return // only compare what both accept
		}
		for _, m := range req.ChatMessages {
			if m.NonText {
				return // the tokenizer rejects non-text parts
			}
		}
		if got := parsedTexts(req.ChatMessages); got != want {
			t.Fatalf("%q:\n got %q\nwant %q", msgs, got, want)
		}
	})
}
