package tokenize

import (
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/pkg/openai"
	"github.com/kvroute/kvroute/pkg/route"
	"github.com/kvroute/kvroute/pkg/tokenize/parsedchat"
)

// The reference fixtures come from HuggingFace transformers
// (hack/tokenizer-fixtures/gen.py); the tokenizer files they were made from
// are fetched by `make fixtures` into .cache/tokenizers/<name>/.

var fixtureNames = []string{"qwen3", "llama3_1", "llama3", "llama3_2", "gptoss", "deepseek_v3", "gemma3"}

// benchNames are the families the throughput benchmarks compare (the
// general corpus, same run as HuggingFace).
var benchNames = fixtureNames

// noChatTemplate lists families whose tokenizer files ship no chat template
// (gpt-oss: its harmony format is rendered by the engine, not a template).
var noChatTemplate = map[string]bool{"gptoss": true}

type plainFixture struct {
	Text       string   `json:"text"`
	IDs        []uint32 `json:"ids"`
	IDsSpecial []uint32 `json:"ids_special"`
}

// chatFixture keeps the request's messages and tools as the JSON text a
// client sends (numbers exactly as written), the rendered prompt and its ids.
type chatFixture struct {
	MessagesJSON        string          `json:"messages_json"`
	ToolsJSON           string          `json:"tools_json"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	ContinueFinal       bool            `json:"continue_final_message"`
	Kwargs              json.RawMessage `json:"kwargs"`
	Rendered            string          `json:"rendered"`
	IDs                 []uint32        `json:"ids"`
}

func (f *chatFixture) input() ChatInput {
	return ChatInput{Messages: json.RawMessage(f.MessagesJSON), Tools: json.RawMessage(f.ToolsJSON),
		ChatTemplateKwargs: f.Kwargs, AddGenerationPrompt: f.AddGenerationPrompt, ContinueFinalMessage: f.ContinueFinal}
}

// fixtureFile is one family's reference: Plain is the general corpus (the
// throughput benchmarks use it), Exact the classes that once broke
// exactness (kept apart so the benchmark corpus stays comparable).
type fixtureFile struct {
	Meta  map[string]any `json:"meta"`
	Plain []plainFixture `json:"plain"`
	Exact []plainFixture `json:"exact"`
	Chat  []chatFixture  `json:"chat"`
}

// tokenizerDir is where `make fixtures` puts the tokenizer files.
func tokenizerDir(name string) string {
	if d := os.Getenv("KVROUTE_TOKENIZER_CACHE"); d != "" {
		return filepath.Join(d, name)
	}
	// Absolute, so that a symlink to a file (TestAutoKind) resolves from
	// any directory.
	d, err := filepath.Abs(filepath.Join("..", "..", ".cache", "tokenizers", name))
	if err != nil {
		panic(err)
	}
	return d
}

func tokenizerFiles(t testing.TB, name string) (tokJSON, tokConfig string) {
	t.Helper()
	dir := tokenizerDir(name)
	tokJSON = filepath.Join(dir, "tokenizer.json")
	tokConfig = filepath.Join(dir, "tokenizer_config.json")
	for _, p := range []string{tokJSON, tokConfig} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("tokenizer file missing (%v): run `make fixtures` first", err)
		}
	}
	return tokJSON, tokConfig
}

var (
	fixtureMu    sync.Mutex
	fixtureCache = map[string]*fixtureFile{}
	encoderCache = map[string]*Encoder{}
)

func loadFixtures(t testing.TB, name string) *fixtureFile {
	t.Helper()
	fixtureMu.Lock()
	defer fixtureMu.Unlock()
	if f, ok := fixtureCache[name]; ok {
		return f
	}
	path := filepath.Join("testdata", name+".json.gz")
	fh, err := os.Open(path)
	if err != nil {
		t.Fatalf("fixtures missing (%v): run `make fixtures` (or `make fixtures-regen` to rebuild them from HuggingFace)", err)
	}
	defer fh.Close()
	zr, err := gzip.NewReader(fh)
	if err != nil {
		t.Fatalf("fixtures %s: %v", path, err)
	}
	var f fixtureFile
	if err := json.NewDecoder(zr).Decode(&f); err != nil {
		t.Fatalf("fixtures %s: %v", path, err)
	}
	minChats := 50
	if noChatTemplate[name] {
		minChats = 0
	}
	if len(f.Plain) < 200 || len(f.Exact) < 20 || len(f.Chat) < minChats {
		t.Fatalf("fixtures %s: %d texts, %d exactness texts, %d chats; want >= 200, 20 and %d", path, len(f.Plain), len(f.Exact), len(f.Chat), minChats)
	}
	fixtureCache[name] = &f
	return &f
}

func loadEncoder(t testing.TB, name string) *Encoder {
	t.Helper()
	tokJSON, _ := tokenizerFiles(t, name)
	fixtureMu.Lock()
	defer fixtureMu.Unlock()
	if e, ok := encoderCache[name]; ok {
		return e
	}
	e, err := LoadEncoder(tokJSON)
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	encoderCache[name] = e
	return e
}

func TestEncoderMatchesReferenceFixtures(t *testing.T) {
	for _, name := range fixtureNames {
		t.Run(name, func(t *testing.T) {
			enc := loadEncoder(t, name)
			fx := loadFixtures(t, name)
			bad := 0
			for i, f := range slices.Concat(fx.Plain, fx.Exact) {
				got, err := enc.Encode(f.Text, false)
				if err != nil {
					t.Fatalf("text %d %q: %v", i, trunc(f.Text), err)
				}
				if !slices.Equal(got, f.IDs) {
					bad++
					t.Errorf("text %d %q:\n got %v\nwant %v", i, trunc(f.Text), head(got), head(f.IDs))
				}
				got, err = enc.Encode(f.Text, true)
				if err != nil {
					t.Fatalf("text %d: %v", i, err)
				}
				if !slices.Equal(got, f.IDsSpecial) {
					bad++
					t.Errorf("text %d %q with special tokens:\n got %v\nwant %v", i, trunc(f.Text), head(got), head(f.IDsSpecial))
				}
				if bad > 10 {
					t.Fatal("too many mismatches")
				}
			}
			// The rendered chat prompts are encoded too (special tokens
			// inside the text, long inputs).
			for i, f := range fx.Chat {
				got, err := enc.Encode(f.Rendered, false)
				if err != nil {
					t.Fatalf("chat %d: %v", i, err)
				}
				if !slices.Equal(got, f.IDs) {
					t.Errorf("chat %d rendered prompt:\n got %v\nwant %v", i, head(got), head(f.IDs))
				}
			}
		})
	}
}

func trunc(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

func head(ids []uint32) []uint32 {
	if len(ids) > 40 {
		return ids[:40]
	}
	return ids
}

func loadTemplate(t testing.TB, name string) *ChatTemplate {
	t.Helper()
	_, cfg := tokenizerFiles(t, name)
	c, err := LoadChatTemplate(cfg)
	if err != nil {
		t.Fatalf("load chat template %s: %v", name, err)
	}
	return c
}

func TestChatTemplateMatchesReferenceFixtures(t *testing.T) {
	for _, name := range fixtureNames {
		t.Run(name, func(t *testing.T) {
			if noChatTemplate[name] {
				if _, err := LoadChatTemplate(filepath.Join(tokenizerDir(name), "tokenizer_config.json")); err == nil {
					t.Fatal("a chat template appeared: generate chat fixtures for it")
				}
				return
			}
			enc := loadEncoder(t, name)
			tmpl := loadTemplate(t, name)
			fx := loadFixtures(t, name)
			plain := 0
			for i, f := range fx.Chat {
				got, err := tmpl.Render(f.input())
				if err != nil {
					t.Fatalf("chat %d: %v", i, err)
				}
				if got != f.Rendered {
					t.Errorf("chat %d rendered differently:\n got %q\nwant %q", i, got, f.Rendered)
					continue
				}
				// The same chat from the request parser's decoded messages.
				in := f.input()
				in.Parsed = parsedMessages(t, f.MessagesJSON)
				for k := range in.Parsed {
					if plainMessage(&in.Parsed[k]) {
						plain++
					}
				}
				if got, err := tmpl.Render(in); err != nil || got != f.Rendered {
					t.Errorf("chat %d from parsed messages rendered differently (%v):\n got %q\nwant %q", i, err, got, f.Rendered)
				}
				ids, err := enc.Encode(got, false)
				if err != nil {
					t.Fatalf("chat %d: %v", i, err)
				}
				if !slices.Equal(ids, f.IDs) {
					t.Errorf("chat %d ids differ", i)
				}
			}
			if plain == 0 {
				t.Error("no fixture message took the decoded-message path")
			}
		})
	}
}

// parsedMessages decodes a messages array as the request parser does.
func parsedMessages(t testing.TB, messagesJSON string) []route.ChatMessage {
	t.Helper()
	req, err := openai.Parse("/v1/chat/completions", []byte(`{"model":"m","messages":`+messagesJSON+`}`))
	if err != nil {
		t.Fatalf("parse messages: %v", err)
	}
	return parsedchat.Messages(req.ChatMessages)
}
