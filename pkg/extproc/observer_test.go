package extproc

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/route"
)

// The two-filter wiring: the router stream (request headers and a
// buffered body, response skipped) decides and sets DecisionHeader; the
// observer stream (observability mode: Envoy sends, never waits, ignores
// answers) carries the request headers with that id, then the response.

// none: the router filter skips the response body.
const none = filterv3.ProcessingMode_NONE

type observerHarness struct {
	*lifecycleHarness
	rates *rateLog
}

func newObserverHarness(t *testing.T, wait time.Duration) *observerHarness {
	t.Helper()
	tr, fid := newTrackerFidelity(t)
	rl := &rateLog{}
	h := newHarness(t, Config{
		Decider: &fakeDecider{dec: decision()}, Tracker: tr, Fidelity: fid, Rates: rl, ObserverWait: wait,
		BlockSize: func(index.ReplicaID) int { return 16 }, UsageSampleEvery: 1, // every response to its end
	})
	return &observerHarness{lifecycleHarness: &lifecycleHarness{harness: h, tracker: tr, fidelity: fid}, rates: rl}
}

// route drives a router stream as the shipped Envoy config does (buffered
// request body, no response processing) and returns it, still open, with
// the decision id it set.
func (h *observerHarness) route(ctx context.Context) (extprocv3.ExternalProcessor_ProcessClient, string) {
	h.t.Helper()
	s := h.open(ctx)
	send(h.t, s, withMode(reqHeaders(false, ":path", "/v1/chat/completions"), buffered, none))
	recv(h.t, s) // the headers answer (stripping only)
	send(h.t, s, reqBody(chatBody, true))
	r := recv(h.t, s)
	for _, hv := range r.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if hv.GetHeader().GetKey() == DecisionHeader {
			return s, string(hv.GetHeader().GetRawValue())
		}
	}
	h.t.Fatalf("the pick carries no %s: %v", DecisionHeader, r)
	return nil, ""
}

// obs marks a message as Envoy's observability-mode filter sends it.
func obs(r *extprocv3.ProcessingRequest) *extprocv3.ProcessingRequest {
	r.ObservabilityMode = true
	return r
}

// closedByServer waits for the server to end s without answering.
func closedByServer(t *testing.T, s extprocv3.ExternalProcessor_ProcessClient) {
	t.Helper()
	r, err := s.Recv()
	if err == nil {
		t.Fatalf("observer stream answered: %v", r)
	}
	if !errors.Is(err, io.EOF) {
		t.Fatalf("observer stream ended with %v, want a clean end", err)
	}
}

func (h *observerHarness) counter(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	v, _ := metricValue(t, h.reg, name, labels)
	return v
}

