package tokenize

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
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
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
)

// engineTokenizer serves vLLM's POST /tokenize with a real local tokenizer
// (the engine's own files): prompts are encoded, chats rendered with the
// engine's chat template and then encoded.
type engineTokenizer struct {
	local *Local
	calls atomic.Int64
	fail  atomic.Bool
}

func (e *engineTokenizer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.calls.Add(1)
	if e.fail.Load() {
		http.Error(w, "down", http.StatusServiceUnavailable)
		return
	}
	var req tokenizeRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	in := route.TokenizeInput{AddSpecialTokens: req.AddSpecialTokens}
	if req.Messages != nil {
		in.Chat, in.Messages, in.Tools, in.ChatTemplateKwargs = true, req.Messages, req.Tools, req.ChatTemplateKwargs
		in.AddGenerationPrompt = req.AddGenerationPrompt != nil && *req.AddGenerationPrompt
	} else if req.Prompt != nil {
		in.Prompt = *req.Prompt
	}
	toks, err := e.local.Tokenize(in)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	_ = json.NewEncoder(w).Encode(tokenizeResponse{Count: len(toks.IDs), Tokens: toks.IDs})
}

func newEngine(t *testing.T, family string) (*engineTokenizer, *httptest.Server) {
	t.Helper()
	e := &engineTokenizer{local: NewLocal(loadEncoder(t, family), loadTemplate(t, family), 0, 0)}
	return e, httptest.NewServer(e) // callers defer Close (before goleak's check)
}

