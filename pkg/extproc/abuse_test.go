package extproc

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
)

// Abuse attempts from a client of the ext_proc port that is not a proxy:
// none of them may move load or cache credit, the inputs of every later
// routing decision.

const fabricatedUsage = `{"choices":[{"text":"x"}],"usage":{"prompt_tokens":80,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":0}}}`

func newAbuseHarness(t *testing.T, lifetime time.Duration) (*lifecycleHarness, *fakeDecider) {
	t.Helper()
	tr, fid := newTrackerFidelity(t)
	d := &fakeDecider{dec: decision()}
	h := newHarness(t, Config{
		Decider: d, Tracker: tr, Fidelity: fid, MaxRequestLifetime: lifetime,
		BlockSize: func(index.ReplicaID) int { return 16 },
	})
	return &lifecycleHarness{harness: h, tracker: tr, fidelity: fid}, d
}

// TestIdleStreamsAddNoLoad: 300 streams held open, half silent and half
// stopped after the request headers (no body: no decision), add no load
// and make no decision; the next real request is routed as without them.
func TestIdleStreamsAddNoLoad(t *testing.T) {
	h, d := newAbuseHarness(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 300 {
		s := h.open(ctx)
		if i%2 == 1 {
			send(t, s, reqHeaders(false, ":path", "/v1/chat/completions"))
		}
	}
	eventually(t, "300 streams open", func() bool {
		v, _ := metricValue(t, h.reg, "kvroute_extproc_streams_active", nil)
		return v == 300
	})
	if snap := h.tracker.Snapshot(); len(snap) != 0 {
		for r, f := range snap {
			if f != (load.InFlight{}) {
				t.Fatalf("idle streams count as load on %s: %+v", r, f)
			}
		}
	}
	if n := len(d.requests()); n != 0 {
		t.Fatalf("idle streams made %d decisions", n)
	}
	s := h.routed(ctx)
	defer func() { _ = s.CloseSend() }()
	if f := h.tracker.Get("r1"); f.Requests != 1 {
		t.Fatalf("the real request: in flight %+v, want exactly itself", f)
	}
	if n := len(d.requests()); n != 1 {
		t.Fatalf("decisions %d, want 1", n)
	}
}

// TestFabricatedFeedbackIgnored: responses reporting cached_tokens 0 on
// streams kvroute routed nothing for leave the cache credit alone; on a
// routed stream a second usage report is not counted again.
func TestFabricatedFeedbackIgnored(t *testing.T) {
	h, _ := newAbuseHarness(t, 0)
	for range 40 {
		h.exchange(
			respHeaders(false, ":status", "200", "content-type", "application/json"),
			respBody(fabricatedUsage, true),
		)
	}
	if c := h.fidelity.Credit("r1"); c != 1 {
		t.Fatalf("40 fabricated responses without a routed request moved the credit to %v", c)
	}
	if tot := h.fidelity.Totals("r1"); tot != (load.CacheTotals{}) {
		t.Fatalf("fabricated responses counted: %+v", tot)
	}

	// One routed request: its usage counts once, however often it is sent.
	got := h.exchange(
		withMode(reqHeaders(false, ":path", "/v1/completions"), buffered, streamed),
		reqBody(`{"model":"m","prompt":"x"}`, true),
		respHeaders(false, ":status", "200", "content-type", "application/json"),
		respBody(`{"usage":{"prompt_tokens":80,"prompt_tokens_details":{"cached_tokens":48}}}`, true),
		respBody(fabricatedUsage, true),
		respBody(fabricatedUsage, true),
	)
	if len(got) < 3 {
		t.Fatalf("routed exchange: %d responses", len(got))
	}
	if c := h.fidelity.Credit("r1"); c != 1 {
		t.Errorf("extra usage reports after the end of the response moved the credit to %v", c)
	}
}

// TestRoutedStreamReleasedAtDeadline: a routed request whose response
// never comes stops counting as load at MaxRequestLifetime, and a usage
// report after it is not fed to the cache credit.
func TestRoutedStreamReleasedAtDeadline(t *testing.T) {
	h, _ := newAbuseHarness(t, 200*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := h.routed(ctx)
	if f := h.tracker.Get("r1"); f.Requests != 1 {
		t.Fatalf("routed request not in flight: %+v", f)
	}
	eventually(t, "load released at the deadline", func() bool { return h.tracker.Get("r1") == (load.InFlight{}) })
	v, _ := metricValue(t, h.reg, "kvroute_extproc_streams_active", nil)
	if v != 1 {
		t.Fatalf("the stream itself should still be open: active %v", v)
	}
	send(t, s, respHeaders(false, ":status", "200", "content-type", "application/json"))
	recv(t, s)
	send(t, s, respBody(fabricatedUsage, true))
	recv(t, s)
	_ = s.CloseSend()
	eventually(t, "stream closed", func() bool {
		v, _ := metricValue(t, h.reg, "kvroute_extproc_streams_active", nil)
		return v == 0
	})
	if c := h.fidelity.Credit("r1"); c != 1 {
		t.Errorf("usage after the deadline moved the credit to %v", c)
	}
}

// TestStreamsPerConnectionBounded: beyond MaxStreamsPerConnection a
// connection's further streams wait for a free slot; the server never
// holds more.
func TestStreamsPerConnectionBounded(t *testing.T) {
	d := &fakeDecider{dec: decision()}
	h := newHarness(t, Config{Decider: d, MaxStreamsPerConnection: 10})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	active := func() float64 {
		v, _ := metricValue(t, h.reg, "kvroute_extproc_streams_active", nil)
		return v
	}
	// Ten streams stop after their headers (no decision) and hold the
	// connection's slots; an eleventh carries a whole request, decided as
	// soon as the server takes it.
	var first context.CancelFunc
	for i := range 10 {
		sctx, scancel := context.WithCancel(ctx)
		defer scancel()
		if i == 0 {
			first = scancel
		}
		send(t, h.open(sctx), reqHeaders(false, ":path", "/v1/chat/completions"))
	}
	eventually(t, "10 streams served", func() bool { return active() == 10 })
	done := make(chan error, 1)
	go func() {
		s, err := h.client.Process(ctx) // waits for a slot
		if err == nil {
			err = s.Send(reqHeaders(false, ":path", "/v1/chat/completions"))
		}
		if err == nil {
			err = s.Send(reqBody(chatBody, true))
		}
		if err == nil {
			_, err = s.Recv()
		}
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	if a, n := active(), len(d.requests()); a != 10 || n != 0 {
		t.Fatalf("server holds %v streams on one connection (limit 10) and decided %d waiting ones", a, n)
	}
	first() // one slot frees: the waiting stream takes it
	if err := <-done; err != nil {
		t.Fatalf("the waiting stream: %v", err)
	}
	if a, n := active(), len(d.requests()); a > 10 || n != 1 {
		t.Fatalf("after one slot freed: %v streams, %d decisions; want at most 10 and 1", a, n)
	}
}