func TestObserverStreamDoesTheResponseAccounting(t *testing.T) {
	h := newObserverHarness(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	router, id := h.route(ctx)
	if got, want := h.tracker.Get("r1"), (load.InFlight{PrefillBlocks: 2, DecodeBlocks: 5, Requests: 1}); got != want {
		t.Fatalf("after the pick: %+v, want %+v", got, want)
	}
	o := h.open(ctx)
	send(t, o, obs(reqHeaders(false, ":path", "/v1/chat/completions", DecisionHeader, id)))
	send(t, o, obs(respHeaders(false, ":status", "200", "content-type", "text/event-stream")))
	second := strings.Index(sseStream, "Hi") + len("Hi\"}}]}\n\n")
	send(t, o, obs(respBody(sseStream[:second], false)))
	eventually(t, "first token moves the request to decode", func() bool {
		return h.tracker.Get("r1") == load.InFlight{DecodeBlocks: 5, Requests: 1}
	})
	send(t, o, obs(respBody(sseStream[second:], true)))
	closedByServer(t, o) // the response ended: the server closes the stream
	if f := h.tracker.Get("r1"); f != (load.InFlight{}) {
		t.Fatalf("after the response's end: %+v, want released", f)
	}
	// Predicted: 3 matched blocks x 16 = 48 tokens; served 16 -> credit 1/3.
	if c := h.fidelity.Credit("r1"); c < 0.33 || c > 0.34 {
		t.Errorf("credit = %v, want 16/48", c)
	}
	if to, got := h.rates.get(); len(got) != 1 || to[0] != "r1" {
		t.Errorf("rate samples %v for %v, want one for r1", got, to)
	}
	_ = router.CloseSend()
	eventually(t, "streams closed", func() bool { return h.counter(t, "kvroute_extproc_streams_active", nil) == 0 })
	if v := h.counter(t, "kvroute_extproc_observer_streams_total", map[string]string{"outcome": "claimed"}); v != 1 {
		t.Errorf("claimed observer streams = %v, want 1", v)
	}
	if v := h.counter(t, "kvroute_extproc_unobserved_total", nil); v != 0 {
		t.Errorf("unobserved = %v, want 0", v)
	}
	if v := h.counter(t, "kvroute_extproc_requests_in_flight", nil); v != 0 {
		t.Errorf("requests in flight = %v, want 0", v)
	}
}

// An observer stream naming no decision of this process (another router
// replica's, a forged or a repeated id) or none at all is ended at once,
// unanswered, and moves nothing; the real observer still claims the
// decision afterwards.
func TestObserverWithUnknownIDIsEndedAndMovesNothing(t *testing.T) {
	h := newObserverHarness(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	router, id := h.route(ctx)
	before := h.tracker.Get("r1")
	for _, hdrs := range [][]string{{DecisionHeader, id + "x"}, {DecisionHeader, "other.1.2"}, {":path", "/v1/chat/completions"}} {
		o := h.open(ctx)
		send(t, o, obs(reqHeaders(false, hdrs...)))
		closedByServer(t, o)
	}
	// Response headers first (an observer configured without the request
	// headers): nothing to claim either.
	o := h.open(ctx)
	send(t, o, obs(respHeaders(false, ":status", "200")))
	closedByServer(t, o)
	if got := h.tracker.Get("r1"); got != before {
		t.Fatalf("unknown observers moved the load: %+v, want %+v", got, before)
	}
	if v := h.counter(t, "kvroute_extproc_observer_streams_total", map[string]string{"outcome": "unknown"}); v != 2 {
		t.Errorf("unknown = %v, want 2", v)
	}
	if v := h.counter(t, "kvroute_extproc_observer_streams_total", map[string]string{"outcome": "no_id"}); v != 2 {
		t.Errorf("no_id = %v, want 2", v)
	}
	// The real observer, then a second one with the same id.
	real := h.open(ctx)
	send(t, real, obs(reqHeaders(false, DecisionHeader, id)), obs(respHeaders(false, ":status", "200", "content-type", "application/json")))
	eventually(t, "the real observer claimed", func() bool {
		return h.counter(t, "kvroute_extproc_observer_streams_total", map[string]string{"outcome": "claimed"}) == 1
	})
	dup := h.open(ctx)
	send(t, dup, obs(reqHeaders(false, DecisionHeader, id)))
	closedByServer(t, dup)
	send(t, real, obs(respBody(fabricatedUsage, true)))
	closedByServer(t, real)
	if f := h.tracker.Get("r1"); f != (load.InFlight{}) {
		t.Fatalf("after the response's end: %+v, want released", f)
	}
	_ = router.CloseSend()
}

// Without an observer (a proxy with the router filter only and no
// response processing, or an observer stream that went to another router
// replica) a buffered request's charge ends with its router stream, which
// Envoy keeps open until it is done with the request. An observer that
// comes late, within ObserverWait, still reports usage. Past ObserverWait
// nobody claims it: it is counted unobserved. A body-less request's router
// stream may be closed by the proxy as soon as it is routed: its charge
// waits for the observer, at most ObserverWait.
func TestUnobservedRequestEndsWithItsRouterStream(t *testing.T) {
	h := newObserverHarness(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	router, id := h.route(ctx)
	if f := h.tracker.Get("r1"); f.Requests != 1 {
		t.Fatalf("not in flight while the router stream is open: %+v", f)
	}
	_ = router.CloseSend()
	closedByServer(t, router)
	eventually(t, "charge released with the router stream", func() bool { return h.tracker.Get("r1") == (load.InFlight{}) })
	o := h.open(ctx)
	send(t, o, obs(reqHeaders(false, DecisionHeader, id)), obs(respHeaders(false, ":status", "200", "content-type", "application/json")),
		obs(respBody(`{"usage":{"prompt_tokens":80,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":16}}}`, true)))
	closedByServer(t, o)
	if c := h.fidelity.Credit("r1"); c < 0.33 || c > 0.34 {
		t.Errorf("credit = %v, want 16/48 from the late observer", c)
	}
	if f := h.tracker.Get("r1"); f != (load.InFlight{}) {
		t.Fatalf("late observer moved the load: %+v", f)
	}

	h2 := newObserverHarness(t, 200*time.Millisecond)
	router2, id2 := h2.route(ctx)
	_ = router2.CloseSend()
	eventually(t, "unobserved request ended", func() bool {
		return h2.counter(t, "kvroute_extproc_unobserved_total", nil) == 1
	})
	o2 := h2.open(ctx)
	send(t, o2, obs(reqHeaders(false, DecisionHeader, id2)))
	closedByServer(t, o2)
	if v := h2.counter(t, "kvroute_extproc_observer_streams_total", map[string]string{"outcome": "unknown"}); v != 1 {
		t.Errorf("late observer past the wait: unknown = %v, want 1", v)
	}

	// Body-less: still charged after its router stream ended, released at
	// the wait.
	h3 := newObserverHarness(t, 3*time.Second)
	s := h3.open(ctx)
	send(t, s, withMode(reqHeaders(true, ":path", "/v1/models"), buffered, none))
	recv(t, s)
	_ = s.CloseSend()
	closedByServer(t, s)
	if f := h3.tracker.Get("r1"); f.Requests != 1 {
		t.Fatalf("body-less request released with its router stream: %+v", f)
	}
	eventually(t, "body-less request released at the wait", func() bool { return h3.tracker.Get("r1") == (load.InFlight{}) })
}

// An observer stream that ends before the response did (the proxy's
// deferred close, a reset, kvroute's drain) releases the charge; the
// router stream ending later changes nothing.
func TestObserverStreamCutReleasesTheCharge(t *testing.T) {
	h := newObserverHarness(t, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	router, id := h.route(ctx)
	octx, ocancel := context.WithCancel(ctx)
	o := h.open(octx)
	send(t, o, obs(reqHeaders(false, DecisionHeader, id)), obs(respHeaders(false, ":status", "200", "content-type", "text/event-stream")))
	eventually(t, "observer claimed", func() bool {
		return h.counter(t, "kvroute_extproc_observer_streams_total", map[string]string{"outcome": "claimed"}) == 1
	})
	if f := h.tracker.Get("r1"); f.Requests != 1 {
		t.Fatalf("not in flight before the cut: %+v", f)
	}
	ocancel()
	eventually(t, "charge released at the cut", func() bool { return h.tracker.Get("r1") == (load.InFlight{}) })
	_ = router.CloseSend()
	eventually(t, "streams closed", func() bool { return h.counter(t, "kvroute_extproc_streams_active", nil) == 0 })
	if f := h.tracker.Get("r1"); f != (load.InFlight{}) {
		t.Fatalf("after the router stream: %+v", f)
	}
	if v := h.counter(t, "kvroute_extproc_unobserved_total", nil); v != 0 {
		t.Errorf("unobserved = %v, want 0 (it was observed, then cut)", v)
	}
}

// With UsageSampleEvery 2, the observer of every other streamed response
// stops at its first token: the server closes that stream (Envoy sends it
// none of the remaining chunks) and the request stays in flight, decoding,
// until its router stream ends; its first-token time still feeds the
// learned prefill speed (with the predicted uncached tokens, no output).
// The sampled one is followed to its end.
func TestUnsampledObserverStopsAtTheFirstToken(t *testing.T) {
	tr, fid := newTrackerFidelity(t)
	rl := &rateLog{}
	hh := newHarness(t, Config{
		Decider: &fakeDecider{dec: decision()}, Tracker: tr, Fidelity: fid, Rates: rl, UsageSampleEvery: 2,
		UsageSampleInterval: time.Hour, // by count only
		BlockSize:           func(index.ReplicaID) int { return 16 },
	})
	h := &observerHarness{lifecycleHarness: &lifecycleHarness{harness: hh, tracker: tr, fidelity: fid}, rates: rl}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	second := strings.Index(sseStream, "Hi") + len("Hi\"}}]}\n\n")

	// Decision 1: not sampled.
	router, id := h.route(ctx)
	o := h.open(ctx)
	send(t, o, obs(reqHeaders(false, DecisionHeader, id)), obs(respHeaders(false, ":status", "200", "content-type", "text/event-stream")),
		obs(respBody(sseStream[:second], false)))
	closedByServer(t, o)
	if got, want := h.tracker.Get("r1"), (load.InFlight{DecodeBlocks: 5, Requests: 1}); got != want {
		t.Fatalf("after the first token: %+v, want %+v (decoding until the request ends)", got, want)
	}
	if v := h.counter(t, "kvroute_extproc_observed_to_first_token_total", nil); v != 1 {
		t.Errorf("observed to the first token = %v, want 1", v)
	}
	_ = router.CloseSend() // Envoy is done with the request
	eventually(t, "released at the router stream's end", func() bool { return h.tracker.Get("r1") == (load.InFlight{}) })
	if c := h.fidelity.Credit("r1"); c != 1 {
		t.Errorf("credit moved to %v without a usage", c)
	}
	// 80 prompt tokens, 3 matched blocks of 16 predicted cached: 32 uncached.
	to, got := h.rates.get()
	if len(got) != 1 || to[0] != "r1" || got[0].Uncached != 32 || got[0].Output != 0 || got[0].TTFT <= 0 || got[0].E2E != got[0].TTFT {
		t.Fatalf("rate samples after the unsampled response: %v %+v, want one prefill sample (32 uncached, no output)", to, got)
	}

	// Decision 2: sampled, followed to the end.
	router, id = h.route(ctx)
	o = h.open(ctx)
	send(t, o, obs(reqHeaders(false, DecisionHeader, id)), obs(respHeaders(false, ":status", "200", "content-type", "text/event-stream")),
		obs(respBody(sseStream[:second], false)), obs(respBody(sseStream[second:], true)))
	closedByServer(t, o)
	if c := h.fidelity.Credit("r1"); c < 0.33 || c > 0.34 {
		t.Errorf("credit = %v, want 16/48 from the sampled response", c)
	}
	// The sampled one's: the engine's own count (16 cached of 80), its output.
	if _, got := h.rates.get(); len(got) != 2 || got[1].Uncached != 64 || got[1].Output != 1 {
		t.Errorf("rate samples %+v, want the first token's and the sampled response's (64 uncached, 1 output token)", got)
	}
	_ = router.CloseSend()
	eventually(t, "all released", func() bool {
		return h.tracker.Get("r1") == (load.InFlight{}) && h.counter(t, "kvroute_extproc_requests_in_flight", nil) == 0
	})
	if v := h.counter(t, "kvroute_extproc_unobserved_total", nil); v != 0 {
		t.Errorf("unobserved = %v, want 0", v)
	}
}

// sampleFull: one flight in every by count; besides, a replica's flight
// whenever none of that replica's started within the interval, the
// replica's first flight starting the interval; every flight with every 1.
func TestSampleFull(t *testing.T) {
	f := newFlights()
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	steps := []struct {
		replica index.ReplicaID
		ms      int
		n       uint64
		want    bool
	}{
		{"a", 0, 1, false},   // a's first: starts its interval
		{"a", 100, 2, false}, // within 250 ms
		{"b", 120, 3, false}, // b's first
		{"a", 200, 4, true},  // by count (every 4)
		{"a", 400, 5, false}, // 200 ms after the count sample
		{"a", 460, 6, true},  // 260 ms after it
		{"b", 380, 7, true},  // 260 ms after b's first
		{"b", 390, 8, true},  // by count
		{"a", 500, 9, false},
	}
	for i, s := range steps {
		if got := f.sampleFull(s.replica, at(s.ms), s.n, 4, 250*time.Millisecond); got != s.want {
			t.Errorf("step %d (%s at %d ms, n %d): full %v, want %v", i, s.replica, s.ms, s.n, got, s.want)
		}
	}
	for n := range uint64(5) {
		if !f.sampleFull("c", at(1), n, 1, time.Hour) {
			t.Fatalf("every 1: flight %d not full", n)
		}
	}
}

// An unsampled response whose decision estimated its prompt tokens (no
// tokenizer, approximate tokens) feeds no prefill sample: its uncached
// count would be a guess.
func TestUnsampledApproximateFeedsNoPrefill(t *testing.T) {
	tr, fid := newTrackerFidelity(t)
	rl := &rateLog{}
	dec := decision()
	dec.Degraded = route.DegradedApproximate
	hh := newHarness(t, Config{
		Decider: &fakeDecider{dec: dec}, Tracker: tr, Fidelity: fid, Rates: rl, UsageSampleEvery: 1000,
		UsageSampleInterval: time.Hour, BlockSize: func(index.ReplicaID) int { return 16 },
	})
	h := &observerHarness{lifecycleHarness: &lifecycleHarness{harness: hh, tracker: tr, fidelity: fid}, rates: rl}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	second := strings.Index(sseStream, "Hi") + len("Hi\"}}]}\n\n")
	router, id := h.route(ctx)
	o := h.open(ctx)
	send(t, o, obs(reqHeaders(false, DecisionHeader, id)), obs(respHeaders(false, ":status", "200", "content-type", "text/event-stream")),
		obs(respBody(sseStream[:second], false)))
	closedByServer(t, o)
	if v := h.counter(t, "kvroute_extproc_observed_to_first_token_total", nil); v != 1 {
		t.Fatalf("observed to the first token = %v, want 1", v)
	}
	if _, got := h.rates.get(); len(got) != 0 {
		t.Errorf("rate samples %+v from approximate tokens, want none", got)
	}
	_ = router.CloseSend()
	eventually(t, "released", func() bool { return h.tracker.Get("r1") == (load.InFlight{}) })
}
