package tokenize

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/route"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

// fakeVLLM implements vLLM's POST /tokenize: the completion form tokenizes
// the prompt's bytes, the chat form a digest of what it received, so tests
// can tell which form was sent.
type fakeVLLM struct {
	calls   atomic.Int64
	fail    atomic.Bool
	delay   atomic.Int64 // nanoseconds
	mu      sync.Mutex
	lastReq map[string]json.RawMessage
}

func (f *fakeVLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.calls.Add(1)
	if r.Method != http.MethodPost || r.URL.Path != "/tokenize" {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if f.fail.Load() {
		http.Error(w, `{"error":"boom"}`, http.StatusInternalServerError)
		return
	}
	var req map[string]json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// The body is read: the server now notices the client hanging up.
	if d := time.Duration(f.delay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-r.Context().Done():
			return
		}
	}
	f.mu.Lock()
	f.lastReq = req
	f.mu.Unlock()
	_, hasPrompt := req["prompt"]
	_, hasMsgs := req["messages"]
	if hasPrompt == hasMsgs {
		http.Error(w, "exactly one of prompt or messages", http.StatusBadRequest)
		return
	}
	var tokens []uint32
	if hasPrompt {
		var p string
		_ = json.Unmarshal(req["prompt"], &p)
		for _, b := range []byte(p) {
			tokens = append(tokens, uint32(b))
		}
	} else {
		tokens = []uint32{9000, uint32(len(req["messages"]))}
		if string(req["add_generation_prompt"]) == "true" {
			tokens = append(tokens, 9001)
		}
		if _, ok := req["tools"]; ok {
			tokens = append(tokens, 9002)
		}
		if _, ok := req["chat_template_kwargs"]; ok {
			tokens = append(tokens, 9003)
		}
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"count": len(tokens), "max_model_len": 4096, "tokens": tokens})
}

