package extproc

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestNotReadyRefusesStreams: before readiness (no engine probe round
// yet) a stream is refused with UNAVAILABLE and no decision is made, so
// Envoy fails open instead of getting a 503 from an unprobed replica set;
// once ready, the same request is routed. Health.Ready is the gate
// cmd/kvroute wires.
func TestNotReadyRefusesStreams(t *testing.T) {
	var ready atomic.Bool
	d := &fakeDecider{dec: decision()}
	h := newHarness(t, Config{Decider: d, Ready: ready.Load})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := h.open(ctx)
	// The server may refuse the stream before the body goes out: a Send
	// then sees io.EOF, and the stream's status comes from Recv.
	for _, m := range []*extprocv3.ProcessingRequest{reqHeaders(false, ":path", "/v1/completions"), reqBody(`{"model":"m","prompt":"x"}`, true)} {
		if err := s.Send(m); err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatalf("Send: %v", err)
			}
			break
		}
	}
	_, err := s.Recv()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("stream before ready: %v, want UNAVAILABLE", err)
	}
	if n := len(d.requests()); n != 0 {
		t.Fatalf("decided %d requests before ready", n)
	}
	ready.Store(true)
	got := h.exchange(reqHeaders(false, ":path", "/v1/completions"), reqBody(`{"model":"m","prompt":"x"}`, true))
	if len(got) == 0 || got[0].GetRequestHeaders() == nil || len(d.requests()) != 1 {
		t.Fatalf("after ready: %v, %d decisions", got, len(d.requests()))
	}

	hl := NewHealth()
	if hl.Ready() {
		t.Fatal("a new Health is ready")
	}
	hl.SetReady(true)
	if !hl.Ready() {
		t.Fatal("SetReady(true) not seen")
	}
	hl.Shutdown()
	if hl.Ready() {
		t.Fatal("ready after Shutdown")
	}
}
