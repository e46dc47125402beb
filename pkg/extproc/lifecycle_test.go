package extproc

import (
	"context"
	"strings"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
)

const sseStream = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
	"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n" +
	"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":80,\"completion_tokens\":1,\"total_tokens\":81,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\n" +
	"data: [DONE]\n\n"

type lifecycleHarness struct {
	*harness
	tracker  *load.Tracker
	fidelity *load.Fidelity
}

// newTrackerFidelity is the in-flight tracker and a fidelity that trusts
// one sample fully, as the response-side tests use them.
func newTrackerFidelity(t *testing.T) (*load.Tracker, *load.Fidelity) {
	t.Helper()
	tr, err := load.NewTracker(nil)
	if err != nil {
		t.Fatal(err)
	}
	fid, err := load.NewFidelity(load.FidelityConfig{Alpha: 1, MinSamples: 1, Floor: 0.1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tr, fid
}

func newLifecycleHarness(t *testing.T) *lifecycleHarness {
	t.Helper()
	tr, fid := newTrackerFidelity(t)
	h := newHarness(t, Config{
		Decider: &fakeDecider{dec: decision()}, Tracker: tr, Fidelity: fid,
		BlockSize: func(index.ReplicaID) int { return 16 },
	})
	return &lifecycleHarness{harness: h, tracker: tr, fidelity: fid}
}

// routed opens a stream and drives it through a routed request; the
// decision() pick is r1 with 3 of 5 blocks matched.
func (h *lifecycleHarness) routed(ctx context.Context) extprocv3.ExternalProcessor_ProcessClient {
	h.t.Helper()
	s := h.open(ctx)
	send(h.t, s, reqHeaders(false, ":path", "/v1/chat/completions"), reqBody(chatBody, true))
	recv(h.t, s) // headers with the pick
	recv(h.t, s) // body chunk
	return s
}

func TestLifecycleStreamedResponse(t *testing.T) {
	h := newLifecycleHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := h.routed(ctx)
	if got, want := h.tracker.Get("r1"), (load.InFlight{PrefillBlocks: 2, DecodeBlocks: 5, Requests: 1}); got != want {
		t.Fatalf("after pick: %+v, want %+v", got, want)
	}
	// Cut inside the first event, then right after the content event.
	second := strings.Index(sseStream, "Hi") + len("Hi\"}}]}\n\n")
	chunks := []string{sseStream[:30], sseStream[30:second], sseStream[second:]}
	send(t, s, respHeaders(false, ":status", "200", "content-type", "text/event-stream; charset=utf-8"))
	if r := recv(t, s); r.GetResponseHeaders() == nil {
		t.Fatalf("want a response headers answer, got %v", r)
	}
	steps := []struct {
		chunk string
		want  load.InFlight
	}{
		// The role-only chunk is not output yet: still prefilling.
		{chunks[0], load.InFlight{PrefillBlocks: 2, DecodeBlocks: 5, Requests: 1}},
		// The first content token moves the request to decode.
		{chunks[1], load.InFlight{DecodeBlocks: 5, Requests: 1}},
	}
	for i, st := range steps {
		send(t, s, respBody(st.chunk, false))
		got := recv(t, s)
		want := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: []byte(st.chunk)},
			}}},
		}}}
		if d := cmp.Diff(want, got, protocmp.Transform()); d != "" {
			t.Fatalf("chunk %d not echoed unchanged (-want +got):\n%s", i, d)
		}
		if f := h.tracker.Get("r1"); f != st.want {
			t.Fatalf("after chunk %d: %+v, want %+v", i, f, st.want)
		}
	}
	send(t, s, respBody(chunks[2], true))
	if sr := recv(t, s).GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse(); !sr.GetEndOfStream() || string(sr.GetBody()) != chunks[2] {
		t.Fatalf("last chunk not echoed with end_of_stream: %v", sr)
	}
	if f := h.tracker.Get("r1"); f != (load.InFlight{}) {
		t.Fatalf("after end of stream: %+v, want released", f)
	}
	// Predicted: 3 matched blocks x 16 = 48 tokens; served 16 -> credit 1/3.
	if c := h.fidelity.Credit("r1"); c < 0.33 || c > 0.34 {
		t.Errorf("credit = %v, want 16/48", c)
	}
	_ = s.CloseSend()
}

