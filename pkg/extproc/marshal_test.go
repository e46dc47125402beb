package extproc

import (
	"bytes"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// answers are the messages kvroute sends besides the constant ones, one
// of each kind, small and (the streamed re-sent body) above gRPC's
// buffer-pooling threshold.
func answers() map[string]*extprocv3.ProcessingResponse {
	p := &pick{metadata: destinationMetadata("10.0.0.1:8000,10.0.0.2:8000,10.0.0.3:8000")}
	p.set = append(p.set, setHeader(DefaultDestinationHeader, "10.0.0.1:8000"), setHeader(DecisionHeader, "k3x9.1a.8f7d6e5c4b3a2"),
		setHeader(DefaultFallbackHeader, "10.0.0.2:8000,10.0.0.3:8000"))
	p.remove = []string{DefaultDestinationHeader, "x-gateway-destination-endpoint-x"}
	strip := &pick{remove: []string{"x-gateway-destination-endpoint-evil"}}
	return map[string]*extprocv3.ProcessingResponse{
		"pick after the body":      requestBodyResponse(p),
		"no pick after the body":   requestBodyResponse(nil),
		"pick with the headers":    requestHeadersResponse(p),
		"stripping, no pick":       requestHeadersResponse(strip),
		"streamed chunk, small":    streamedChunk([]byte("data: x\n\n"), false, false),
		"streamed chunk, 62000 B":  streamedChunk(bytes.Repeat([]byte("y"), MaxStreamedChunk), true, true),
		"empty streamed chunk":     streamedChunk(nil, true, true),
		"immediate response (413)": immediateResponse(rejection{code: 413, reason: ReasonTooLarge, message: strings.Repeat("too large ", 200)}),
	}
}

// Every answer the codec encodes decodes back, with protobuf's decoder,
// to the message it was given, whichever encoder the build has.
func TestCodecMarshalRoundTrips(t *testing.T) {
	for name, want := range answers() {
		t.Run(name, func(t *testing.T) {
			out, err := codec{}.Marshal(want)
			if err != nil {
				t.Fatal(err)
			}
			wire := out.Materialize()
			out.Free()
			got := new(extprocv3.ProcessingResponse)
			if err := proto.Unmarshal(wire, got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, want) {
				t.Fatalf("codec wrote\n%v\nwant\n%v", got, want)
			}
			if size := proto.Size(want); len(wire) != size {
				t.Fatalf("%d bytes written, protobuf's size %d", len(wire), size)
			}
		})
	}
}

// BenchmarkMarshalAnswer encodes the answer to a buffered request body
// that carries a pick (header mutation and envoy.lb metadata) with the
// codec (vtprotobuf's generated code when built with the vtprotobuf tag)
// and with protobuf's reflection-based encoder; and a 62,000-byte
// streamed chunk, whose buffer is pooled.
func BenchmarkMarshalAnswer(b *testing.B) {
	all := answers()
	for _, name := range []string{"pick after the body", "streamed chunk, 62000 B"} {
		r := all[name]
		for _, c := range []struct {
			name string
			fn   func() (mem.BufferSlice, error)
		}{
			{"codec", func() (mem.BufferSlice, error) { return codec{}.Marshal(r) }},
			{"protobuf", func() (mem.BufferSlice, error) { return protoCodec.Marshal(r) }},
		} {
			b.Run(strings.ReplaceAll(name, " ", "_")+"/"+c.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					out, err := c.fn()
					if err != nil {
						b.Fatal(err)
					}
					out.Free()
				}
			})
		}
	}
}
