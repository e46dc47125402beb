package load

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

func injectState(s *Scraper, id string, v Scraped) {
	p := &atomic.Pointer[Scraped]{}
	p.Store(&v)
	s.states.Store(id, p)
}

func TestParseEngineMetrics(t *testing.T) {
	tests := []struct {
		name    string
		text    string
		want    engineMetrics
		wantErr bool
	}{
		{
			name: "vllm with two engines",
			text: `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.99
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1234
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="24576"} 1
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="bad"} 1
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 7.0
vllm:num_preemptions_total{engine="1",model_name="m"} 2.0
`,
			want: engineMetrics{engine: "vllm", running: 5, waiting: 4, kvUsage: 0.5, kvBlocks: 24576, preemptions: 9, hasPreemptions: true},
		},
		{
			name: "old vllm falls back to gpu_cache_usage_perc",
			text: `vllm:num_requests_running{model_name="m"} 1
vllm:num_requests_waiting{model_name="m"} 0
vllm:gpu_cache_usage_perc{model_name="m"} 0.125
`,
			want: engineMetrics{engine: "vllm", running: 1, kvUsage: 0.125},
		},
		{
			name: "sglang",
			text: `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 7
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 2
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.75
# TYPE sglang:num_retracted_reqs gauge
sglang:num_retracted_reqs{model_name="m",pid="1"} 1
# TYPE sglang:num_retracted_requests_total counter
sglang:num_retracted_requests_total{model_name="m"} 48
`,
			want: engineMetrics{engine: "sglang", running: 7, waiting: 2, kvUsage: 0.75, preemptions: 48, hasPreemptions: true},
		},
		{
			name: "usage clamped to [0,1]",
			text: "vllm:num_requests_running 0\nvllm:kv_cache_usage_perc 1.7\n",
			want: engineMetrics{engine: "vllm", kvUsage: 1},
		},
		{name: "no engine metrics", text: "process_cpu_seconds_total 3\n", wantErr: true},
		{name: "garbage", text: "vllm:num_requests_running{ 3\n", wantErr: true},
	}
	s, err := NewScraper(ScraperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.parse(strings.NewReader(tc.text))
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if d := cmp.Diff(tc.want, got, cmp.AllowUnexported(engineMetrics{})); d != "" {
				t.Errorf("figures mismatch (-want +got):\n%s", d)
			}
		})
	}
}

// engine is a fake model server on a fixed loopback address that can be
// taken down (its listener closed) and brought back on the same address.
type engine struct {
	t       *testing.T
	addr    string
	mu      sync.Mutex
	srv     *httptest.Server
	running atomic.Int64
	preempt atomic.Int64 // vllm:num_preemptions_total
	scrapes atomic.Int64 // /metrics requests answered
	health  atomic.Int32 // HTTP status of /health
	// gate, when set, holds every /health answer until it is closed.
	gate atomic.Pointer[chan struct{}]
}

func newEngine(t *testing.T) *engine {
	e := &engine{t: t}
	e.health.Store(http.StatusOK)
	e.up("127.0.0.1:0")
	t.Cleanup(e.down)
	return e
}

func (e *engine) up(addr string) {
	var ln net.Listener
	var err error
	deadline := time.Now().Add(5 * time.Second)
	for {
		ln, err = net.Listen("tcp", addr)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		e.t.Fatalf("listen %s: %v", addr, err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) {
		if g := e.gate.Load(); g != nil {
			<-*g
		}
		w.WriteHeader(int(e.health.Load()))
	})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		e.scrapes.Add(1)
		fmt.Fprintf(w, "vllm:num_requests_running{model_name=\"m\"} %d\nvllm:num_requests_waiting{model_name=\"m\"} 1\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n", e.running.Load())
		fmt.Fprintf(w, "# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{model_name=\"m\"} %d\n", e.preempt.Load())
	})
	srv := httptest.NewUnstartedServer(mux)
	srv.Listener = ln
	srv.Start()
	e.mu.Lock()
	e.srv, e.addr = srv, ln.Addr().String()
	e.mu.Unlock()
}

