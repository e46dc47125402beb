package extproc

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvroute/kvroute/pkg/respstore"
	"github.com/kvroute/kvroute/pkg/route"
)

// storeLog is a ResponseStore that answers Holder from a fixed map and
// logs every call.
type storeLog struct {
	mu        sync.Mutex
	holders   map[string]string
	elsewhere map[string]string // Elsewhere's answers
	asked     []string          // "model id", and "model id not" for Elsewhere
	stored    []string          // "id addr"
	lost      []string          // "id addr"
}

func (s *storeLog) Holder(_ context.Context, model, id string) (string, respstore.Source) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = append(s.asked, model+" "+id)
	if a, ok := s.holders[id]; ok {
		return a, respstore.SourceBook
	}
	return "", respstore.SourceUnknown
}

func (s *storeLog) Elsewhere(_ context.Context, model, id, not string) (string, respstore.Source) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = append(s.asked, model+" "+id+" "+not)
	if a, ok := s.elsewhere[id]; ok {
		return a, respstore.SourceLookup
	}
	return "", respstore.SourceUnknown
}

func (s *storeLog) Stored(id, addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stored = append(s.stored, id+" "+addr)
}

func (s *storeLog) Lost(id, addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lost = append(s.lost, id+" "+addr)
}

func (s *storeLog) calls() (asked, stored, lost []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.asked), slices.Clone(s.stored), slices.Clone(s.lost)
}

// A request naming a stored response (in the body or the path) is pinned
// to its holder; the responses the router sends to be stored have their
// holder recorded, from the body's request_id or the response's own id;
// a pinned request answered 404 unlearns its holder.
func TestStoredResponses(t *testing.T) {
	const addr = "10.0.0.1:8000" // decision()'s pick
	created := "event: response.created\ndata: {\"response\":{\"id\":\"resp_new\",\"object\":\"response\",\"status\":\"in_progress\"},\"sequence_number\":0,\"type\":\"response.created\"}\n\n"
	delta := "event: response.output_text.delta\ndata: {\"delta\":\"Hi\",\"type\":\"response.output_text.delta\"}\n\n"
	jsonResp := `{"id":"resp_json","object":"response","status":"completed","output":[]}`
	sse := []string{":status", "200", "content-type", "text/event-stream"}
	js := []string{":status", "200", "content-type", "application/json"}
	for _, c := range []struct {
		name                string
		path, body          string
		resp                []string // response headers
		chunks              []string
		asked, stored, lost []string
		pin                 string
		refused             string // the decision fails: a 503 with this message
		otherNoReplica      bool   // it fails with ErrNoReplica, not ErrPinUnhealthy
	}{
		{
			name: "a continuation, pinned; its own response learned from the stream",
			path: "/v1/responses", body: `{"model":"m","input":"next","previous_response_id":"resp_prev","stream":true}`,
			resp: sse, chunks: []string{created[:40], created[40:] + delta},
			// Its own response is stored where it ran: at the pin.
			asked: []string{"m resp_prev"}, stored: []string{"resp_new 10.0.0.9:8000"}, pin: "10.0.0.9:8000",
		},
		{
			name: "an unknown continuation goes unpinned",
			path: "/v1/responses", body: `{"model":"m","input":"next","previous_response_id":"resp_gone"}`,
			resp: js, chunks: []string{jsonResp[:12], jsonResp[12:]},
			asked: []string{"m resp_gone"}, stored: []string{"resp_json " + addr},
		},
		{
			name: "the body's request_id is recorded at the pick",
			path: "/v1/responses", body: `{"model":"m","input":"hi","request_id":"resp_mine"}`,
			resp: js, chunks: []string{`{"id":"resp_other"}`},
			stored: []string{"resp_mine " + addr},
		},
		{
			name: "store false: nothing recorded",
			path: "/v1/responses", body: `{"model":"m","input":"hi","store":false}`,
			resp: js, chunks: []string{jsonResp},
		},
		{
			name: "an error response stores nothing",
			path: "/v1/responses", body: `{"model":"m","input":"hi"}`,
			resp: []string{":status", "500", "content-type", "application/json"}, chunks: []string{jsonResp},
		},
		{
			name: "retrieval, pinned by its path; the holder's 404 unlearns it",
			path: "/v1/responses/resp_prev?stream=false",
			resp: []string{":status", "404", "content-type", "application/json"}, chunks: []string{`{"error":{"message":"Response with id 'resp_prev' not found."}}`},
			asked: []string{" resp_prev"}, lost: []string{"resp_prev 10.0.0.9:8000"}, pin: "10.0.0.9:8000",
		},
		{
			name: "cancellation, pinned by its path",
			path: "/v1/responses/resp_prev/cancel", body: `{}`,
			resp: js, chunks: []string{`{"id":"resp_prev","status":"cancelled"}`},
			asked: []string{" resp_prev"}, pin: "10.0.0.9:8000",
		},
		{
			name: "an unhealthy holder: 503 naming it",
			path: "/v1/responses", body: `{"model":"m","input":"next","previous_response_id":"resp_prev"}`,
			asked: []string{"m resp_prev", "m resp_prev 10.0.0.9:8000"}, pin: "10.0.0.9:8000", refused: "the replica storing the response this request names is not healthy",
		},
		{
			// Any other reason for no replica (here the proxy's subset
			// admits none) is no reason to look for the response elsewhere.
			name: "a pinned request with no eligible replica for another reason",
			path: "/v1/responses", body: `{"model":"m","input":"next","previous_response_id":"resp_prev"}`,
			asked: []string{"m resp_prev"}, pin: "10.0.0.9:8000", refused: "no healthy replica serves the model", otherNoReplica: true,
		},
		{
			name: "a chat completion is none of the store's business",
			path: "/v1/chat/completions", body: chatBody,
			resp: sse, chunks: []string{sseStream},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := &storeLog{holders: map[string]string{"resp_prev": "10.0.0.9:8000"}}
			dec := &fakeDecider{dec: decision()}
			switch {
			case c.otherNoReplica:
				dec.err = fmt.Errorf("%w: the subset admits none", route.ErrNoReplica)
			case c.refused != "":
				dec.err = fmt.Errorf("%w: the holder is down", route.ErrPinUnhealthy)
			}
			if c.pin != "" {
				// The router held the pick to the pin.
				dec.dec.Pin, dec.dec.Address, dec.dec.Fallbacks = c.pin, c.pin, nil
			}
			h := newHarness(t, Config{Decider: dec, Responses: store})
			msgs := []*extprocv3.ProcessingRequest{withMode(reqHeaders(c.body == "", ":path", c.path), buffered, streamed)}
			if c.body != "" {
				msgs = append(msgs, reqBody(c.body, true))
			}
			if c.resp != nil {
				msgs = append(msgs, respHeaders(false, c.resp...))
			}
			for i, ch := range c.chunks {
				msgs = append(msgs, respBody(ch, i == len(c.chunks)-1))
			}
			out := h.exchange(msgs...)
			if c.refused != "" {
				ir := out[len(out)-1].GetImmediateResponse()
				if ir.GetStatus().GetCode() != 503 || !strings.Contains(string(ir.GetBody()), c.refused) {
					t.Errorf("refused with %v %s, want 503 %q", ir.GetStatus().GetCode(), ir.GetBody(), c.refused)
				}
			}
			reqs := dec.requests()
			if len(reqs) != 1 || reqs[0].Pin != c.pin {
				t.Fatalf("decided %d requests, pin %q, want one pinned to %q", len(reqs), reqs[0].Pin, c.pin)
			}
			asked, stored, lost := store.calls()
			if !slices.Equal(asked, c.asked) || !slices.Equal(stored, c.stored) || !slices.Equal(lost, c.lost) {
				t.Errorf("asked %q stored %q lost %q, want %q %q %q", asked, stored, lost, c.asked, c.stored, c.lost)
			}
		})
	}
}

