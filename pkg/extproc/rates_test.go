package extproc

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/route"
)

// rateLog records what ext_proc hands the rate learner.
type rateLog struct {
	mu      sync.Mutex
	samples []route.RateSample
	to      []index.ReplicaID
}

func (l *rateLog) Observe(r index.ReplicaID, s route.RateSample) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.samples = append(l.samples, s)
	l.to = append(l.to, r)
}

func (l *rateLog) get() ([]index.ReplicaID, []route.RateSample) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]index.ReplicaID(nil), l.to...), append([]route.RateSample(nil), l.samples...)
}

func newRatesHarness(t *testing.T) (*harness, *rateLog) {
	t.Helper()
	tr, err := load.NewTracker(nil)
	if err != nil {
		t.Fatal(err)
	}
	rl := &rateLog{}
	dec := decision()
	dec.MaxTokens = 4096 // the request's max_tokens, as Decide keeps it
	h := newHarness(t, Config{
		Decider: &fakeDecider{dec: dec}, Tracker: tr, Rates: rl,
		BlockSize: func(index.ReplicaID) int { return 16 },
	})
	return h, rl
}

// A streamed response feeds the learner one sample for the picked
// replica: uncached = prompt − cached from the usage, output tokens from
// it and the max_tokens they are learned against, a first-token time no
// later than the end.
func TestRatesFedFromStreamedResponse(t *testing.T) {
	h, rl := newRatesHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := h.open(ctx)
	send(t, s, reqHeaders(false, ":path", "/v1/chat/completions"), reqBody(chatBody, true))
	recv(t, s)
	recv(t, s)
	send(t, s, respHeaders(false, ":status", "200", "content-type", "text/event-stream"))
	recv(t, s)
	time.Sleep(30 * time.Millisecond) // prefill time before the first token
	send(t, s, respBody("data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n", false))
	recv(t, s)
	time.Sleep(20 * time.Millisecond) // decode time between the first token and the end
	send(t, s, respBody("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":2000,\"completion_tokens\":5,"+
		"\"prompt_tokens_details\":{\"cached_tokens\":480}}}\n\ndata: [DONE]\n\n", true))
	recv(t, s)
	_ = s.CloseSend()

	to, got := rl.get()
	if len(got) != 1 {
		t.Fatalf("%d samples, want 1", len(got))
	}
	if to[0] != "r1" {
		t.Errorf("sample for %q, want the pick r1", to[0])
	}
	g := got[0]
	if g.Uncached != 1520 || g.Output != 5 || g.Queued != 0 || g.MaxTokens != 4096 {
		t.Errorf("sample %+v, want uncached 1520, output 5 of max_tokens 4096", g)
	}
	if g.TTFT < 30*time.Millisecond || g.E2E-g.TTFT < 20*time.Millisecond {
		t.Errorf("TTFT %v, E2E %v: want a first-token time of at least 30ms and the end at least 20ms after it", g.TTFT, g.E2E)
	}

	// The real learner takes it: a decode step near (E2E−TTFT)/4 and, with
	// 1520 uncached tokens, a prefill speed.
	r := route.NewRates()
	r.Observe(to[0], g)
	rate, ok := r.Get("r1")
	if !ok || rate.DecodeStep <= 0 || rate.PrefillTokensPerSec <= 0 {
		t.Errorf("learned %+v (ok %v), want both speeds", rate, ok)
	}
}

// A JSON (non-streamed) answer of one generated token times its prefill
// (it arrives after the prefill and that token's step): it feeds a
// prefill sample, with no decode step (E2E = TTFT).
func TestRatesFedFromOneTokenJSONAnswer(t *testing.T) {
	h, rl := newRatesHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := h.open(ctx)
	send(t, s, reqHeaders(false, ":path", "/v1/completions"), reqBody(`{"model":"m","prompt":"x","max_tokens":1}`, true))
	recv(t, s)
	recv(t, s)
	time.Sleep(30 * time.Millisecond) // prefill and the one step
	send(t, s, respHeaders(false, ":status", "200", "content-type", "application/json"))
	recv(t, s)
	send(t, s, respBody(`{"choices":[{"text":"x"}],"usage":{"prompt_tokens":4000,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":1024}}}`, true))
	recv(t, s)
	_ = s.CloseSend()
	to, got := rl.get()
	if len(got) != 1 || to[0] != "r1" {
		t.Fatalf("samples %v %+v, want one for r1", to, got)
	}
	if g := got[0]; g.Uncached != 2976 || g.Output != 1 || g.TTFT < 30*time.Millisecond || g.E2E != g.TTFT {
		t.Errorf("sample %+v, want 2976 uncached, 1 output, TTFT ≥ 30ms = E2E", g)
	}
}

// A longer JSON (non-streamed) answer has no first-token time: nothing is
// fed. Neither is an error status or a response without usage.
func TestRatesNotFedWithoutFirstTokenTime(t *testing.T) {
	h, rl := newRatesHarness(t)
	body := `{"choices":[{"text":"x"}],"usage":{"prompt_tokens":4000,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":32}}}`
	h.exchange(
		reqHeaders(false, ":path", "/v1/completions"),
		reqBody(`{"model":"m","prompt":"x"}`, true),
		respHeaders(false, ":status", "200", "content-type", "application/json"),
		respBody(body, true),
	)
	h.exchange(
		reqHeaders(false, ":path", "/v1/completions"),
		reqBody(`{"model":"m","prompt":"x"}`, true),
		respHeaders(false, ":status", "500", "content-type", "text/event-stream"),
		respBody("data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n", true),
	)
	h.exchange(
		reqHeaders(false, ":path", "/v1/completions"),
		reqBody(`{"model":"m","prompt":"x"}`, true),
		respHeaders(false, ":status", "200", "content-type", "text/event-stream"),
		respBody("data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n", true),
	)
	if _, got := rl.get(); len(got) != 0 {
		t.Errorf("fed %d samples (%+v), want none", len(got), got)
	}
}
