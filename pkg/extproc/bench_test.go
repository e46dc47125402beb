package extproc

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

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

// BenchmarkResponseChunk is the router's cost per streamed response chunk
// once a request is routed and its first token seen: the chunk message
// in, the echoed answer out, over bufconn (gRPC framing and protobuf
// included). It reports the round trip (ns/op) and the process CPU per
// chunk (cpu-ns/op).
func BenchmarkResponseChunk(b *testing.B) {
	tr, _ := load.NewTracker(nil)
	h := newHarness(b, Config{Decider: &fakeDecider{dec: decision()}, Tracker: tr})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := h.client.Process(ctx)
	if err != nil {
		b.Fatal(err)
	}
	send(b, s, reqHeaders(true, ":path", "/v1/chat/completions"))
	recv(b, s)
	send(b, s, respHeaders(false, ":status", "200", "content-type", "text/event-stream"))
	recv(b, s)
	send(b, s, respBody("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n", false))
	recv(b, s)
	chunk := respBody("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"finish_reason\":null}]}\n\n", false)
	b.ReportAllocs()
	cpu := cpuTime()
	for b.Loop() {
		if err := s.Send(chunk); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((cpuTime()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// BenchmarkChunkHandling is the same chunk through the state machine
// alone (no gRPC): what kvroute's own code costs per chunk.
func BenchmarkChunkHandling(b *testing.B) {
	tr, _ := load.NewTracker(nil)
	srv, err := New(Config{Decider: &fakeDecider{dec: decision()}, Tracker: tr})
	if err != nil {
		b.Fatal(err)
	}
	st := newProcStream(srv, context.Background())
	defer st.close()
	st.handle(reqHeaders(true, ":path", "/v1/chat/completions"))
	st.handle(respHeaders(false, ":status", "200", "content-type", "text/event-stream"))
	st.handle(respBody("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n", false))
	chunk := respBody("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"finish_reason\":null}]}\n\n", false)
	b.ReportAllocs()
	for b.Loop() {
		if out := st.handle(chunk); len(out) != 1 {
			b.Fatal("no answer")
		}
	}
}

// cpuTime is the process's CPU time so far (wall time per operation
// overstates cost on a shared, overloaded host).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkDecodeChunk decodes one streamed response chunk message as the
// server receives it: through kvroute's codec and, for comparison,
// gRPC's protobuf codec.
func BenchmarkDecodeChunk(b *testing.B) {
	wire, _ := proto.Marshal(respBody("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token\"},\"finish_reason\":null}]}\n\n", false))
	for _, c := range []struct {
		name  string
		codec encoding.CodecV2
	}{{"kvroute", codec{}}, {"protobuf", protoCodec}} {
		b.Run(c.name, func(b *testing.B) {
			req := new(extprocv3.ProcessingRequest)
			b.ReportAllocs()
			for b.Loop() {
				if err := c.codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wire)}, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
