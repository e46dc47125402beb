package tokenize

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/route"
	"go.uber.org/goleak"
)

func TestDeadlineEstimate(t *testing.T) {
	d := newDeadlines(ModelConfig{}.withDefaults())
	if got := d.deadline(100); got != DefaultTimeoutMax {
		t.Fatalf("no calls timed yet: deadline %v, want the maximum %v", got, DefaultTimeoutMax)
	}
	for range deadlineMinSamples {
		d.observe(100, 10*time.Millisecond)
	}
	if got := d.deadline(100); got != DefaultTimeoutMin {
		t.Fatalf("10ms calls: deadline %v, want the floor %v", got, DefaultTimeoutMin)
	}
	for range deadlineWindow {
		d.observe(100, 100*time.Millisecond)
	}
	if got := d.deadline(100); got != DeadlineMultiplier*100*time.Millisecond {
		t.Fatalf("100ms calls: deadline %v, want %v", got, DeadlineMultiplier*100*time.Millisecond)
	}
	// One slow call among many does not move the 95th percentile.
	d.observe(100, 1500*time.Millisecond)
	if got := d.deadline(100); got != DeadlineMultiplier*100*time.Millisecond {
		t.Fatalf("after one outlier: deadline %v", got)
	}
	// Other sizes are timed apart: a 300 KB input has no history yet.
	if got := d.deadline(300 << 10); got != DefaultTimeoutMax {
		t.Fatalf("300 KB input: deadline %v, want the maximum", got)
	}
	// Sustained timeouts (each counted at its deadline) raise the
	// deadline up to the maximum.
	for range deadlineWindow {
		d.observe(100, d.deadline(100))
	}
	if got := d.deadline(100); got != DefaultTimeoutMax {
		t.Fatalf("after sustained timeouts: deadline %v, want the maximum", got)
	}
	// A fixed timeout ignores measurements.
	f := newDeadlines(ModelConfig{Timeout: 30 * time.Millisecond}.withDefaults())
	f.observe(100, time.Second)
	if got := f.deadline(100); got != 30*time.Millisecond {
		t.Fatalf("fixed: %v", got)
	}
	for _, c := range []struct{ n, class int }{{0, 0}, {16<<10 - 1, 0}, {16 << 10, 1}, {64<<10 - 1, 1}, {64 << 10, 2}, {300 << 10, 3}, {3 << 20, 4}, {40 << 20, 5}} {
		if got := sizeClass(c.n); got != c.class {
			t.Errorf("sizeClass(%d) = %d, want %d", c.n, got, c.class)
		}
	}
}

// TestRemoteDeadlineAdapts: an engine answering /tokenize in 150 ms (three
// times the old fixed 50 ms deadline) is never given up on: the first
// calls get the maximum, then the deadline follows the measured latency.
func TestRemoteDeadlineAdapts(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	slow := &fakeVLLM{}
	slow.delay.Store(int64(150 * time.Millisecond))
	srv := httptest.NewServer(slow)
	defer srv.Close()
	tok, reg, _ := newRemoteTokenizer(t, ModelConfig{CacheSize: -1}, func() []string { return []string{srv.URL} })
	for i := range deadlineMinSamples + 2 {
		got, err := tok.Tokenize(context.Background(), "m", route.TokenizeInput{Prompt: strings.Repeat("x", i+1)})
		if err != nil || !got.Exact || got.Source != SourceRemote {
			t.Fatalf("call %d: %+v, %v", i, got, err)
		}
	}
	if n := counterValue(t, reg, "kvroute_tokenizer_fallbacks_total", "m", "remote", "timeout"); n != 0 {
		t.Fatalf("%v timeouts", n)
	}
	d, n := tok.models["m"].remote.deadlines.learned()
	if n != deadlineMinSamples+2 || d < min(DeadlineMultiplier*150*time.Millisecond, DefaultTimeoutMax) || d > DefaultTimeoutMax {
		t.Fatalf("learned deadline %v from %d calls, want about %d × 150ms", d, n, DeadlineMultiplier)
	}
	if ex := tok.Explain("m"); !strings.Contains(ex, "adaptive deadline") || !strings.Contains(ex, "fallbacks: none") {
		t.Fatalf("explain: %s", ex)
	}
}