func (e *engine) down() {
	e.mu.Lock()
	srv := e.srv
	e.srv = nil
	e.mu.Unlock()
	if srv != nil {
		srv.CloseClientConnections()
		srv.Close()
	}
}

func (e *engine) url() string { return "http://" + e.addr }

// eventually polls cond until it holds or a generous deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func runScraper(t *testing.T, cfg ScraperConfig) *Scraper {
	t.Helper()
	if cfg.Interval == 0 {
		cfg.Interval = 10 * time.Millisecond
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = time.Second
	}
	s, err := NewScraper(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		s.cfg.Client.CloseIdleConnections()
	})
	return s
}

func healthy(s *Scraper, id string) bool {
	v, ok := s.Get(id)
	return ok && v.Healthy
}

// The scraper marks the probe that first reads an engine's preemption
// counter higher; the count it starts from, and a count that falls (the
// engine restarted), are no preemption. View reports the replica as
// preempting for PreemptionHold after that probe.
func TestScraperSeesPreemptions(t *testing.T) {
	e := newEngine(t)
	e.preempt.Store(40) // preempted before the router started
	s := runScraper(t, ScraperConfig{})
	s.SetTargets([]Target{{ID: "r", URL: e.url()}})
	read := func(want float64) Scraped {
		t.Helper()
		var v Scraped
		eventually(t, fmt.Sprintf("preemptions read as %v", want), func() bool {
			var ok bool
			v, ok = s.Get("r")
			return ok && !v.MetricsAt.IsZero() && v.Preemptions == want
		})
		return v
	}
	if v := read(40); !v.PreemptedAt.IsZero() {
		t.Fatalf("the starting count was taken for a preemption at %v", v.PreemptedAt)
	}
	e.preempt.Store(42)
	v := read(42)
	if v.PreemptedAt.IsZero() || v.PreemptedAt.After(v.ProbedAt) {
		t.Fatalf("a rise to 42 was not marked: PreemptedAt %v, probed %v", v.PreemptedAt, v.ProbedAt)
	}
	at := v.PreemptedAt
	e.preempt.Store(3) // the engine restarted
	if v = read(3); !v.PreemptedAt.Equal(at) {
		t.Fatalf("a counter reset moved PreemptedAt from %v to %v", at, v.PreemptedAt)
	}
	for _, tc := range []struct {
		after time.Duration
		want  bool
	}{{0, true}, {PreemptionHold - time.Millisecond, true}, {PreemptionHold, false}} {
		now := at.Add(tc.after)
		view := &View{Scraper: s, StaleAfter: time.Hour, Now: func() time.Time { return now }}
		if got := view.Load("r").Preempting; got != tc.want {
			t.Errorf("%v after the rise: Preempting %v, want %v", tc.after, got, tc.want)
		}
	}
}

func TestScraperHealthDownAndBack(t *testing.T) {
	for _, tc := range []struct {
		name    string
		disable bool
		fail    func(e *engine)
		recover func(e *engine)
	}{
		{"connection refused", false, (*engine).down, func(e *engine) { e.up(e.addr) }},
		{"health 503", false, func(e *engine) { e.health.Store(http.StatusServiceUnavailable) }, func(e *engine) { e.health.Store(http.StatusOK) }},
		{"no health probe, connection refused", true, (*engine).down, func(e *engine) { e.up(e.addr) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEngine(t)
			e.running.Store(3)
			reg := prometheus.NewPedanticRegistry()
			s := runScraper(t, ScraperConfig{DisableHealthProbe: tc.disable, Registerer: reg})
			s.SetTargets([]Target{{ID: "a", URL: e.url()}})
			eventually(t, "healthy with metrics", func() bool {
				v, _ := s.Get("a")
				return v.Healthy && v.Running == 3 && v.Waiting == 1 && v.KVUsage == 0.5 && v.Engine == "vllm"
			})
			tc.fail(e)
			eventually(t, "unhealthy", func() bool { return !healthy(s, "a") })
			tc.recover(e)
			eventually(t, "readmitted", func() bool { return healthy(s, "a") })
			if got, ok := gathered(t, reg, "kvroute_replica_healthy", "a"); !ok || got != 1 {
				t.Errorf("kvroute_replica_healthy = %v (present %v), want 1", got, ok)
			}
			if got := counterValue(t, s.transitions.WithLabelValues("a", "false")); got != 1 {
				t.Errorf("unhealthy transitions = %v, want 1", got)
			}
		})
	}
}