// checkedTokenizer serves model "m" locally with family's files,
// self-checking every request against the engine at url.
func checkedTokenizer(t *testing.T, family, url string, sc SelfCheckConfig) (*Tokenizer, *prometheus.Registry, *bytes.Buffer) {
	t.Helper()
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	tok, err := New(Config{Models: map[string]ModelConfig{"m": localConfig(t, family)}, SelfCheck: sc}, Options{
		Registerer: reg, Replicas: func(string) []string { return []string{url} },
		Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: &logs}, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return tok, reg, &logs
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSelfCheckDemotesWrongTokenizer(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	engine, srv := newEngine(t, "llama3_1")
	defer srv.Close()
	// Deliberately wrong: the router has Qwen3's files, the engine Llama's.
	tok, reg, logs := checkedTokenizer(t, "qwen3", srv.URL, SelfCheckConfig{SampleRate: 1})
	defer tok.Close()
	ctx := context.Background()
	in := route.TokenizeInput{Prompt: "The quick brown fox jumps over the lazy dog. 12345"}
	got, err := tok.Tokenize(ctx, "m", in)
	if err != nil || got.Source != SourceLocal || !got.Exact {
		t.Fatalf("first request: %+v, %v", got, err)
	}
	waitFor(t, "demotion", func() bool { s := tok.SelfCheckStates(); return len(s) == 1 && s[0].Demoted })
	st := tok.SelfCheckStates()[0]
	if st.Serving != string(KindRemote) || st.Mismatches != 1 || st.Checks != 1 || st.FirstDiff != 0 || !strings.Contains(st.Reason, "first difference at token 0") {
		t.Errorf("state = %+v", st)
	}
	// From now on the engine's own ids.
	want, _ := engine.local.Tokenize(in)
	got, err = tok.Tokenize(ctx, "m", in)
	if err != nil || got.Source != SourceRemote || !slices.Equal(got.IDs, want.IDs) {
		t.Fatalf("after demotion: %+v, %v; want the engine's %v", got, err, want.IDs)
	}
	if v := testutil.ToFloat64(tok.metrics.localExact.WithLabelValues("m")); v != 0 {
		t.Errorf("local_exact = %v", v)
	}
	if v := testutil.ToFloat64(tok.metrics.selfChecks.WithLabelValues("m", "mismatch")); v != 1 {
		t.Errorf("mismatches = %v", v)
	}
	if !strings.Contains(tok.Explain("m"), "demoted") {
		t.Errorf("Explain = %q", tok.Explain("m"))
	}
	rec := httptest.NewRecorder()
	tok.DebugHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/tokenizer", nil))
	var page struct {
		Models []ModelDebug `json:"models"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil || len(page.Models) != 1 {
		t.Fatalf("debug page %q: %v", rec.Body.String(), err)
	}
	if d := page.Models[0]; d.Model != "m" || d.Kind != KindLocal || d.SelfCheck == nil || !d.SelfCheck.Demoted || !strings.Contains(d.Explain, "demoted") {
		t.Errorf("debug page entry = %+v", d)
	}
	tok.Close() // joins the workers: the log is complete
	if n := strings.Count(logs.String(), "disagrees with the engine"); n != 1 {
		t.Errorf("logged %d times:\n%s", n, logs.String())
	}
	if n := testutil.CollectAndCount(reg, "kvroute_tokenizer_self_checks_total"); n != 1 {
		t.Errorf("%d self-check series registered, want 1 (mismatch)", n)
	}
}

func TestSelfCheckChatUsesEngineRendering(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	fx := loadFixtures(t, "qwen3")
	chat := fx.Chat[0]
	in := route.TokenizeInput{Chat: true, Messages: json.RawMessage(chat.MessagesJSON), Tools: json.RawMessage(chat.ToolsJSON),
		ChatTemplateKwargs: chat.Kwargs, AddGenerationPrompt: chat.AddGenerationPrompt}
	// Same family: every check matches, nothing is demoted.
	_, good := newEngine(t, "qwen3")
	defer good.Close()
	tok, _, _ := checkedTokenizer(t, "qwen3", good.URL, SelfCheckConfig{SampleRate: 1})
	for range 5 {
		got, err := tok.Tokenize(context.Background(), "m", in)
		if err != nil || !slices.Equal(got.IDs, chat.IDs) {
			t.Fatalf("local chat: %v", err)
		}
	}
	waitFor(t, "5 checks", func() bool { return tok.SelfCheckStates()[0].Checks == 5 })
	if st := tok.SelfCheckStates()[0]; st.Demoted || st.Mismatches != 0 || st.Serving != "local" {
		t.Errorf("correct tokenizer: %+v", st)
	}
	if !strings.Contains(tok.Explain("m"), "5 of 5") {
		t.Errorf("Explain = %q", tok.Explain("m"))
	}
	tok.Close()
	// An engine with another chat template and vocabulary: demoted on chat.
	_, bad := newEngine(t, "llama3_1")
	defer bad.Close()
	tok2, _, _ := checkedTokenizer(t, "qwen3", bad.URL, SelfCheckConfig{SampleRate: 1})
	defer tok2.Close()
	if _, err := tok2.Tokenize(context.Background(), "m", in); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "demotion", func() bool { return tok2.SelfCheckStates()[0].Demoted })
	if r := tok2.SelfCheckStates()[0].Reason; !strings.Contains(r, "chat") {
		t.Errorf("reason = %q", r)
	}
}

func TestSelfCheckEngineErrorsDoNotDemote(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	engine, srv := newEngine(t, "qwen3")
	defer srv.Close()
	engine.fail.Store(true)
	tok, _, _ := checkedTokenizer(t, "qwen3", srv.URL, SelfCheckConfig{SampleRate: 1})
	defer tok.Close()
	for range 3 {
		if _, err := tok.Tokenize(context.Background(), "m", route.TokenizeInput{Prompt: "hello"}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "3 errors", func() bool { return tok.SelfCheckStates()[0].Errors == 3 })
	if st := tok.SelfCheckStates()[0]; st.Demoted || st.Checks != 0 {
		t.Errorf("state = %+v", st)
	}
}

func TestSelfCheckSamplingQueueAndClose(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	engine, srv := newEngine(t, "qwen3")
	defer srv.Close()
	// Rate 0.25 over 400 requests: about 100 samples, never all or none.
	tok, _, _ := checkedTokenizer(t, "qwen3", srv.URL, SelfCheckConfig{SampleRate: 0.25, Queue: 1000})
	for i := range 400 {
		if _, err := tok.Tokenize(context.Background(), "m", route.TokenizeInput{Prompt: strings.Repeat("x", i)}); err != nil {
			t.Fatal(err)
		}
	}
	// The queue drained (at most the job the worker holds is left) and
	// every call made so far answered: Checks == calls alone also holds
	// between two jobs of a queue that is still full.
	waitFor(t, "sampled checks", func() bool {
		st := tok.SelfCheckStates()[0]
		return len(tok.checker.jobs) == 0 && st.Checks > 0 && int64(st.Checks) == engine.calls.Load()
	})
	if n := engine.calls.Load(); n < 40 || n > 200 {
		t.Errorf("%d of 400 requests checked at rate 0.25", n)
	}
	tok.Close()
	// A slow engine and a queue of one: samples beyond it are dropped,
	// the request path never waits, and Close joins the busy worker.
	_, slowSrv := newEngine(t, "qwen3")
	defer slowSrv.Close()
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(200 * time.Millisecond)
		http.Redirect(w, r, slowSrv.URL+"/tokenize", http.StatusTemporaryRedirect)
	}))
	defer slow.Close()
	tok2, _, _ := checkedTokenizer(t, "qwen3", slow.URL, SelfCheckConfig{SampleRate: 1, Queue: 1})
	for range 20 {
		if _, err := tok2.Tokenize(context.Background(), "m", route.TokenizeInput{Prompt: "hi"}); err != nil {
			t.Fatal(err)
		}
	}
	// Had a sample waited for room, none would have been dropped.
	if st := tok2.SelfCheckStates()[0]; st.Dropped < 15 {
		t.Errorf("dropped %d of 20 with a queue of 1", st.Dropped)
	}
	tok2.Close()
}

func TestSelfCheckConfig(t *testing.T) {
	bad := SelfCheckConfig{SampleRate: 2, Workers: -1, Queue: -1, Timeout: -1}
	err := Config{Models: map[string]ModelConfig{"m": {Kind: KindApproximate}}, SelfCheck: bad}.Validate()
	if err == nil {
		t.Fatal("accepted")
	}
	for _, f := range []string{"self_check.sample_rate", "self_check.workers", "self_check.queue", "self_check.timeout"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error lacks %s: %v", f, err)
		}
	}
	d := SelfCheckConfig{}.WithDefaults()
	if d.SampleRate != DefaultSelfCheckSampleRate || d.Workers != 1 || d.Queue != DefaultSelfCheckQueue || d.Timeout != DefaultSelfCheckTimeout {
		t.Errorf("defaults = %+v", d)
	}
	// Disabled, or without replicas: no workers, nothing checked.
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	tok, err := New(Config{Models: map[string]ModelConfig{"m": localConfig(t, "qwen3")}, SelfCheck: SelfCheckConfig{Disabled: true}},
		Options{Replicas: func(string) []string { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Close()
	if tok.checker != nil || len(tok.SelfCheckStates()) != 0 || !strings.Contains(tok.Explain("m"), "not checked") {
		t.Errorf("disabled self-check: checker %v, states %v, %q", tok.checker, tok.SelfCheckStates(), tok.Explain("m"))
	}
}

// A sampled chat /tokenize cannot render as the chat route does (documents,
// an empty tools list) is counted, never sent, and never demotes: the
// router holds the wrong files here, so a sent sample would.
func TestSelfCheckSkipsUnreproducibleChats(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	_, srv := newEngine(t, "llama3_1")
	defer srv.Close()
	tok, _, _ := checkedTokenizer(t, "qwen3", srv.URL, SelfCheckConfig{SampleRate: 1})
	defer tok.Close()
	msgs := json.RawMessage(`[{"role": "user", "content": "hi"}]`)
	for _, in := range []route.TokenizeInput{
		{Chat: true, Messages: msgs, AddGenerationPrompt: true, Documents: json.RawMessage(`[{"title": "t", "text": "x"}]`)},
		{Chat: true, Messages: msgs, AddGenerationPrompt: true, Tools: json.RawMessage(`[]`)},
	} {
		if got, err := tok.Tokenize(context.Background(), "m", in); err != nil || got.Source != SourceLocal {
			t.Fatalf("%+v, %v", got, err)
		}
	}
	if v := testutil.ToFloat64(tok.metrics.selfChecks.WithLabelValues("m", "unreproducible")); v != 2 {
		t.Errorf("unreproducible = %v, want 2", v)
	}
	tok.Close()
	if st := tok.SelfCheckStates(); len(st) != 1 || st[0].Demoted || st[0].Checks != 0 {
		t.Errorf("state = %+v, want no check and no demotion", st)
	}
}