// gateVLLM is fakeVLLM held at a gate: each /tokenize call waits until the
// test opens it.
type gateVLLM struct {
	fakeVLLM
	gate chan struct{}
}

func (g *gateVLLM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.calls.Add(1)
	select {
	case <-g.gate:
	case <-r.Context().Done():
		return
	}
	g.calls.Add(-1) // counted again by the inner handler
	g.fakeVLLM.ServeHTTP(w, r)
}

// TestRemoteCoalescesIdenticalInFlight: N identical prompts in flight at
// once make one /tokenize call and all get its ids; a different prompt
// makes its own; a leader whose request is cancelled still answers its
// waiters.
func TestRemoteCoalescesIdenticalInFlight(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	g := &gateVLLM{gate: make(chan struct{})}
	srv := httptest.NewServer(g)
	defer srv.Close()
	tok, reg, _ := newRemoteTokenizer(t, ModelConfig{CacheSize: -1, Timeout: time.Minute}, func() []string { return []string{srv.URL} })

	const n = 8
	leaderCtx, cancelLeader := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	results := make([]route.Tokens, n+1)
	errs := make([]error, n+1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		results[0], errs[0] = tok.Tokenize(leaderCtx, "m", route.TokenizeInput{Prompt: "same prompt"})
	}()
	waitFor(t, "the leader's call", func() bool { return g.calls.Load() == 1 })
	for i := 1; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = tok.Tokenize(context.Background(), "m", route.TokenizeInput{Prompt: "same prompt"})
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		results[n], errs[n] = tok.Tokenize(context.Background(), "m", route.TokenizeInput{Prompt: "other prompt"})
	}()
	waitFor(t, "the waiters", func() bool {
		return counterValue(t, reg, "kvroute_tokenizer_coalesced_total", "m") == n-1 && g.calls.Load() == 2
	})
	cancelLeader()
	close(g.gate)
	wg.Wait()
	if calls := g.fakeVLLM.calls.Load(); calls != 2 {
		t.Fatalf("/tokenize answered %d calls, want 2 (one per distinct prompt)", calls)
	}
	want := []uint32{}
	for _, b := range []byte("same prompt") {
		want = append(want, uint32(b))
	}
	for i := 1; i < n; i++ {
		if errs[i] != nil || !results[i].Exact || !slices.Equal(results[i].IDs, want) {
			t.Fatalf("waiter %d: %+v, %v", i, results[i], errs[i])
		}
	}
	if errs[n] != nil || len(results[n].IDs) != len("other prompt") {
		t.Fatalf("other prompt: %+v, %v", results[n], errs[n])
	}
	if n := counterValue(t, reg, "kvroute_tokenizer_fallbacks_total", "m", "remote", "canceled"); n != 0 {
		t.Fatalf("%v fallbacks", n)
	}
}

// TestRemoteLoneLeaderCancelled: a call nobody else waits for ends with
// its request (not at its one-minute deadline), and the next identical
// input makes a fresh call.
func TestRemoteLoneLeaderCancelled(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	g := &gateVLLM{gate: make(chan struct{})}
	srv := httptest.NewServer(g)
	defer srv.Close()
	tok, reg, _ := newRemoteTokenizer(t, ModelConfig{CacheSize: -1, Timeout: time.Minute}, func() []string { return []string{srv.URL} })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := tok.Tokenize(ctx, "m", route.TokenizeInput{Prompt: "p"})
		done <- err
	}()
	waitFor(t, "the call", func() bool { return g.calls.Load() == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	close(g.gate)
	got, err := tok.Tokenize(context.Background(), "m", route.TokenizeInput{Prompt: "p"})
	if err != nil || !got.Exact || !slices.Equal(got.IDs, []uint32{'p'}) {
		t.Fatalf("next call: %+v, %v", got, err)
	}
	if n := counterValue(t, reg, "kvroute_tokenizer_coalesced_total", "m"); n != 0 {
		t.Fatalf("coalesced %v, want 0", n)
	}
}