// An unhealthy holder is looked past: a replica that answers for the
// response (the proxy retried the storing request there) takes the pin.
func TestStoredResponseHolderElsewhere(t *testing.T) {
	store := &storeLog{holders: map[string]string{"resp_prev": "10.0.0.9:8000"}, elsewhere: map[string]string{"resp_prev": "10.0.0.1:8000"}}
	var pins []string
	dec := DeciderFunc(func(_ context.Context, req route.Request) (route.Decision, error) {
		pins = append(pins, req.Pin)
		if req.Pin == "10.0.0.9:8000" {
			return route.Decision{}, fmt.Errorf("%w: the holder is down", route.ErrPinUnhealthy)
		}
		d := decision()
		d.Pin = req.Pin
		return d, nil
	})
	h := newHarness(t, Config{Decider: dec, Responses: store})
	out := h.exchange(withMode(reqHeaders(true, ":path", "/v1/responses/resp_prev"), buffered, none))
	if len(out) == 0 || out[0].GetImmediateResponse() != nil {
		t.Fatalf("refused: %v", out)
	}
	if !slices.Equal(pins, []string{"10.0.0.9:8000", "10.0.0.1:8000"}) {
		t.Errorf("decided with pins %q, want the remembered holder then the one found elsewhere", pins)
	}
	if asked, _, _ := store.calls(); !slices.Equal(asked, []string{" resp_prev", " resp_prev 10.0.0.9:8000"}) {
		t.Errorf("asked %q", asked)
	}
}
