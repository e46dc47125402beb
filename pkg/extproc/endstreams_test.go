package extproc

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/pkg/load"
)

// TestEndStreams: a stream still open when EndStreams is called (a
// response streaming past the drain deadline) gets the answer to its next
// message, the echoed chunk, and then ends with UNAVAILABLE, which a
// fail-open proxy acts on; its load is released and the end is counted. A
// stream opened afterwards ends after its first answer.
func TestEndStreams(t *testing.T) {
	h := newLifecycleHarness(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s := h.routed(ctx)
	send(t, s, respHeaders(false, ":status", "200", "content-type", "text/event-stream"))
	recv(t, s)
	first := sseStream[:40]
	send(t, s, respBody(first, false))
	if got := string(recv(t, s).GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()); got != first {
		t.Fatalf("before EndStreams the chunk is echoed: %q", got)
	}

	h.server.EndStreams()
	second := sseStream[40:80]
	send(t, s, respBody(second, false))
	if got := string(recv(t, s).GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()); got != second {
		t.Fatalf("the chunk sent after EndStreams is answered (echoed) before the stream ends, got %q", got)
	}
	_, err := s.Recv()
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "drain deadline") {
		t.Fatalf("stream end after EndStreams: %v, want UNAVAILABLE naming the drain deadline", err)
	}
	eventually(t, "the ended stream's load released", func() bool { return h.tracker.Get("r1") == (load.InFlight{}) })
	if v, _ := metricValue(t, h.reg, "kvroute_extproc_stream_errors_total", map[string]string{"kind": "ended"}); v != 1 {
		t.Errorf("stream_errors_total{kind=ended} = %v, want 1", v)
	}

	// A stream opened after EndStreams ends at its first message the same
	// way (after whatever answer that message has).
	s2 := h.open(ctx)
	send(t, s2, reqHeaders(false, ":path", "/v1/chat/completions"))
	for {
		_, err := s2.Recv()
		if err == nil {
			continue
		}
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("new stream after EndStreams ended with %v, want UNAVAILABLE", err)
		}
		break
	}
}
