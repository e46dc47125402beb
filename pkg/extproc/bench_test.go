package extproc

import (
	"context"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/load"
)

// BenchmarkStreamFullDuplex measures one full ext_proc exchange over
// bufconn: request headers + a 20 KB chat body, the pick, the re-sent body,
// an SSE response in 8 chunks. The Decider is a constant fake, so this is
// the protocol overhead alone.
func BenchmarkStreamFullDuplex(b *testing.B) {
	tr, _ := load.NewTracker(nil)
	h := newHarness(b, Config{Decider: &fakeDecider{dec: decision()}, Tracker: tr})
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 20_000) + `"}],"stream":true}`
	chunk := len(sseStream) / 8
	b.ReportAllocs()
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := h.client.Process(ctx)
		if err != nil {
			b.Fatal(err)
		}
		_ = s.Send(reqHeaders(false, ":path", "/v1/chat/completions", "content-type", "application/json"))
		_ = s.Send(reqBody(body, true))
		for range 2 {
			if _, err := s.Recv(); err != nil {
				b.Fatal(err)
			}
		}
		_ = s.Send(respHeaders(false, ":status", "200", "content-type", "text/event-stream"))
		if _, err := s.Recv(); err != nil {
			b.Fatal(err)
		}
		for i := 0; i < len(sseStream); i += chunk {
			end := min(i+chunk, len(sseStream))
			_ = s.Send(respBody(sseStream[i:end], end == len(sseStream)))
			if _, err := s.Recv(); err != nil {
				b.Fatal(err)
			}
		}
		_ = s.CloseSend()
		_, _ = s.Recv()
		cancel()
	}
	b.StopTimer()
	if f := tr.Get("r1"); f.Requests != 0 {
		b.Fatalf("counters leaked: %+v", f)
	}
}