func TestLifecycleJSONResponseAndBufferedModes(t *testing.T) {
	h := newLifecycleHarness(t)
	body := `{"choices":[{"text":"x"}],"usage":{"prompt_tokens":48,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":32}}}`
	got := h.exchange(
		withMode(reqHeaders(false, ":path", "/v1/completions"), buffered, streamed),
		reqBody(`{"model":"m","prompt":"x"}`, true),
		respHeaders(false, ":status", "200", "content-type", "application/json"),
		respBody(body[:40], false),
		respBody(body[40:], true),
	)
	if len(got) != 5 {
		t.Fatalf("got %d responses, want 5", len(got))
	}
	for i, r := range got[3:] {
		if d := cmp.Diff(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}, r, protocmp.Transform()); d != "" {
			t.Errorf("STREAMED response chunk %d not continued (-want +got):\n%s", i, d)
		}
	}
	if f := h.tracker.Get("r1"); f != (load.InFlight{}) {
		t.Errorf("after end of stream: %+v, want released", f)
	}
	// Prompt of exactly 3 blocks fully matched: the engine recomputes the
	// last token, so the prediction is capped at 2 blocks = 32 = served.
	if c := h.fidelity.Credit("r1"); c != 1 {
		t.Errorf("credit = %v, want 1", c)
	}
}

func TestLifecycleReleasedOnCancel(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps func(t *testing.T, s extprocv3.ExternalProcessor_ProcessClient)
	}{
		{"cancel after the pick", func(*testing.T, extprocv3.ExternalProcessor_ProcessClient) {}},
		{"cancel mid-response", func(t *testing.T, s extprocv3.ExternalProcessor_ProcessClient) {
			send(t, s, respHeaders(false, ":status", "200", "content-type", "text/event-stream"))
			recv(t, s)
			send(t, s, respBody(sseStream[:strings.Index(sseStream, "usage")], false))
			recv(t, s)
		}},
		{"upstream error status", func(t *testing.T, s extprocv3.ExternalProcessor_ProcessClient) {
			send(t, s, respHeaders(false, ":status", "503"))
			recv(t, s)
			send(t, s, respBody(`{"error":"overloaded"}`, false))
			recv(t, s)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newLifecycleHarness(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s := h.routed(ctx)
			tc.steps(t, s)
			if f := h.tracker.Get("r1"); f.Requests != 1 {
				t.Fatalf("request not in flight before cancel: %+v", f)
			}
			cancel() // the proxy resets the stream: client gone
			eventually(t, "counters released", func() bool { return h.tracker.Get("r1") == (load.InFlight{}) })
			eventually(t, "stream closed", func() bool {
				v, _ := metricValue(t, h.reg, "kvroute_extproc_streams_active", nil)
				return v == 0
			})
			if c := h.fidelity.Credit("r1"); c != 1 {
				t.Errorf("an unfinished response moved the credit to %v", c)
			}
		})
	}
}

func TestDecisionMetrics(t *testing.T) {
	h := newLifecycleHarness(t)
	h.exchange(reqHeaders(true, ":path", "/v1/models"))
	h.exchange(reqHeaders(true, ":path", "/v1/models"))
	if v, ok := metricValue(t, h.reg, "kvroute_decisions_total", map[string]string{"replica": "r1", "policy": "blended", "reason": "cost", "degraded": ""}); !ok || v != 2 {
		t.Errorf("decisions = %v (present %v), want 2", v, ok)
	}
	if v, _ := metricValue(t, h.reg, "kvroute_decision_duration_seconds", nil); v != 2 {
		t.Errorf("decision duration samples = %v, want 2", v)
	}
	if v, _ := metricValue(t, h.reg, "kvroute_tokenize_duration_seconds", map[string]string{"source": "remote"}); v != 2 {
		t.Errorf("tokenize duration samples = %v, want 2", v)
	}
}

// Blocks the router vouched for at the pick (route.ViewGaps) are part of
// the prediction the closed loop checks, and the decision is counted.
func TestLifecycleVouchedBlocksArePredicted(t *testing.T) {
	tr, fid := newTrackerFidelity(t)
	dec := decision()
	dec.Candidates[0].Vouched = 1 // r1: 3 matched + 1 vouched of 5 blocks
	h := newHarness(t, Config{
		Decider: &fakeDecider{dec: dec}, Tracker: tr, Fidelity: fid,
		BlockSize: func(index.ReplicaID) int { return 16 },
	})
	body := `{"choices":[{"text":"x"}],"usage":{"prompt_tokens":80,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":32}}}`
	h.exchange(
		withMode(reqHeaders(false, ":path", "/v1/completions"), buffered, streamed),
		reqBody(`{"model":"m","prompt":"x"}`, true),
		respHeaders(false, ":status", "200", "content-type", "application/json"),
		respBody(body, true),
	)
	// Predicted: (3 + 1) blocks x 16 = 64 tokens; served 32 -> credit 1/2
	// (without the vouched block 32/48).
	if c := fid.Credit("r1"); c != 0.5 {
		t.Errorf("credit = %v, want 32/64", c)
	}
	if v, ok := metricValue(t, h.reg, "kvroute_decisions_vouched_total", map[string]string{"replica": "r1"}); !ok || v != 1 {
		t.Errorf("vouched decisions %v (%v), want 1", v, ok)
	}
}
