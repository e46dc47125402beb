package live

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"gopkg.in/yaml.v3"

	"github.com/kvroute/kvroute/pkg/bench"
	"github.com/kvroute/kvroute/pkg/route"
	"github.com/kvroute/kvroute/pkg/tokenize"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeEngine streams max_tokens one-letter chunks, then a usage chunk
// claiming half the prompt cached, and records what it was sent.
type fakeEngine struct {
	mu       sync.Mutex
	prompts  map[string][]string // session key -> prompts in order (token ids as their bytes)
	users    map[string]string   // prompt -> the user field it came with
	ids      int                 // prompts sent as token ids, BOS first
	status   int
	gap      time.Duration
	released chan struct{} // when not nil, responses wait for it
}

func (f *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Prompt    json.RawMessage `json:"prompt"`
		MaxTokens int             `json:"max_tokens"`
		Stream    bool            `json:"stream"`
		User      *string         `json:"user"`
	}
	if r.URL.Path != "/v1/completions" || json.NewDecoder(r.Body).Decode(&req) != nil || !req.Stream {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	var prompt string
	var ids []uint32
	if json.Unmarshal(req.Prompt, &prompt) != nil {
		if json.Unmarshal(req.Prompt, &ids) != nil || len(ids) == 0 || ids[0] != 256 {
			http.Error(w, "bad prompt", http.StatusBadRequest)
			return
		}
		b := make([]byte, 0, len(ids))
		for _, id := range ids[1:] {
			b = append(b, byte(id))
		}
		prompt = string(b)
	}
	f.mu.Lock()
	if ids != nil {
		f.ids++
	}
	f.prompts[r.Header.Get("x-session-id")] = append(f.prompts[r.Header.Get("x-session-id")], prompt)
	if req.User != nil {
		f.users[prompt] = *req.User
	}
	status := f.status
	f.mu.Unlock()
	if status != 0 {
		http.Error(w, "overloaded", status)
		return
	}
	if f.released != nil {
		select {
		case <-f.released:
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for range req.MaxTokens {
		time.Sleep(f.gap)
		fmt.Fprintf(w, "data: {\"choices\":[{\"text\":\"z\"}]}\n\n")
		fl.Flush()
	}
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n",
		len(prompt), req.MaxTokens, len(prompt)/2)
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func newFake() *fakeEngine {
	return &fakeEngine{prompts: map[string][]string{}, users: map[string]string{}}
}

func workload(t *testing.T, name string, size float64) *bench.Workload {
	t.Helper()
	w, err := bench.Generate(name, bench.GenOptions{Seed: 2, SizeScale: size})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestRunMeasures(t *testing.T) {
	f := newFake()
	f.gap = time.Millisecond
	srv := httptest.NewServer(f)
	defer srv.Close()
	w := workload(t, bench.GenAgentic, 0.02) // one session, 10-20 turns
	for i := range w.Sessions {              // short outputs keep the test fast
		for k := range w.Sessions[i].Turns {
			w.Sessions[i].Turns[k].Output = 4
			w.Sessions[i].Turns[k].Gap = 0
		}
	}
	rep, err := Run(context.Background(), Options{URL: srv.URL, Model: "m", Workload: w, Speed: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Client().CloseIdleConnections()
	if len(rep.Requests) != w.Requests() {
		t.Fatalf("%d requests measured, want %d", len(rep.Requests), w.Requests())
	}
	for _, q := range rep.Requests {
		if q.Err != "" || q.TTFT <= 0 || q.E2E < q.TTFT || len(q.ITLs) != 3 || q.OutputChunks != 4 ||
			q.PromptTokens != q.PromptChars || q.CachedTokens != q.PromptChars/2 {
			t.Fatalf("request %+v", q)
		}
	}
	// Each turn resends the previous prompt and the generated text.
	ps := f.prompts[w.Sessions[0].Key]
	if len(ps) != len(w.Sessions[0].Turns) {
		t.Fatalf("server saw %d prompts for the session, want %d", len(ps), len(w.Sessions[0].Turns))
	}
	for k := 1; k < len(ps); k++ {
		if !strings.HasPrefix(ps[k], ps[k-1]+"zzzz") {
			t.Fatalf("turn %d does not resend turn %d's prompt and output", k, k-1)
		}
	}
	if len(ps[0]) != w.Sessions[0].Turns[0].Append[0].Len+w.Sessions[0].Turns[0].Append[1].Len {
		t.Fatalf("first prompt has %d chars", len(ps[0]))
	}
	s := Summarize(rep)
	if s.Requests != w.Requests() || s.Errors != 0 || s.TTFTP99 < s.TTFTP50 || s.HitRate < 0.45 || s.HitRate > 0.55 || s.Throughput <= 0 {
		t.Fatalf("summary %+v", s)
	}
}

// A reasoning turn's thinking is not resent: the next prompt carries the
// previous one, the answer's share of the generated text, and the new
// message.
func TestRunDropsHiddenThinking(t *testing.T) {
	f := newFake()
	srv := httptest.NewServer(f)
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	w := workload(t, bench.GenReason, 0.02)
	w.Sessions = w.Sessions[:1]
	s := &w.Sessions[0]
	s.Key = "reasoner"
	s.Turns = []bench.Turn{s.Turns[0], {Append: []bench.Segment{{ID: 1, Len: 5}}}, {Append: []bench.Segment{{ID: 2, Len: 7}}}}
	for k := range s.Turns {
		s.Turns[k].Output, s.Turns[k].Hidden, s.Turns[k].Gap = 8, 6, 0
	}
	if _, err := Run(context.Background(), Options{URL: srv.URL, Model: "m", Workload: w, Speed: 1000}); err != nil {
		t.Fatal(err)
	}
	ps := f.prompts["reasoner"]
	if len(ps) != 3 {
		t.Fatalf("server saw %d prompts, want 3", len(ps))
	}
	for k := 1; k < len(ps); k++ {
		msg := s.Turns[k].Append[0].Len
		if !strings.HasPrefix(ps[k], ps[k-1]+"zz") || len(ps[k]) != len(ps[k-1])+2+msg {
			t.Fatalf("turn %d: %d chars after turn %d's %d: want its prompt, the 2-token answer and %d", k, len(ps[k]), k-1, len(ps[k-1]), msg)
		}
	}
}

// A session's client identity reaches the engine as its client would
// send it: the header, the OpenAI user field in the body, or nothing (as
// the simulator's clients do, so a router sees live what it saw there).
func TestRunSendsTheSessionsIdentity(t *testing.T) {
	f := newFake()
	srv := httptest.NewServer(f)
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	turns := func(c byte) []bench.Turn {
		return []bench.Turn{{Append: []bench.Segment{{ID: uint64(c), Len: 8}}, Output: 2}, {Append: []bench.Segment{{ID: uint64(c) + 1, Len: 4}}, Output: 2}}
	}
	w := &bench.Workload{Name: "ids", Sessions: []bench.Session{
		{ID: "a", Key: "key-a", Turns: turns(10)},
		{ID: "b", User: "user-b", Turns: turns(20)},
		{ID: "c", Turns: turns(30)},
	}}
	rep, err := Run(context.Background(), Options{URL: srv.URL, Model: "m", Workload: w, Speed: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Requests) != 6 {
		t.Fatalf("%d requests measured, want 6", len(rep.Requests))
	}
	if n := len(f.prompts["key-a"]); n != 2 {
		t.Errorf("%d requests carried session a's header, want 2", n)
	}
	if n := len(f.prompts[""]); n != 4 {
		t.Fatalf("%d requests without a header, want 4 (sessions b and c)", n)
	}
	byUser := map[string]int{}
	for _, p := range f.prompts[""] {
		byUser[f.users[p]]++
	}
	for _, p := range f.prompts["key-a"] {
		if u, ok := f.users[p]; ok {
			t.Errorf("session a sent a user field %q", u)
		}
	}
	if byUser["user-b"] != 2 || byUser[""] != 2 || len(f.users) != 2 {
		t.Errorf("user fields %v (by prompt %v), want session b's two requests with user-b and none elsewhere", byUser, f.users)
	}
}

func TestRunSaltChangesText(t *testing.T) {
	f := newFake()
	srv := httptest.NewServer(f)
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	w := workload(t, bench.GenHerding, 0.002) // 3 requests
	for _, salt := range []uint64{0, 1} {
		if _, err := Run(context.Background(), Options{URL: srv.URL, Workload: w, Speed: 1000, Salt: salt}); err != nil {
			t.Fatal(err)
		}
	}
	k := w.Sessions[0].Key
	if len(f.prompts[k]) != 2 || f.prompts[k][0] == f.prompts[k][1] || len(f.prompts[k][0]) != len(f.prompts[k][1]) {
		t.Fatalf("salted runs sent %d prompts; equal: %v", len(f.prompts[k]), len(f.prompts[k]) == 2 && f.prompts[k][0] == f.prompts[k][1])
	}
}

func TestRunErrors(t *testing.T) {
	f := newFake()
	f.status = http.StatusServiceUnavailable
	srv := httptest.NewServer(f)
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	w := workload(t, bench.GenChat, 0.005) // 2 multi-turn sessions
	rep, err := Run(context.Background(), Options{URL: srv.URL, Workload: w, Speed: 1000})
	if err != nil {
		t.Fatal(err)
	}
	// A failed turn ends its session: one request per session.
	if len(rep.Requests) != len(w.Sessions) {
		t.Fatalf("%d requests, want one per session (%d)", len(rep.Requests), len(w.Sessions))
	}
	for _, q := range rep.Requests {
		if q.Status != http.StatusServiceUnavailable || !strings.Contains(q.Err, "503") {
			t.Fatalf("request %+v, want a 503 error", q)
		}
	}
	if s := Summarize(rep); s.Errors != len(w.Sessions) {
		t.Fatalf("summary %+v", s)
	}
	if _, err := Run(context.Background(), Options{Workload: w}); !errors.Is(err, ErrOptions) {
		t.Errorf("no URL: %v", err)
	}
	if _, err := Run(context.Background(), Options{URL: srv.URL, Workload: w, Speed: -1}); !errors.Is(err, ErrOptions) {
		t.Errorf("negative speed: %v", err)
	}
	if rep, err := Run(context.Background(), Options{URL: "http://127.0.0.1:1", Workload: w, Speed: 1000, MaxSessions: 1}); err != nil || len(rep.Requests) != 1 || rep.Requests[0].Err == "" {
		t.Errorf("unreachable server: %+v, %v", rep, err)
	}
}

// Cancelling the context stops every session and Run returns promptly,
// with the context's error and no goroutine left behind.
func TestRunCancel(t *testing.T) {
	f := newFake()
	f.released = make(chan struct{}) // responses never start
	srv := httptest.NewServer(f)
	defer srv.Close()
	defer srv.Client().CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := Run(ctx, Options{URL: srv.URL, Workload: workload(t, bench.GenHerding, 0.01), Speed: 1000, MaxInFlight: 4})
		done <- err
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Run: %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// TestRunTokenIDs: with TokenIDs every prompt goes as the simulator's token
// ids (BOS, then the text's bytes), the same text a text run sends.
func TestRunTokenIDs(t *testing.T) {
	w := workload(t, bench.GenAgentic, 0.02)
	for i := range w.Sessions {
		for k := range w.Sessions[i].Turns {
			w.Sessions[i].Turns[k].Output = 2
			w.Sessions[i].Turns[k].Gap = 0
		}
	}
	var seen [2]map[string][]string
	for i, ids := range []bool{false, true} {
		f := newFake()
		srv := httptest.NewServer(f)
		rep, err := Run(context.Background(), Options{URL: srv.URL, Model: "m", Workload: w, Speed: 1000, TokenIDs: ids})
		srv.Client().CloseIdleConnections()
		srv.Close()
		if err != nil {
			t.Fatal(err)
		}
		if s := Summarize(rep); s.Errors != 0 || s.Requests != w.Requests() {
			t.Fatalf("token ids %v: %+v", ids, s)
		}
		if want := map[bool]int{false: 0, true: w.Requests()}[ids]; f.ids != want {
			t.Fatalf("token ids %v: %d prompts sent as ids, want %d", ids, f.ids, want)
		}
		seen[i] = f.prompts
	}
	for k, ps := range seen[0] {
		if fmt.Sprint(ps) != fmt.Sprint(seen[1][k]) {
			t.Fatalf("session %s: the token-id run sent other text than the text run", k)
		}
	}
}

// TestRunWords: with Words every workload token goes as a space and a
// letter, the letters those of a letters run, and a real BPE tokenizer
// (Qwen3's) encodes a rendered turn as exactly one token per workload
// token, so the engines see the workload's lengths.
func TestRunWords(t *testing.T) {
	w := workload(t, bench.GenAgentic, 0.02)
	for i := range w.Sessions {
		for k := range w.Sessions[i].Turns {
			w.Sessions[i].Turns[k].Output = 2
			w.Sessions[i].Turns[k].Gap = 0
		}
	}
	var first [2]string
	for i, words := range []bool{false, true} {
		f := newFake()
		srv := httptest.NewServer(f)
		rep, err := Run(context.Background(), Options{URL: srv.URL, Model: "m", Workload: w, Speed: 1000, Words: words, MaxSessions: 1})
		srv.Client().CloseIdleConnections()
		srv.Close()
		if err != nil {
			t.Fatal(err)
		}
		if s := Summarize(rep); s.Errors != 0 || s.Requests != len(w.Sessions[0].Turns) {
			t.Fatalf("words %v: %+v", words, s)
		}
		first[i] = f.prompts[w.Sessions[0].Key][0]
	}
	n := w.Sessions[0].Turns[0].Append[0].Len + w.Sessions[0].Turns[0].Append[1].Len
	if len(first[0]) != n || len(first[1]) != 2*n || strings.ReplaceAll(first[1], " ", "") != first[0] {
		t.Fatalf("first prompt: %d letters, %d bytes as words (want %d and %d), same letters %v",
			len(first[0]), len(first[1]), n, 2*n, strings.ReplaceAll(first[1], " ", "") == first[0])
	}
	dir := os.Getenv("KVROUTE_TOKENIZER_CACHE")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", ".cache", "tokenizers")
	}
	dir = filepath.Join(dir, "qwen3")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatalf("Qwen3 tokenizer files missing (%v): run `make fixtures`", err)
	}
	l, err := tokenize.LoadLocal(tokenize.ModelConfig{Kind: tokenize.KindLocal, TokenizerJSON: filepath.Join(dir, "tokenizer.json")})
	if err != nil {
		t.Fatal(err)
	}
	toks, err := l.Tokenize(route.TokenizeInput{Prompt: first[1], AddSpecialTokens: true})
	if err != nil || len(toks.IDs) != n {
		t.Fatalf("Qwen3 encodes the words as %d tokens (%v), want %d", len(toks.IDs), err, n)
	}
	if _, err := Run(context.Background(), Options{URL: "http://127.0.0.1:1", Workload: w, Words: true, TokenIDs: true}); !errors.Is(err, ErrOptions) {
		t.Fatalf("Words with TokenIDs: %v", err)
	}
}

func TestSumLines(t *testing.T) {
	text := `# HELP vllm:num_preemptions_total x
vllm:num_preemptions_total{engine="0",model_name="m"} 3
vllm:num_preemptions_total{engine="1",model_name="m"} 4.5
vllm:num_preemptions_created{engine="0"} 99
kvroute_decisions_total{degraded="",policy="kvroute",reason="cost",replica="a"} 7
kvroute_decisions_total{degraded="tokenize_timeout",policy="kvroute",reason="load",replica="a"} 2
`
	for _, c := range []struct {
		prefix   string
		contains []string
		want     float64
	}{
		{"vllm:num_preemptions_total{", nil, 7.5},
		{"kvroute_decisions_total{", nil, 9},
		{"kvroute_decisions_total{", []string{`degraded=""`}, 7},
		{"missing{", nil, 0},
	} {
		got, err := sumLines(strings.NewReader(text), c.prefix, c.contains...)
		if err != nil || got != c.want {
			t.Errorf("%s %v: %v, %v; want %v", c.prefix, c.contains, got, err, c.want)
		}
	}
	if _, err := sumLines(strings.NewReader("x{} notanumber\n"), "x{"); err == nil {
		t.Error("a bad sample was summed")
	}
}

// kvroute's config for the stack: the bench's sections, with the extra
// YAML a user passes merged in key by key (its values win), so that
// passing a routing or telemetry section neither duplicates a key nor
// loses the decision history -requests needs.
func TestKVRouteExtraMergesTheUsersYAML(t *testing.T) {
	o := &BenchOptions{Tokenizer: TokenizerRemote, Requests: true,
		KVRouteExtra: "routing: {usage_sample_every: 8}\ntelemetry: {log_level: debug}\npolicy: {name: leastload}\n"}
	got, err := o.kvrouteExtra(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Routing struct {
			DecisionHistory  int `yaml:"decision_history"`
			UsageSampleEvery int `yaml:"usage_sample_every"`
		} `yaml:"routing"`
		Telemetry struct {
			LogLevel string `yaml:"log_level"`
		} `yaml:"telemetry"`
		Tokenizer struct {
			Default struct {
				Kind string `yaml:"kind"`
			} `yaml:"default"`
		} `yaml:"tokenizer"`
		Policy struct {
			Name string `yaml:"name"`
		} `yaml:"policy"`
	}
	if err := yaml.Unmarshal([]byte(got), &cfg); err != nil {
		t.Fatalf("rendered config is not YAML: %v\n%s", err, got)
	}
	if cfg.Routing.DecisionHistory != decisionHistory || cfg.Routing.UsageSampleEvery != 8 ||
		cfg.Telemetry.LogLevel != "debug" || cfg.Tokenizer.Default.Kind != "remote" || cfg.Policy.Name != "leastload" {
		t.Errorf("merged config %+v\n%s", cfg, got)
	}
	// The render arm's kvroute asks the engines' render endpoints.
	o.Tokenizer, o.KVRouteExtra = TokenizerRender, ""
	if got, err = o.kvrouteExtra(t.TempDir()); err != nil || yaml.Unmarshal([]byte(got), &cfg) != nil || cfg.Tokenizer.Default.Kind != "render" {
		t.Errorf("render tokenizer: %v\n%s", err, got)
	}
	o.KVRouteExtra = "routing: [1, 2"
	if _, err := o.kvrouteExtra(t.TempDir()); err == nil {
		t.Error("malformed extra YAML accepted")
	}
}

// A slowed engine gets enginesim's --slow-after and --slow-to (the same
// engine index in each arm), the others none; an engine out of range, a
// negative time or a speed outside (0, 1] is refused before anything
// starts.
func TestBenchSlowEngines(t *testing.T) {
	o := &BenchOptions{Root: t.TempDir(), Engines: 4, Tokenizer: TokenizerIDs,
		Workload: func(int) (*bench.Workload, uint64, error) { return nil, 0, nil },
		Slow:     []bench.SpeedChange{{Replica: 1, At: 30 * time.Second, Speed: 0.05}}}
	if err := o.defaults(); err != nil {
		t.Fatal(err)
	}
	common := []string{"--prefill-tokens-per-s", "16000"}
	if got, want := strings.Join(o.engineArgs(1, common), " "), "--seed 2 --prefill-tokens-per-s 16000 --slow-after 30s --slow-to 0.05"; got != want {
		t.Errorf("engine 1: %q, want %q", got, want)
	}
	if got, want := strings.Join(o.engineArgs(0, common), " "), "--seed 1 --prefill-tokens-per-s 16000"; got != want {
		t.Errorf("engine 0: %q, want %q", got, want)
	}
	for _, bad := range []bench.SpeedChange{
		{Replica: 4, At: time.Second, Speed: 0.5},
		{Replica: -1, At: time.Second, Speed: 0.5},
		{Replica: 1, At: -time.Second, Speed: 0.5},
		{Replica: 1, At: time.Second, Speed: 0},
		{Replica: 1, At: time.Second, Speed: 1.5},
	} {
		o.Slow = []bench.SpeedChange{bad}
		if err := o.defaults(); !errors.Is(err, ErrOptions) {
			t.Errorf("slow engine %+v: %v, want ErrOptions", bad, err)
		}
	}
}