func TestScraperExclusionIsPrompt(t *testing.T) {
	// With production intervals a dead replica must go within a second;
	// the bound checked here is loose (loaded CI machines), the design
	// target is Interval + 2*Timeout.
	e := newEngine(t)
	s := runScraper(t, ScraperConfig{Interval: 200 * time.Millisecond, Timeout: 300 * time.Millisecond})
	s.SetTargets([]Target{{ID: "a", URL: e.url()}})
	eventually(t, "healthy", func() bool { return healthy(s, "a") })
	e.down()
	start := time.Now()
	eventually(t, "unhealthy", func() bool { return !healthy(s, "a") })
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("exclusion took %v", d)
	}
}

func TestScraperTargetsChange(t *testing.T) {
	a, b := newEngine(t), newEngine(t)
	b.running.Store(9)
	s := runScraper(t, ScraperConfig{})
	if _, ok := s.Get("a"); ok {
		t.Fatal("unknown target reported")
	}
	// Hold a's first health answer, so that the state before any probe
	// has completed can be observed (a fast probe would otherwise race the
	// check).
	gate := make(chan struct{})
	var release sync.Once
	open := func() { release.Do(func() { close(gate) }) }
	t.Cleanup(open)
	a.gate.Store(&gate)
	s.SetTargets([]Target{{ID: "a", URL: a.url()}})
	if v, ok := s.Get("a"); ok && v.Healthy {
		t.Fatal("target healthy before any probe")
	}
	open()
	eventually(t, "a healthy", func() bool { return healthy(s, "a") })
	s.SetTargets([]Target{{ID: "b", URL: b.url()}})
	eventually(t, "a removed, b healthy", func() bool {
		_, okA := s.Get("a")
		v, _ := s.Get("b")
		return !okA && v.Healthy && v.Running == 9
	})
	// Same ID, new address: the worker restarts against the new URL.
	s.SetTargets([]Target{{ID: "b", URL: a.url()}})
	eventually(t, "b scraped at a's address", func() bool {
		v, _ := s.Get("b")
		return v.Healthy && v.Running == 0
	})
	s.SetTargets(nil)
	eventually(t, "all removed", func() bool { _, ok := s.Get("b"); return !ok })
}

func TestScraperMetricsErrorsDoNotFailHealth(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) { http.NotFound(w, nil) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	reg := prometheus.NewPedanticRegistry()
	s := runScraper(t, ScraperConfig{Registerer: reg})
	s.SetTargets([]Target{{ID: "x", URL: srv.URL}})
	eventually(t, "metrics errors counted", func() bool {
		return counterValue(t, s.errs.WithLabelValues("x", "metrics_status")) >= 2
	})
	v, ok := s.Get("x")
	if !ok || !v.Healthy || !v.MetricsAt.IsZero() {
		t.Fatalf("state %+v ok=%v: want healthy without metrics", v, ok)
	}
}

func TestScraperConfigErrors(t *testing.T) {
	for name, cfg := range map[string]ScraperConfig{
		"negative interval":  {Interval: -time.Second},
		"negative threshold": {FailureThreshold: -1},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := NewScraper(cfg); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	s, _ := NewScraper(ScraperConfig{})
	if _, err := s.metrics(context.Background(), Target{ID: "x", URL: "http://[::1]:0"}, nil); !errors.Is(err, errUnreachable) {
		t.Errorf("metrics against a closed port: %v, want errUnreachable", err)
	}
}

// A vLLM-like exposition: the wanted families among HELP lines, comments,
// histograms and families whose names extend a wanted one.
const vllmExposition = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
# HELP vllm:num_requests_running_total Not a load figure.
# TYPE vllm:num_requests_running_total counter
vllm:num_requests_running_total{engine="0",model_name="m"} 99.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="m"} 1.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 2.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="m"} 0.5
vllm:e2e_request_latency_seconds_count{engine="0",model_name="m"} 2.0
# a free comment
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="24576"} 1
process_cpu_seconds_total 12.5`

// keepFamilies keeps exactly the wanted families' samples and TYPE lines,
// and the figures read from the cut exposition are those of the whole.
func TestKeepFamilies(t *testing.T) {
	got := string(keepFamilies(nil, []byte(vllmExposition)))
	want := `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="24576"} 1
