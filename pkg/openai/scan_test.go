package openai

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"math/rand/v2"
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

// FuzzScanner: the scanner accepts exactly what encoding/json accepts, and
// decodes strings exactly as it does.
func FuzzScanner(f *testing.F) {
	for _, s := range []string{
		`{"a":[1,2.5e-3,-0,true,false,null,"x\u00e9\n"],"b":{}}`, `"\ud800\udc00\ud800"`, `[01]`, `1.`, `-`, `"\x"`,
		"\"\xff\"", `{"a" 1}`, `[1,]`, ` {} `, `{}x`, `"a\u00"`, `[[[[]]]]`, `1e+`, `tru`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s := &scanner{b: b}
		err := s.skip(0)
		if err == nil {
			err = s.end()
		}
		if valid := json.Valid(b); valid != (err == nil) {
			t.Fatalf("%q: json.Valid %v, scanner error %v", b, valid, err)
		}
		if err != nil {
			return
		}
		var want string
		if (&scanner{b: b}).peek() == '"' && json.Unmarshal(b, &want) == nil {
			s := &scanner{b: b}
			s.ws()
			raw, complex, err := s.str()
			if err != nil {
				t.Fatalf("%q: %v", b, err)
			}
			if got := unquote(raw, complex); got != want {
				t.Fatalf("%q: unquote %q, encoding/json %q", b, got, want)
			}
		}
	})
}

// TestUnquoteMatchesEncodingJSON: invalid UTF-8 next to escapes (a
// truncated sequence before one, a stray continuation byte after one,
// a lone surrogate escape between invalid bytes), long runs for the
// eight-byte step, and valid text: unquote gives what encoding/json gives.
func TestUnquoteMatchesEncodingJSON(t *testing.T) {
	long := strings.Repeat("eight by", 5)
	for _, s := range []string{
		"\"caf\xc3\\u00a9\"", "\"\\u00e9\xa9\"", "\"\xe4\xb8\\n\xad\"", "\"\\ud800\xff\\udc00\"", "\"" + long + "\xc3\\\\" + long + "\"",
		"\"" + long + "\\u4e2d\xe4\xb8\xad" + long + "\\t\"", "\"\\\"" + long + "\xf0\x9f\x9a\x80\\/\"", "\"\xed\xa0\x80\\u0041\"",
		"\"a\\u00\xe4\xb8\xad\"", "\"\xef\xbf\xbd\\ufffd\xff\"",
	} {
		var want string
		if err := json.Unmarshal([]byte(s), &want); err != nil {
			continue // not a string encoding/json accepts: the scanner's business, not unquote's
		}
		sc := &scanner{b: []byte(s)}
		raw, complex, err := sc.str()
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if got := unquote(raw, complex); got != want {
			t.Fatalf("%q: unquote %q, encoding/json %q", s, got, want)
		}
	}
}

// TestUnquoteRandomMatchesEncodingJSON: random valid strings built of
// ASCII runs of every length (so that escapes fall at every offset of the
// eight-byte copy), multi-byte characters and every kind of escape
// (surrogate pairs, unpaired and reversed surrogates included), decoded
// like encoding/json decodes them.
func TestUnquoteRandomMatchesEncodingJSON(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	pieces := []string{`\"`, `\\`, `\/`, `\b`, `\f`, `\n`, `\r`, `\t`, `\u0041`, `\u00e9`, `\u4e2d`, `\ud83d\ude80`,
		`\ud800`, `\udc00`, `\udc00\ud800`, `\ud800\u0041`, `\u0000`, "é", "中", "🚀", "\u2028"}
	for range 20000 {
		var sb strings.Builder
		sb.WriteByte('"')
		for range rng.IntN(12) {
			sb.WriteString(strings.Repeat("x", rng.IntN(20)))
			sb.WriteString(pieces[rng.IntN(len(pieces))])
		}
		sb.WriteString(strings.Repeat("y", rng.IntN(10)))
		sb.WriteByte('"')
		s := sb.String()
		var want string
		if err := json.Unmarshal([]byte(s), &want); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		sc := &scanner{b: []byte(s)}
		raw, complex, err := sc.str()
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		if got := unquote(raw, complex); got != want {
			t.Fatalf("%q: unquote %q, encoding/json %q", s, got, want)
		}
	}
}

// TestStrEqualsSlow: str (quote and backslash found with IndexByte) ends
// every string where the byte-by-byte strSlow ends it, with the same raw
// bytes, the same need to decode and the same error and offset, on random
// strings of plain runs of every length, multi-byte and invalid bytes,
// every escape (a quote escaped just before the real one included),
// malformed escapes, control characters and missing closing quotes.
func TestStrEqualsSlow(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 9))
	pieces := []string{`\"`, `\\`, `\/`, `\n`, `\t`, `\u00e9`, `\ud83d\ude80`, "é", "中", "🚀", "\xff", "\xe4\xb8",
		`\x`, `\u12`, `\u12g4`, "\x01", "\x1f", "\x7f", `\`, `"`, `\\"`}
	for range 30000 {
		var sb strings.Builder
		sb.WriteByte('"')
		for range rng.IntN(8) {
			sb.WriteString(strings.Repeat("ab", rng.IntN(12)))
			if rng.IntN(3) > 0 {
				sb.WriteString(pieces[rng.IntN(len(pieces))])
			}
		}
		switch rng.IntN(4) {
		case 0: // no closing quote
		case 1:
			sb.WriteString(`\`)
		default:
			sb.WriteString(`"x`)
		}
		b := []byte(sb.String())
		fast, slow := &scanner{b: b}, &scanner{b: b}
		raw, complex, err := fast.str()
		rawS, complexS, errS := slow.strSlow()
		if string(raw) != string(rawS) || complex != complexS || fast.i != slow.i || fmt.Sprint(err) != fmt.Sprint(errS) {
			t.Fatalf("%q:\n str     %q %v %d %v\n strSlow %q %v %d %v", b, raw, complex, fast.i, err, rawS, complexS, slow.i, errS)
		}
	}
}
