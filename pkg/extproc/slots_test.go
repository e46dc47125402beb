package extproc

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	"github.com/kvroute/kvroute/pkg/route"
	"github.com/prometheus/client_golang/prometheus"
)

// gatedDecider holds every decision until its gate opens, counting the
// decisions under way.
type gatedDecider struct {
	gate            chan struct{}
	ignoreCtx       bool // hold until the gate opens, deadline or not
	mu              sync.Mutex
	inside, maxSeen int
	calls           int
}

func (g *gatedDecider) Decide(ctx context.Context, req route.Request) (route.Decision, error) {
	g.mu.Lock()
	g.calls++
	g.inside++
	g.maxSeen = max(g.maxSeen, g.inside)
	g.mu.Unlock()
	defer func() { g.mu.Lock(); g.inside--; g.mu.Unlock() }()
	if g.ignoreCtx {
		<-g.gate
		return decision(), nil
	}
	select {
	case <-g.gate:
		return decision(), nil
	case <-ctx.Done():
		return route.Decision{}, ctx.Err()
	}
}

func (g *gatedDecider) state() (calls, inside, maxSeen int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.calls, g.inside, g.maxSeen
}

func chatBodyOf(n int) string {
	return `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", n) + `"}]}`
}

// Decisions on large bodies take one of DecideConcurrency slots: beyond
// it a stream waits (its decision is not started) until a slot frees;
// small bodies are decided at once; a wait past the deadline is a 503.
func TestDecideConcurrencyBoundsLargeBodies(t *testing.T) {
	g := &gatedDecider{gate: make(chan struct{})}
	h := newHarness(t, Config{Decider: g, DecideConcurrency: 1, DecideTimeout: 20 * time.Second})
	large := chatBodyOf(LargeBody)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := func(body string) func() {
		s := h.open(ctx)
		send(t, s, withMode(reqHeaders(false, ":path", "/v1/chat/completions", "content-type", "application/json"),
			filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED))
		recv(t, s) // headers answered at once in BUFFERED mode
		send(t, s, reqBody(body, true))
		return func() {
			if r := recv(t, s); r.GetRequestBody() == nil {
				t.Errorf("body answered with %v, want the pick", r)
			}
		}
	}
	first := start(large)
	eventually(t, "the first large decision under way", func() bool { c, _, _ := g.state(); return c == 1 })
	second := start(large)
	small := start(chatBodyOf(100))
	eventually(t, "the small body decided beside it", func() bool { c, _, _ := g.state(); return c == 2 })
	time.Sleep(50 * time.Millisecond) // room for a wrongly admitted second large decision
	if calls, inside, _ := g.state(); calls != 2 || inside != 2 {
		t.Fatalf("%d decisions started, %d under way: the second large body did not wait", calls, inside)
	}
	close(g.gate)
	first()
	small()
	second()
	if calls, _, _ := g.state(); calls != 3 {
		t.Fatalf("%d decisions, want 3", calls)
	}

	// A slot never freed: after a quarter of the decision timeout the
	// waiting stream is decided without one (and counted), not refused.
	g2 := &gatedDecider{gate: make(chan struct{}), ignoreCtx: true}
	reg := prometheus.NewRegistry()
	h2 := newHarness(t, Config{Decider: g2, DecideConcurrency: 1, DecideTimeout: 400 * time.Millisecond, Registerer: reg})
	open := func() func() {
		s := h2.open(ctx)
		send(t, s, withMode(reqHeaders(false, ":path", "/v1/chat/completions"), filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED))
		recv(t, s)
		send(t, s, reqBody(large, true))
		return func() {
			if r := recv(t, s); r.GetRequestBody() == nil {
				t.Errorf("body answered with %v, want the pick", r)
			}
		}
	}
	blocker := open()
	eventually(t, "the blocking decision under way", func() bool { c, _, _ := g2.state(); return c == 1 })
	late := open()
	eventually(t, "the second decision going ahead without a slot", func() bool { c, _, _ := g2.state(); return c == 2 })
	if v, ok := metricValue(t, reg, "kvroute_extproc_decide_slot_timeouts_total", nil); !ok || v != 1 {
		t.Errorf("slot timeouts %v %v, want 1", v, ok)
	}
	close(g2.gate)
	blocker()
	late()
}

func TestDecideConcurrencyDefault(t *testing.T) {
	c := Config{Decider: &fakeDecider{}}.WithDefaults()
	if c.DecideConcurrency != 0 {
		t.Fatalf("default decide_concurrency %d, want 0 (no bound)", c.DecideConcurrency)
	}
	if err := (Config{Decider: &fakeDecider{}, DecideConcurrency: -1}).WithDefaults().Validate(); err == nil ||
		!strings.Contains(err.Error(), "decide_concurrency: must not be negative") {
		t.Fatalf("negative decide_concurrency: %v", err)
	}
	// Without a bound, large-body decisions run side by side.
	g := &gatedDecider{gate: make(chan struct{})}
	h := newHarness(t, Config{Decider: g})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var waits []func()
	for range 3 {
		s := h.open(ctx)
		send(t, s, withMode(reqHeaders(false, ":path", "/v1/chat/completions"), filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_STREAMED))
		recv(t, s)
		send(t, s, reqBody(chatBodyOf(LargeBody), true))
		waits = append(waits, func() { recv(t, s) })
	}
	eventually(t, "three large decisions under way at once", func() bool { _, inside, _ := g.state(); return inside == 3 })
	close(g.gate)
	for _, w := range waits {
		w()
	}
}