`
	if got != want {
		t.Fatalf("kept:\n%s\nwant:\n%s", got, want)
	}
	s, err := NewScraper(ScraperConfig{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.parse(strings.NewReader(vllmExposition))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(engineMetrics{engine: "vllm", running: 3, waiting: 4, kvUsage: 0.25, kvBlocks: 24576}, m, cmp.AllowUnexported(engineMetrics{})); d != "" {
		t.Errorf("figures (-want +got):\n%s", d)
	}
}

// idle is true only with an idle interval and a Tracker, no request
// started since the previous check, none in flight to the replica and a
// good last probe.
func TestScraperIdleDecision(t *testing.T) {
	tr, _ := NewTracker(nil)
	s, err := NewScraper(ScraperConfig{Interval: time.Second, IdleInterval: time.Minute, Tracker: tr})
	if err != nil {
		t.Fatal(err)
	}
	tg := Target{ID: "r1"}
	starts := int64(-1)
	if s.idle(tg, &starts, true) {
		t.Error("idle on the first check (nothing known of earlier starts)")
	}
	if !s.idle(tg, &starts, true) {
		t.Error("not idle with no start since the last check")
	}
	if s.idle(tg, &starts, false) {
		t.Error("idle after a failed probe")
	}
	h := tr.Start("r2", 1, 1)
	if s.idle(tg, &starts, true) {
		t.Error("idle right after a request started (on another replica)")
	}
	if !s.idle(tg, &starts, true) {
		t.Error("not idle: the request in flight is another replica's")
	}
	h.Done()
	h = tr.Start("r1", 1, 1)
	s.idle(tg, &starts, true)
	if s.idle(tg, &starts, true) {
		t.Error("idle with a request in flight to the replica")
	}
	h.Done()
	if !s.idle(tg, &starts, true) {
		t.Error("not idle once the request finished")
	}
	for _, cfg := range []ScraperConfig{{Interval: time.Second, IdleInterval: time.Minute}, {Interval: time.Second, IdleInterval: time.Second, Tracker: tr}} {
		o, _ := NewScraper(cfg)
		st := tr.Starts()
		if o.idle(tg, &st, true) {
			t.Errorf("idle without a tracker or a longer idle interval: %+v", cfg)
		}
	}
}

// An idle router stops scraping at the full rate; a request resumes it;
// a replica failing its probes keeps it.
func TestScraperIdleInterval(t *testing.T) {
	e := newEngine(t)
	tr, _ := NewTracker(nil)
	s := runScraper(t, ScraperConfig{IdleInterval: time.Hour, Tracker: tr})
	s.SetTargets([]Target{{ID: "r1", URL: e.url()}})
	eventually(t, "healthy", func() bool { return healthy(s, "r1") })
	// The first two ticks scrape (the tracker's count is not yet known at
	// the first); after that an hour-long idle interval allows none.
	eventually(t, "two scrapes", func() bool { return e.scrapes.Load() >= 2 })
	time.Sleep(300 * time.Millisecond) // 30 ticks of 10 ms
	if n := e.scrapes.Load(); n > 3 {
		t.Fatalf("%d scrapes of an idle router's replica, want at most 3", n)
	}
	h := tr.Start("r1", 1, 1)
	n := e.scrapes.Load()
	eventually(t, "scrapes resumed by a request in flight", func() bool { return e.scrapes.Load() >= n+3 })
	h.Done()

	bad := newEngine(t)
	bad.health.Store(http.StatusServiceUnavailable)
	s.SetTargets([]Target{{ID: "r1", URL: e.url()}, {ID: "bad", URL: bad.url()}})
	eventually(t, "a failing replica probed at the full rate", func() bool { return bad.scrapes.Load() >= 10 })
}
