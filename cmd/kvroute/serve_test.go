package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/encoding/protojson"

	kvroutev1 "github.com/kvroute/kvroute/proto/kvroute/v1"

	"github.com/kvroute/kvroute/pkg/respstore"
	"github.com/kvroute/kvroute/pkg/route"
	"github.com/kvroute/kvroute/pkg/telemetry"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeEngine answers the engine endpoints kvroute calls: /health, /metrics
// (vLLM names) and /tokenize (one token per byte).
func fakeEngine(t *testing.T, running int) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} %d\n"+
			"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 0\n"+
			"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n", running)
	})
	mux.HandleFunc("POST /tokenize", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Prompt string `json:"prompt"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		toks := make([]uint32, len(req.Prompt))
		for i := range req.Prompt {
			toks[i] = uint32(req.Prompt[i])
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": toks, "count": len(toks), "max_model_len": 4096})
	})
	s := httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func listenLocal(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// startServe builds the router from cfg and serves it on fresh loopback
// listeners until the test ends; then it stops it, checks serve returned
// cleanly, and prints the router's logs if the test failed.
func startServe(t *testing.T, cfg *Config) (*wiring, listeners, *syncBuffer) {
	t.Helper()
	logs := new(syncBuffer)
	r, err := build(cfg, slog.New(slog.NewTextHandler(logs, nil)), &telemetry.Tracing{Provider: noop.NewTracerProvider(), Propagator: propagation.TraceContext{}})
	if err != nil {
		t.Fatal(err)
	}
	lis := listeners{extproc: listenLocal(t), admin: listenLocal(t), metrics: listenLocal(t)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("serve did not return after cancel")
		}
		if t.Failed() {
			t.Logf("logs:\n%s", logs.String())
		}
	})
	return r, lis, logs
}

// TestServeEndToEnd runs the composition root in process against two fake
// engines without event streams: readiness, the admin API over gRPC (the
// explain command) and HTTP, metrics, and a clean, leak-free shutdown.
func TestServeEndToEnd(t *testing.T) {
	e1, e2 := fakeEngine(t, 3), fakeEngine(t, 0)
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	cfg, err := ParseConfig([]byte(fmt.Sprintf(`
listeners: {drain_timeout: 2s}
replicas:
  static:
  - {id: busy, address: %q, model: m}
  - {id: idle, address: %q, model: m}
policy: {seed: 7}
tokenizer: {default: {kind: remote, timeout: 2s}}
load: {scrape_interval: 20ms}
readiness: {warm_timeout: 5s}
`, host(e1), host(e2))))
	if err != nil {
		t.Fatal(err)
	}
	r, lis, _ := startServe(t, cfg)

	metrics := "http://" + lis.metrics.Addr().String()
	waitUntil(t, "ready", func() bool {
		resp, err := http.Get(metrics + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	// Both replicas probed healthy; the busy one's scraped load is visible.
	waitUntil(t, "scraped load", func() bool { return r.set.Load("busy").ActiveRequests == 3 })

	// explain over gRPC, as the CLI does.
	req := filepath.Join(t.TempDir(), "req.json")
	if err := os.WriteFile(req, []byte(`{"model":"m","prompt":"hello there, a prompt of a few blocks at least"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"explain", "-f", req, "--addr", lis.admin.Addr().String()}, &out, &errOut); code != 0 {
		t.Fatalf("explain exit %d: %s", code, errOut.String())
	}
	table := out.String()
	for _, want := range []string{"pick:     idle", "tokens from remote", "busy"} {
		if !strings.Contains(table, want) {
			t.Errorf("explain output lacks %q:\n%s", want, table)
		}
	}
	marked := false
	for _, l := range strings.Split(table, "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[0] == "*" && f[1] == "idle" {
			marked = true
		}
	}
	if !marked {
		t.Errorf("the picked row is not marked:\n%s", table)
	}
	// decisions: this config keeps no history, and says so.
	out.Reset()
	errOut.Reset()
	if code := run(t.Context(), []string{"decisions", "--addr", lis.admin.Addr().String()}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "routing.decision_history is 0") {
		t.Errorf("decisions without a history: exit %d, stderr %q", code, errOut.String())
	}
	out.Reset()
	if code := run(t.Context(), []string{"explain", "-f", req, "--json", "--addr", lis.admin.Addr().String()}, &out, &errOut); code != 0 {
		t.Fatalf("explain --json exit %d: %s", code, errOut.String())
	}
	var js struct {
		Replica    string `json:"replica"`
		Candidates []struct {
			Credit float64 `json:"credit"`
		} `json:"candidates"`
	}
	if err := json.Unmarshal(out.Bytes(), &js); err != nil || js.Replica != "idle" || len(js.Candidates) != 2 {
		t.Fatalf("explain --json: %v %+v\n%s", err, js, out.String())
	}
	// Neither replica has an events endpoint: no engine view (State credit
	// 0), so both are credited through the dispatch-learned index, which
	// explain never writes.
	for _, c := range js.Candidates {
		if c.Credit != route.DefaultApproxTrust {
			t.Errorf("a replica without an events endpoint has credit %v, want the approximate mode's %v", c.Credit, route.DefaultApproxTrust)
		}
	}
	if st := r.set.Trust("idle"); st != 0 {
		t.Errorf("State credit of a replica without events = %v, want 0", st)
	}

	// HTTP mirror on the same port.
	admin := "http://" + lis.admin.Addr().String()
	resp, err := http.Get(admin + "/debug/replicas")
	if err != nil {
		t.Fatal(err)
	}
	var reps kvroutev1.ReplicasResponse
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := protojson.Unmarshal(b, &reps); err != nil || len(reps.Replicas) != 2 || reps.Replicas[0].GetLoad().GetActiveRequests() != 3 {
		t.Fatalf("GET /debug/replicas: %v\n%s", err, b)
	}
	// The tokenizer's page (each local tokenizer's self-check) beside it.
	resp, err = http.Get(admin + "/debug/tokenizer")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	var tokPage struct {
		Models *[]json.RawMessage `json:"models"`
	}
	if err := json.Unmarshal(b, &tokPage); err != nil || resp.StatusCode != http.StatusOK || tokPage.Models == nil {
		t.Fatalf("GET /debug/tokenizer: %d %v\n%s", resp.StatusCode, err, b)
	}
	// Metrics.
	resp, err = http.Get(metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, name := range []string{"kvroute_index_keys", "kvroute_build_info", "kvroute_replica_healthy", "kvroute_approx_index_entries", "kvroute_approx_index_evicted_total"} {
		if !strings.Contains(string(b), name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRunCommands(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"version", []string{"version"}, 0, "kvroute dev", ""},
		{"no command", nil, 2, "", "usage:"},
		{"unknown", []string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{"serve without replicas", []string{"serve"}, 1, "", "replicas: one of static, file, dns or kubernetes is required"},
		{"serve with a bad flag", []string{"serve", "--nope"}, 1, "", "flag provided but not defined"},
		{"serve with a missing file", []string{"serve", "--config", "/nonexistent/kvroute.yaml"}, 1, "", "no such file"},
		{"explain without a file", []string{"explain"}, 1, "", "-f request.json is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(t.Context(), tt.args, &out, &errOut)
			if code != tt.code || !strings.Contains(out.String(), tt.stdout) || !strings.Contains(errOut.String(), tt.stderr) {
				t.Fatalf("exit %d (want %d)\nstdout: %s\nstderr: %s", code, tt.code, out.String(), errOut.String())
			}
		})
	}
}

func TestServeFlagsOverrideFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.yaml")
	if err := os.WriteFile(path, []byte(minimal+"policy: {name: leastload}\nlisteners: {admin: '127.0.0.1:1111'}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := parseServeFlags([]string{"--config", path, "--policy", "roundrobin", "--metrics-addr", "127.0.0.1:2222"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	c, err := loadServeConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	if c.Policy.Name != "roundrobin" || c.Listeners.Metrics != "127.0.0.1:2222" || c.Listeners.Admin != "127.0.0.1:1111" {
		t.Fatalf("policy %s metrics %s admin %s", c.Policy.Name, c.Listeners.Metrics, c.Listeners.Admin)
	}
	// An override is validated like the file.
	f.policy = "fastest"
	if _, err := loadServeConfig(f); err == nil || !strings.Contains(err.Error(), "fastest") {
		t.Fatalf("bad override accepted: %v", err)
	}
}

func TestPrintDecisions(t *testing.T) {
	var b bytes.Buffer
	at := time.Date(2026, 12, 2, 8, 30, 1, 250e6, time.UTC)
	err := printDecisions(&b, &kvroutev1.DecisionsResponse{Total: 7, Decisions: []*kvroutev1.RecordedDecision{
		{UnixNanos: at.UnixNano(), Decision: &kvroutev1.ExplainResponse{
			Replica: "r1", Address: "a1", Policy: "kvroute", Reason: "cost", Session: "conv:9", QueuedTokens: 4096,
			Candidates: []*kvroutev1.Candidate{
				{Replica: "r0", Address: "a0", Matched: &kvroutev1.TierBlocks{Gpu: 90}, Cost: 2.5, Eligible: true, Home: true, Load: &kvroutev1.Load{}},
				{Replica: "r1", Address: "a1", Cost: 1.25, Eligible: true, Picked: true, Load: &kvroutev1.Load{}},
			},
		}},
		{UnixNanos: at.Add(time.Second).UnixNano(), Decision: &kvroutev1.ExplainResponse{
			Replica: "r0", Address: "a0", Policy: "kvroute", Reason: "cost", Session: "conv:p1f", SessionFromPrompt: true,
			Candidates: []*kvroutev1.Candidate{{Replica: "r0", Address: "a0", Cost: 1, Eligible: true, Picked: true, Load: &kvroutev1.Load{}}},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"2 of 7 decisions since start", "=== 08:30:01.250  session conv:9  queued ahead 4096 tokens", "=== 08:30:02.250  session conv:p1f (from its prompt)  queued ahead 0 tokens", "pick:     r1"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	home := false
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "h" && f[1] == "r0" {
			home = true
		}
	}
	if !home {
		t.Errorf("the home row r0 is not marked h:\n%s", out)
	}
}

func TestPrintExplainMarksPickAndIneligible(t *testing.T) {
	var b bytes.Buffer
	err := printExplain(&b, &kvroutev1.ExplainResponse{
		Replica: "r1", Address: "a1", Policy: "blended", Reason: "cost", Degraded: "cold_index",
		Candidates: []*kvroutev1.Candidate{
			{Replica: "r0", Address: "a0", Matched: &kvroutev1.TierBlocks{Gpu: 3}, Cost: math.NaN(), Load: &kvroutev1.Load{}},
			{Replica: "r1", Address: "a1", Matched: &kvroutev1.TierBlocks{Gpu: 5, Cpu: 2}, Cost: 1.5, Eligible: true, Picked: true, Load: &kvroutev1.Load{}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	var r0, r1 string
	for _, l := range lines {
		switch {
		case strings.Contains(l, " r0 "):
			r0 = l
		case strings.Contains(l, " r1 "):
			r1 = l
		}
	}
	if !strings.HasPrefix(strings.TrimSpace(r0), "x") || !strings.HasSuffix(strings.TrimSpace(r0), "-") {
		t.Errorf("ineligible row %q: want an x mark and - for a NaN cost", r0)
	}
	if !strings.HasPrefix(strings.TrimSpace(r1), "*") || !strings.Contains(r1, "1.50") {
		t.Errorf("picked row %q", r1)
	}
	if !strings.Contains(b.String(), "degraded: cold_index") {
		t.Errorf("no degraded reason:\n%s", b.String())
	}
	if strings.Contains(b.String(), "output:") {
		t.Errorf("an output line for a request with no max_tokens and no expected output:\n%s", b.String())
	}
	for _, tc := range []struct {
		max, expected int64
		want          string
	}{
		{32000, 640, "output:   max_tokens 32000, 640 tokens expected\n"},
		{0, 120, "output:   max_tokens none, 120 tokens expected\n"},
	} {
		b.Reset()
		if err := printExplain(&b, &kvroutev1.ExplainResponse{Replica: "r1", MaxTokens: tc.max, ExpectedOutputTokens: tc.expected}); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), tc.want) {
			t.Errorf("max_tokens %d, expected %d: no line %q in\n%s", tc.max, tc.expected, tc.want, b.String())
		}
	}
}

// TestServeReplicaFileReload: a watched replica file drives the routable
// set: replicas added and removed by editing it, ready: false leaving the
// routable set but not the listing.
func TestServeReplicaFileReload(t *testing.T) {
	e1, e2 := fakeEngine(t, 0), fakeEngine(t, 0)
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	dir := t.TempDir()
	file := filepath.Join(dir, "replicas.yaml")
	write := func(body string) {
		t.Helper()
		// Write then rename, as a ConfigMap update does.
		tmp := filepath.Join(dir, "tmp.yaml")
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write(fmt.Sprintf("replicas:\n- {id: one, address: %q, model: m}\n", host(e1)))
	cfg, err := ParseConfig(fmt.Appendf(nil, `
replicas: {file: {path: %q, interval: 20ms}}
load: {scrape_interval: 20ms}
readiness: {warm_timeout: 5s}
`, file))
	if err != nil {
		t.Fatal(err)
	}
	r, err := build(cfg, slog.New(slog.DiscardHandler), &telemetry.Tracing{Provider: noop.NewTracerProvider(), Propagator: propagation.TraceContext{}})
	if err != nil {
		t.Fatal(err)
	}
	lis := listeners{extproc: listenLocal(t), admin: listenLocal(t), metrics: listenLocal(t)}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.serve(ctx, lis) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	ids := func() (listed, routable string) {
		var l, rt []string
		for _, ri := range (adminReplicas{fleet: r.fleet}).ReplicaInfos() {
			l = append(l, string(ri.ID))
		}
		for _, rep := range r.set.Replicas() {
			rt = append(rt, string(rep.ID))
		}
		return strings.Join(l, ","), strings.Join(rt, ",")
	}
	want := func(listed, routable string) {
		t.Helper()
		waitUntil(t, fmt.Sprintf("listed %q routable %q", listed, routable), func() bool {
			l, rt := ids()
			return l == listed && rt == routable
		})
	}
	want("one", "one")
	write(fmt.Sprintf("replicas:\n- {id: one, address: %q, model: m}\n- {id: two, address: %q, model: m}\n", host(e1), host(e2)))
	want("one,two", "one,two")
	write(fmt.Sprintf("replicas:\n- {id: one, address: %q, model: m, ready: false}\n- {id: two, address: %q, model: m}\n", host(e1), host(e2)))
	want("one,two", "two")
	// A bad edit keeps the last good set.
	write("replicas:\n- {id: three, address: not-an-address, model: m}\n")
	waitUntil(t, "the bad edit to be seen and refused", func() bool {
		fams, err := r.reg.Gather()
		if err != nil {
			return false
		}
		for _, f := range fams {
			if f.GetName() == "kvroute_discovery_refresh_errors_total" {
				for _, m := range f.GetMetric() {
					if m.GetCounter().GetValue() > 0 {
						return true
					}
				}
			}
		}
		return false
	})
	if l, rt := ids(); l != "one,two" || rt != "two" {
		t.Fatalf("after a bad edit: listed %q routable %q", l, rt)
	}
	write(fmt.Sprintf("replicas:\n- {id: two, address: %q, model: m}\n", host(e2)))
	want("two", "two")
}

// TestAdminShowsCacheTotals: the admin API's per-replica cached-token
// totals are the fidelity figures of that replica (typed, not read back
// from metrics by name), zero for a replica without observations.
func TestAdminShowsCacheTotals(t *testing.T) {
	e1, e2 := fakeEngine(t, 0), fakeEngine(t, 0)
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	cfg, err := ParseConfig(fmt.Appendf(nil, `
replicas:
  static:
  - {id: a, address: %q, model: m}
  - {id: b, address: %q, model: m}
load: {scrape_interval: 20ms}
readiness: {warm_timeout: 5s}
`, host(e1), host(e2)))
	if err != nil {
		t.Fatal(err)
	}
	r, lis, _ := startServe(t, cfg)
	waitUntil(t, "both replicas listed", func() bool { return len(r.set.All()) == 2 })
	r.fid.Observe("a", 64, 16)
	r.fid.Observe("a", 32, 32)
	r.fid.Observe("b", 0, 8)

	resp, err := http.Get("http://" + lis.admin.Addr().String() + "/debug/replicas")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var reps kvroutev1.ReplicasResponse
	if err := protojson.Unmarshal(b, &reps); err != nil {
		t.Fatalf("%v\n%s", err, b)
	}
	type totals struct{ predicted, served int64 }
	got := map[string]totals{}
	for _, rep := range reps.GetReplicas() {
		got[rep.GetId()] = totals{rep.GetPredictedCachedTokens(), rep.GetServedCachedTokens()}
	}
	want := map[string]totals{"a": {96, 48}, "b": {0, 8}}
	for id, w := range want {
		if got[id] != w {
			t.Errorf("replica %s: predicted/served %+v, want %+v", id, got[id], w)
		}
	}
}

// Explaining a body that continues a stored response pins it where the
// router remembers the response, as routing it would, without asking a
// replica.
func TestExplainParserPinsStoredResponses(t *testing.T) {
	stored, err := respstore.New(respstore.Config{}.WithDefaults(), respstore.Options{
		Addresses: func(string) []string { t.Error("explaining looked a response up"); return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	stored.Stored("resp_1", "10.0.0.1:8000")
	parse := explainParser(stored)
	for body, want := range map[string]string{
		`{"model":"m","input":"next","previous_response_id":"resp_1"}`:   "10.0.0.1:8000",
		`{"model":"m","input":"next","previous_response_id":"resp_new"}`: "",
		`{"model":"m","input":"first"}`:                                  "",
	} {
		req, err := parse("/v1/responses", []byte(body))
		if err != nil || req.Pin != want {
			t.Errorf("%s: pin %q, %v; want %q", body, req.Pin, err, want)
		}
	}
	if req, err := parse("/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"previous_response_id":"resp_1"}`)); err != nil || req.Pin != "" {
		t.Errorf("a chat body: pin %q, %v", req.Pin, err)
	}
}
