package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/testing/protocmp"

	kvroutev1 "github.com/kvroute/kvroute/proto/kvroute/v1"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/route"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeExplainer records requests and answers with a fixed decision or error.
type fakeExplainer struct {
	mu   sync.Mutex
	got  []route.Request
	d    route.Decision
	err  error
	seen int
}

func (f *fakeExplainer) Explain(_ context.Context, req route.Request) (route.Decision, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got = append(f.got, req)
	f.seen++
	return f.d, f.err
}

func (f *fakeExplainer) last(t *testing.T) route.Request {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.got) == 0 {
		t.Fatal("explainer not called")
	}
	return f.got[len(f.got)-1]
}

// parse is a tiny OpenAI-ish parser: {"model":..., "prompt":...}.
func parse(path string, body []byte) (route.Request, error) {
	var b struct {
		Model  string `json:"model"`
		Prompt string `json:"prompt"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return route.Request{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if b.Model == "" {
		return route.Request{}, fmt.Errorf("%w: model is required", ErrBadRequest)
	}
	return route.Request{Model: b.Model, Input: route.TokenizeInput{Prompt: b.Prompt + "@" + path}}, nil
}

type fakeReplicas []ReplicaInfo

func (f fakeReplicas) ReplicaInfos() []ReplicaInfo { return f }

type fakeIndex index.Stats

func (f fakeIndex) Stats() index.Stats { return index.Stats(f) }

func decision() route.Decision {
	return route.Decision{
		Replica:      "r1",
		Address:      "10.0.0.2:8000",
		Fallbacks:    []string{"10.0.0.1:8000"},
		Policy:       "blended",
		Reason:       "cost",
		PromptTokens: 100,
		PromptBlocks: 6,
		MaxTokens:    32000,
		TokenSource:  "remote",
		// A cap the router learned requests generate 640 tokens of.
		ExpectedOutputTokens: 640,
		TokenizeTime:         1500 * time.Microsecond,
		DecideTime:           20 * time.Microsecond,
		Candidates: []route.Candidate{
			{Replica: "r0", Address: "10.0.0.1:8000", Matched: [index.NumTiers]int{1, 0, 0}, Trust: 1, Load: load.Load{ActiveRequests: 3, Healthy: true}, Cost: 5.5, Eligible: true},
			{Replica: "r1", Address: "10.0.0.2:8000", Matched: [index.NumTiers]int{4, 2, 0}, Trust: 0.5, Load: load.Load{KVUsage: 0.25, Healthy: true}, Cost: 1.25, Eligible: true, Approximate: true},
			{Replica: "r2", Address: "10.0.0.3:8000", Cost: math.NaN()},
		},
	}
}

func newServer(t *testing.T, ex *fakeExplainer) *Server {
	t.Helper()
	s, err := New(Config{
		Explainer: ex,
		Parse:     parse,
		Replicas: fakeReplicas{{
			ID: "r0", Address: "10.0.0.1:8000", Model: "m", Engine: "vllm",
			Load:             load.Load{ActivePrefillBlocks: 2, ActiveDecodeBlocks: 3, ActiveRequests: 1, WaitingRequests: 4, KVUsage: 0.5, Healthy: true},
			EventsConfigured: true, Warm: true, LastSeq: 42, Credit: 0.9,
			Cache: load.CacheTotals{Predicted: 160, Served: 144},
		}},
		Index: fakeIndex{Keys: 10, Holders: 12, Engine: 11, Replicas: 2, Bytes: 4096, Budget: 1 << 20, Evicted: 3},
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// dial serves s over bufconn and returns a client; everything stops at cleanup.
func dial(t *testing.T, s *Server) kvroutev1.AdminClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer()
	s.Register(g)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		g.Stop()
		<-done
	})
	return kvroutev1.NewAdminClient(cc)
}

func TestNewRejectsMissingParts(t *testing.T) {
	full := Config{Explainer: &fakeExplainer{}, Parse: parse, Replicas: fakeReplicas{}, Index: fakeIndex{}}
	for name, mut := range map[string]func(*Config){
		"explainer": func(c *Config) { c.Explainer = nil },
		"parse":     func(c *Config) { c.Parse = nil },
		"replicas":  func(c *Config) { c.Replicas = nil },
		"index":     func(c *Config) { c.Index = nil },
	} {
		t.Run(name, func(t *testing.T) {
			c := full
			mut(&c)
			if _, err := New(c); err == nil || !strings.Contains(strings.ToLower(err.Error()), name) {
				t.Fatalf("New: err = %v, want one naming %s", err, name)
			}
		})
	}
	if _, err := New(full); err != nil {
		t.Fatalf("New(full): %v", err)
	}
}

func TestExplainGRPC(t *testing.T) {
	ex := &fakeExplainer{d: decision()}
	c := dial(t, newServer(t, ex))
	ctx := t.Context()

	t.Run("body", func(t *testing.T) {
		got, err := c.Explain(ctx, &kvroutev1.ExplainRequest{Body: []byte(`{"model":"m","prompt":"hi"}`), Path: "/v1/completions", SessionKey: "s1"})
		if err != nil {
			t.Fatal(err)
		}
		want := &kvroutev1.ExplainResponse{
			Replica: "r1", Address: "10.0.0.2:8000", Fallbacks: []string{"10.0.0.1:8000"},
			Policy: "blended", Reason: "cost", PromptTokens: 100, PromptBlocks: 6, TokenSource: "remote",
			TokenizeMicros: 1500, DecideMicros: 20, MaxTokens: 32000, ExpectedOutputTokens: 640,
			Candidates: []*kvroutev1.Candidate{
				{Replica: "r0", Address: "10.0.0.1:8000", Matched: &kvroutev1.TierBlocks{Gpu: 1}, Credit: 1, Load: &kvroutev1.Load{ActiveRequests: 3, Healthy: true}, Cost: 5.5, Eligible: true},
				{Replica: "r1", Address: "10.0.0.2:8000", Matched: &kvroutev1.TierBlocks{Gpu: 4, Cpu: 2}, Credit: 0.5, Load: &kvroutev1.Load{KvUsage: 0.25, Healthy: true}, Cost: 1.25, Eligible: true, Picked: true, Approximate: true},
				{Replica: "r2", Address: "10.0.0.3:8000", Matched: &kvroutev1.TierBlocks{}, Load: &kvroutev1.Load{}, Cost: math.NaN()},
			},
		}
		if diff := cmp.Diff(want, got, protocmp.Transform(), cmp.Comparer(func(a, b float64) bool {
			return a == b || (math.IsNaN(a) && math.IsNaN(b))
		})); diff != "" {
			t.Fatalf("Explain (-want +got):\n%s", diff)
		}
		req := ex.last(t)
		if req.Model != "m" || req.SessionKey != "s1" || req.Input.Prompt != "hi@/v1/completions" {
			t.Fatalf("explainer got %+v", req)
		}
	})
	t.Run("token ids", func(t *testing.T) {
		if _, err := c.Explain(ctx, &kvroutev1.ExplainRequest{TokenIds: []uint32{1, 2, 3}, Model: "m2"}); err != nil {
			t.Fatal(err)
		}
		req := ex.last(t)
		if req.Model != "m2" || !cmp.Equal(req.Tokens, []uint32{1, 2, 3}) {
			t.Fatalf("explainer got %+v", req)
		}
	})
	t.Run("token ids override the body's prompt", func(t *testing.T) {
		if _, err := c.Explain(ctx, &kvroutev1.ExplainRequest{Body: []byte(`{"model":"m","prompt":"x"}`), TokenIds: []uint32{7}}); err != nil {
			t.Fatal(err)
		}
		if req := ex.last(t); req.Model != "m" || !cmp.Equal(req.Tokens, []uint32{7}) {
			t.Fatalf("explainer got %+v", req)
		}
	})
}

func TestExplainErrors(t *testing.T) {
	tests := []struct {
		name string
		in   *kvroutev1.ExplainRequest
		err  error
		want codes.Code
	}{
		{"empty", &kvroutev1.ExplainRequest{}, nil, codes.InvalidArgument},
		{"tokens without model", &kvroutev1.ExplainRequest{TokenIds: []uint32{1}}, nil, codes.InvalidArgument},
		{"malformed body", &kvroutev1.ExplainRequest{Body: []byte(`{"model":`)}, nil, codes.InvalidArgument},
		{"unknown model", &kvroutev1.ExplainRequest{Body: []byte(`{"model":"zz"}`)}, fmt.Errorf("decide: %w", route.ErrUnknownModel), codes.NotFound},
		{"no replica", &kvroutev1.ExplainRequest{Body: []byte(`{"model":"m"}`)}, fmt.Errorf("decide: %w", route.ErrNoReplica), codes.Unavailable},
		{"other", &kvroutev1.ExplainRequest{Body: []byte(`{"model":"m"}`)}, errors.New("boom"), codes.Internal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ex := &fakeExplainer{err: tt.err}
			c := dial(t, newServer(t, ex))
			_, err := c.Explain(t.Context(), tt.in)
			if got := status.Code(err); got != tt.want {
				t.Fatalf("code = %v (%v), want %v", got, err, tt.want)
			}
			if tt.want == codes.InvalidArgument && ex.seen != 0 {
				t.Fatal("explainer called for a bad request")
			}
		})
	}
}

func TestReplicasAndIndexStats(t *testing.T) {
	c := dial(t, newServer(t, &fakeExplainer{}))
	reps, err := c.Replicas(t.Context(), &kvroutev1.ReplicasRequest{})
	if err != nil {
		t.Fatal(err)
	}
	wantReps := &kvroutev1.ReplicasResponse{Replicas: []*kvroutev1.Replica{{
		Id: "r0", Address: "10.0.0.1:8000", Model: "m", Engine: "vllm", Healthy: true,
		Load:             &kvroutev1.Load{ActivePrefillBlocks: 2, ActiveDecodeBlocks: 3, ActiveRequests: 1, WaitingRequests: 4, KvUsage: 0.5, Healthy: true},
		EventsConfigured: true, Warm: true, LastSeq: 42, Credit: 0.9,
		PredictedCachedTokens: 160, ServedCachedTokens: 144,
	}}}
	if diff := cmp.Diff(wantReps, reps, protocmp.Transform()); diff != "" {
		t.Fatalf("Replicas (-want +got):\n%s", diff)
	}
	st, err := c.IndexStats(t.Context(), &kvroutev1.IndexStatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	wantSt := &kvroutev1.IndexStatsResponse{Keys: 10, Holders: 12, EngineHashes: 11, Replicas: 2, Bytes: 4096, BudgetBytes: 1 << 20, Evicted: 3}
	if diff := cmp.Diff(wantSt, st, protocmp.Transform()); diff != "" {
		t.Fatalf("IndexStats (-want +got):\n%s", diff)
	}
}

func TestHTTPMirror(t *testing.T) {
	ex := &fakeExplainer{d: decision()}
	srv := httptest.NewServer(newServer(t, ex).Handler())
	defer srv.Close()

	do := func(t *testing.T, method, path, body string, hdr map[string]string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		if len(b) > 0 && resp.Header.Get("Content-Type") == "application/json" {
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatalf("%s %s: body is not JSON: %v\n%s", method, path, err, b)
			}
		}
		return resp.StatusCode, m
	}

	t.Run("explain", func(t *testing.T) {
		code, m := do(t, "POST", "/debug/explain?path=/v1/completions", `{"model":"m","prompt":"p"}`, map[string]string{"x-session-id": "abc"})
		if code != 200 || m["replica"] != "r1" || m["policy"] != "blended" {
			t.Fatalf("code %d body %v", code, m)
		}
		cands, _ := m["candidates"].([]any)
		if len(cands) != 3 {
			t.Fatalf("candidates = %v", m["candidates"])
		}
		if c2 := cands[2].(map[string]any); c2["cost"] != "NaN" || c2["picked"] != false {
			t.Fatalf("candidate 2 = %v", c2)
		}
		if req := ex.last(t); req.SessionKey != "abc" || req.Input.Prompt != "p@/v1/completions" {
			t.Fatalf("explainer got %+v", req)
		}
	})
	t.Run("session query wins over header", func(t *testing.T) {
		if code, _ := do(t, "POST", "/debug/explain?session=q", `{"model":"m"}`, map[string]string{"x-session-id": "h"}); code != 200 {
			t.Fatalf("code %d", code)
		}
		if req := ex.last(t); req.SessionKey != "q" {
			t.Fatalf("session = %q", req.SessionKey)
		}
	})
	t.Run("malformed body is a JSON 400", func(t *testing.T) {
		code, m := do(t, "POST", "/debug/explain", `{"model":`, nil)
		e, _ := m["error"].(map[string]any)
		if code != 400 || e == nil || e["code"] != float64(400) || !strings.Contains(e["message"].(string), "bad request") {
			t.Fatalf("code %d body %v", code, m)
		}
	})
	t.Run("replicas", func(t *testing.T) {
		code, m := do(t, "GET", "/debug/replicas", "", nil)
		reps, _ := m["replicas"].([]any)
		if code != 200 || len(reps) != 1 || reps[0].(map[string]any)["last_seq"] != "42" {
			t.Fatalf("code %d body %v", code, m)
		}
	})
	t.Run("index", func(t *testing.T) {
		code, m := do(t, "GET", "/debug/index", "", nil)
		if code != 200 || m["keys"] != "10" || m["engine_hashes"] != "11" {
			t.Fatalf("code %d body %v", code, m)
		}
	})
	t.Run("wrong method", func(t *testing.T) {
		if code, _ := do(t, "GET", "/debug/explain", "", nil); code != http.StatusMethodNotAllowed {
			t.Fatalf("code %d", code)
		}
	})
	t.Run("unavailable maps to 503", func(t *testing.T) {
		ex2 := &fakeExplainer{err: route.ErrNoReplica}
		s2 := httptest.NewServer(newServer(t, ex2).Handler())
		defer s2.Close()
		resp, err := s2.Client().Post(s2.URL+"/debug/explain", "application/json", strings.NewReader(`{"model":"m"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("code %d", resp.StatusCode)
		}
	})
}