func (f *fakeVLLM) last() map[string]json.RawMessage {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastReq
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func newRemoteTokenizer(t *testing.T, mc ModelConfig, urls func() []string) (*Tokenizer, *prometheus.Registry, *fakeClock) {
	t.Helper()
	reg := prometheus.NewRegistry()
	clk := &fakeClock{t: time.Unix(1000, 0)}
	mc.Kind = KindRemote
	tok, err := New(Config{Models: map[string]ModelConfig{"m": mc}}, Options{
		Registerer: reg,
		Replicas:   func(string) []string { return urls() },
		Now:        clk.now,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tok.Close)
	return tok, reg, clk
}

func TestRemoteRequestShapes(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	fake := &fakeVLLM{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	tok, _, _ := newRemoteTokenizer(t, ModelConfig{Timeout: 10 * time.Second, CacheSize: -1}, func() []string { return []string{srv.URL} })
	defer tok.Close()
	tests := []struct {
		name     string
		in       route.TokenizeInput
		want     []uint32
		wantKeys []string
		noKeys   []string
	}{
		{"prompt", route.TokenizeInput{Prompt: "hi!", AddSpecialTokens: true}, []uint32{'h', 'i', '!'},
			[]string{"model", "prompt", "add_special_tokens"}, []string{"messages", "tools"}},
		{"messages", route.TokenizeInput{Chat: true, Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), AddGenerationPrompt: true},
			[]uint32{9000, 31, 9001}, []string{"messages", "add_generation_prompt", "add_special_tokens"}, []string{"prompt", "tools", "chat_template_kwargs"}},
		{"messages with tools and kwargs", route.TokenizeInput{Chat: true, Messages: json.RawMessage(`[{"role":"user","content":"x"}]`),
			Tools: json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`), ChatTemplateKwargs: json.RawMessage(`{"enable_thinking":false}`)},
			[]uint32{9000, 31, 9002, 9003}, []string{"messages", "tools", "chat_template_kwargs"}, []string{"prompt"}},
		// /tokenize takes no reasoning_effort: the kwargs carry it.
		{"messages with an effort", route.TokenizeInput{Chat: true, Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), ReasoningEffort: "high"},
			[]uint32{9000, 31, 9003}, []string{"messages", "chat_template_kwargs"}, []string{"prompt", "tools", "reasoning_effort"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tok.Tokenize(context.Background(), "m", tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.IDs, tc.want) || got.Source != SourceRemote || !got.Exact {
				t.Fatalf("got %+v, want ids %v from remote, exact", got, tc.want)
			}
			req := fake.last()
			for _, k := range tc.wantKeys {
				if _, ok := req[k]; !ok {
					t.Errorf("request lacks %q: %v", k, req)
				}
			}
			for _, k := range tc.noKeys {
				if _, ok := req[k]; ok {
					t.Errorf("request has %q", k)
				}
			}
			if string(req["model"]) != `"m"` {
				t.Errorf("model = %s", req["model"])
			}
			if tc.in.ReasoningEffort != "" && string(req["chat_template_kwargs"]) != `{"enable_thinking":true,"reasoning_effort":"high"}` {
				t.Errorf("kwargs = %s", req["chat_template_kwargs"])
			}
		})
	}
}

func TestRemoteLRUHits(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	fake := &fakeVLLM{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	tok, reg, _ := newRemoteTokenizer(t, ModelConfig{Timeout: 10 * time.Second, CacheSize: 2}, func() []string { return []string{srv.URL} })
	defer tok.Close()
	ctx := context.Background()
	for _, p := range []string{"a", "a", "b", "a", "c", "b"} {
		if _, err := tok.Tokenize(ctx, "m", route.TokenizeInput{Prompt: p}); err != nil {
			t.Fatal(err)
		}
	}
	// a miss, a hit, b miss, a hit, c miss (evicts b), b miss.
	if got := fake.calls.Load(); got != 4 {
		t.Errorf("server calls = %d, want 4", got)
	}
	if got := counterValue(t, reg, "kvroute_tokenizer_cache_hits_total", "remote"); got != 2 {
		t.Errorf("cache hits = %v, want 2", got)
	}
	// Same text, different add_special_tokens: a different key.
	if _, err := tok.Tokenize(ctx, "m", route.TokenizeInput{Prompt: "b", AddSpecialTokens: true}); err != nil {
		t.Fatal(err)
	}
	if got := fake.calls.Load(); got != 5 {
		t.Errorf("server calls = %d, want 5", got)
	}
}

func TestRemoteFailoverTimeoutAndFallback(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	bad, good, slow := &fakeVLLM{}, &fakeVLLM{}, &fakeVLLM{}
	bad.fail.Store(true)
	slow.delay.Store(int64(5 * time.Second))
	sBad, sGood, sSlow := httptest.NewServer(bad), httptest.NewServer(good), httptest.NewServer(slow)
	defer sBad.Close()
	defer sGood.Close()
	defer sSlow.Close()

	t.Run("next candidate on failure", func(t *testing.T) {
		tok, _, _ := newRemoteTokenizer(t, ModelConfig{Timeout: 10 * time.Second, CacheSize: -1}, func() []string { return []string{sBad.URL, sGood.URL} })
		got, err := tok.Tokenize(context.Background(), "m", route.TokenizeInput{Prompt: "ok"})
		if err != nil || !slices.Equal(got.IDs, []uint32{'o', 'k'}) {
			t.Fatalf("got %v, %v", got, err)
		}
		if bad.calls.Load() == 0 {
			t.Error("first candidate was not tried")
		}
	})
	t.Run("timeout falls back to approximate, counted", func(t *testing.T) {
		tok, reg, _ := newRemoteTokenizer(t, ModelConfig{Timeout: 50 * time.Millisecond, CacheSize: -1}, func() []string { return []string{sSlow.URL} })
		got, err := tok.Tokenize(context.Background(), "m", route.TokenizeInput{Prompt: "hello world"})
		if err != nil {
			t.Fatal(err)
		}
		if got.Exact || got.Source != "approximate:remote_timeout" || len(got.IDs) != 3 {
			t.Fatalf("got %+v, want 3 approximate tokens", got)
		}
		if n := counterValue(t, reg, "kvroute_tokenizer_fallbacks_total", "m", "remote", "timeout"); n != 1 {
			t.Errorf("fallbacks{timeout} = %v, want 1", n)
		}
		if ex := tok.Explain("m"); !strings.Contains(ex, "fixed deadline 50ms") || !strings.Contains(ex, "fallbacks: remote_timeout 1") {
			t.Errorf("explain: %s", ex)
		}
	})
	t.Run("breaker open falls back to approximate, counted", func(t *testing.T) {
		tok, reg, _ := newRemoteTokenizer(t, ModelConfig{Timeout: 10 * time.Second, CacheSize: -1, BreakerFailures: 1, BreakerOpenFor: time.Minute},
			func() []string { return []string{sBad.URL} })
		in := route.TokenizeInput{Prompt: "hello world"}
		for _, reason := range []string{"remote_error", "breaker_open", "breaker_open"} {
			got, err := tok.Tokenize(context.Background(), "m", in)
			if err != nil || got.Exact || got.Source != "approximate:remote_"+reason || len(got.IDs) != 3 {
				t.Fatalf("got %+v, %v; want 3 approximate tokens from %s", got, err, reason)
			}
		}
		if n := counterValue(t, reg, "kvroute_tokenizer_fallbacks_total", "m", "remote", "remote_error"); n != 1 {
			t.Errorf("fallbacks{remote_error} = %v, want 1", n)
		}
		if n := counterValue(t, reg, "kvroute_tokenizer_fallbacks_total", "m", "remote", "breaker_open"); n != 2 {
			t.Errorf("fallbacks{breaker_open} = %v, want 2", n)
		}
	})
	t.Run("fallback none returns the error", func(t *testing.T) {
		tok, _, _ := newRemoteTokenizer(t, ModelConfig{Timeout: 10 * time.Second, CacheSize: -1, Fallback: FallbackNone}, func() []string { return []string{sBad.URL} })
		_, err := tok.Tokenize(context.Background(), "m", route.TokenizeInput{Prompt: "x"})
		if !errors.Is(err, ErrRemote) {
			t.Fatalf("err = %v, want ErrRemote", err)
		}
	})
	t.Run("no replicas", func(t *testing.T) {
		tok, _, _ := newRemoteTokenizer(t, ModelConfig{Fallback: FallbackNone}, func() []string { return nil })
		if _, err := tok.Tokenize(context.Background(), "m", route.TokenizeInput{Prompt: "x"}); !errors.Is(err, ErrNoEndpoint) {
			t.Fatalf("err = %v, want ErrNoEndpoint", err)
		}
	})
	t.Run("garbage response", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(`{"count": 3, "tokens": [1]}`))
		}))
		defer srv.Close()
		tok, _, _ := newRemoteTokenizer(t, ModelConfig{Timeout: 10 * time.Second, Fallback: FallbackNone}, func() []string { return []string{srv.URL} })
		if _, err := tok.Tokenize(context.Background(), "m", route.TokenizeInput{Prompt: "x"}); !errors.Is(err, ErrRemote) {
			t.Fatalf("err = %v, want ErrRemote", err)
		}
	})
}

func TestRemoteBreakerOpensAndRecovers(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	fake := &fakeVLLM{}
	fake.fail.Store(true)
	srv := httptest.NewServer(fake)
	defer srv.Close()
	tok, reg, clk := newRemoteTokenizer(t, ModelConfig{Timeout: 10 * time.Second, CacheSize: -1, Fallback: FallbackNone,
		BreakerFailures: 3, BreakerOpenFor: time.Minute}, func() []string { return []string{srv.URL} })
	ctx := context.Background()
	in := route.TokenizeInput{Prompt: "x"}
	for i := 0; i < 3; i++ {
		if _, err := tok.Tokenize(ctx, "m", in); !errors.Is(err, ErrRemote) {
			t.Fatalf("call %d: err = %v, want ErrRemote", i, err)
		}
	}
	// Open: fails fast without calling the replica.
	before := fake.calls.Load()
	if _, err := tok.Tokenize(ctx, "m", in); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("err = %v, want ErrBreakerOpen", err)
	}
	if fake.calls.Load() != before {
		t.Fatal("open breaker let a call through")
	}
	// Half-open probe fails: open again for another period.
	clk.advance(time.Minute)
	if _, err := tok.Tokenize(ctx, "m", in); !errors.Is(err, ErrRemote) {
		t.Fatalf("probe: err = %v, want ErrRemote", err)
	}
	if _, err := tok.Tokenize(ctx, "m", in); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("after failed probe: err = %v, want ErrBreakerOpen", err)
	}
	// Half-open probe succeeds: closed.
	fake.fail.Store(false)
	clk.advance(time.Minute)
	for i := 0; i < 3; i++ {
		got, err := tok.Tokenize(ctx, "m", in)
		if err != nil || !slices.Equal(got.IDs, []uint32{'x'}) {
			t.Fatalf("after recovery %d: %v, %v", i, got, err)
		}
	}
	if n := counterValue(t, reg, "kvroute_tokenizer_breaker_transitions_total", "m", "open"); n != 2 {
		t.Errorf("open transitions = %v, want 2", n)
	}
	if n := counterValue(t, reg, "kvroute_tokenizer_breaker_transitions_total", "m", "closed"); n != 1 {
		t.Errorf("close transitions = %v, want 1", n)
	}
}

func TestBreakerHalfOpenAllowsOneProbe(t *testing.T) {
	clk := &fakeClock{t: time.Unix(0, 0)}
	b := &breakers{failures: 1, openFor: time.Second, now: clk.now, m: map[string]*breaker{}}
	b.record("u", false)
	if b.allow("u") {
		t.Fatal("open breaker allowed a call")
	}
	clk.advance(time.Second)
	if !b.allow("u") {
		t.Fatal("half-open breaker refused the probe")
	}
	if b.allow("u") {
		t.Fatal("half-open breaker allowed a second concurrent probe")
	}
	b.record("u", true)
	if !b.allow("u") || !b.allow("u") {
		t.Fatal("closed breaker refused calls")
	}
}

// counterValue reads one counter series from reg; labels are the label
// values in the order the metric declares them.
func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			lp := m.GetLabel()
			if len(lp) != len(labels) {
				continue
			}
			// Gather sorts labels by name; match as a set of values.
			want := map[string]int{}
			for _, l := range labels {
				want[l]++
			}
			for _, l := range lp {
				if want[l.GetValue()] == 0 {
					continue metrics
				}
				want[l.GetValue()]--
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// TestRemoteSGLangShape: for a model served by SGLang, /tokenize is asked
// as SGLang's chat route renders the request (no add_generation_prompt, so
// SGLang applies its chat route's own; tool_choice and reasoning_effort as
// fields), where vLLM's /tokenize gets add_generation_prompt and the effort
// merged into chat_template_kwargs, and no tool_choice. An auto or local
// SGLang model tokenizes chats through /tokenize and text prompts locally.
func TestRemoteSGLangShape(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	fake := &fakeVLLM{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	in := route.TokenizeInput{Chat: true, Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), AddGenerationPrompt: true,
		Tools: json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`), ToolChoice: json.RawMessage(`"none"`), ReasoningEffort: "low"}
	for _, c := range []struct {
		engine string
		want   map[string]string
		absent []string
	}{
		{EngineSGLang, map[string]string{"tool_choice": `"none"`, "reasoning_effort": `"low"`}, []string{"add_generation_prompt", "chat_template_kwargs"}},
		{"", map[string]string{"add_generation_prompt": "true", "chat_template_kwargs": `{"enable_thinking":true,"reasoning_effort":"low"}`}, []string{"tool_choice", "reasoning_effort"}},
	} {
		tok, _, _ := newRemoteTokenizer(t, ModelConfig{Timeout: 10 * time.Second, CacheSize: -1, Engine: c.engine}, func() []string { return []string{srv.URL} })
		if _, err := tok.Tokenize(context.Background(), "m", in); err != nil {
			t.Fatal(err)
		}
		req := fake.last()
		for k, v := range c.want {
			if string(req[k]) != v {
				t.Errorf("engine %q: %s = %s, want %s", c.engine, k, req[k], v)
			}
		}
		for _, k := range c.absent {
			if _, ok := req[k]; ok {
				t.Errorf("engine %q: %s sent: %s", c.engine, k, req[k])
			}
		}
		if string(req["tools"]) != string(in.Tools) {
			t.Errorf("engine %q: tools %s", c.engine, req["tools"])
		}
	}

	// A local SGLang model: chats to /tokenize, text prompts local.
	mc := localConfig(t, "qwen3")
	mc.Engine = EngineSGLang
	tok, err := New(Config{Models: map[string]ModelConfig{"m": mc}}, Options{Replicas: func(string) []string { return []string{srv.URL} }})
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	calls := fake.calls.Load()
	chat, err := tok.Tokenize(context.Background(), "m", in)
	if err != nil || chat.Source != SourceRemote || fake.calls.Load() != calls+1 {
		t.Errorf("an SGLang model's chat: %s, %v, %d calls", chat.Source, err, fake.calls.Load()-calls)
	}
	text, err := tok.Tokenize(context.Background(), "m", route.TokenizeInput{Prompt: "hello", AddSpecialTokens: true})
	if err != nil || text.Source != SourceLocal {
		t.Errorf("an SGLang model's text prompt: %s, %v", text.Source, err)
	}
}

// TestLocalUnsupportedAsksTheEngine: a request the local tokenizer knows
// it cannot reproduce (here a template printing a float as only Python
// prints it) is tokenized by the engine when one can be asked, and only
// without one falls back to approximate tokens.
func TestLocalUnsupportedAsksTheEngine(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	fake := &fakeVLLM{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	mc := localConfig(t, "qwen3")
	mc.EngineChat.Template = "{{ messages[0].content }}|{{ tools[0].function.parameters.properties.days.default }}"
	in := route.TokenizeInput{Chat: true, Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), AddGenerationPrompt: true,
		Tools: json.RawMessage(`[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"days":{"type":"number","default":2.0}}}}}]`)}
	reg := prometheus.NewRegistry()
	tok, err := New(Config{Models: map[string]ModelConfig{"m": mc}}, Options{Registerer: reg, Replicas: func(string) []string { return []string{srv.URL} }})
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	got, err := tok.Tokenize(context.Background(), "m", in)
	if err != nil || got.Source != SourceRemote || !got.Exact || fake.calls.Load() != 1 {
		t.Fatalf("with an engine: %s exact %v, %v, %d calls", got.Source, got.Exact, err, fake.calls.Load())
	}
	if n := counterValue(t, reg, "kvroute_tokenizer_requests_total", "local", "unsupported"); n != 1 {
		t.Errorf("local unsupported counted %v times", n)
	}
	// The explanation says how often the local tokenizer refused, and why.
	if ex := tok.Explain("m"); !strings.Contains(ex, "local refusals: 1, the latest: ") || !strings.Contains(ex, "a number the template engine cannot print as Python") {
		t.Errorf("explain does not name the refusal: %s", ex)
	}
	// A plain chat stays local.
	if got, err := tok.Tokenize(context.Background(), "m", route.TokenizeInput{Chat: true, Messages: in.Messages, AddGenerationPrompt: true}); err != nil || got.Source != SourceLocal {
		t.Errorf("a chat the template prints: %s, %v", got.Source, err)
	}
	alone, err := New(Config{Models: map[string]ModelConfig{"m": mc}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer alone.Close()
	if got, err := alone.Tokenize(context.Background(), "m", in); err != nil || got.Source != "approximate:local_unsupported" {
		t.Errorf("without an engine: %s, %v", got.Source, err)
	}
}
