package extproc

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
)

// FloorProcessor is the least an ext_proc server can do with the messages
// Envoy sends it under envoy/envoy.yaml: on the router filter's stream it
// answers the request headers, and answers the buffered body with the
// next endpoint in turn (round robin) as kvroute answers a pick (the
// destination header, a decision id and the envoy.lb dynamic metadata);
// on the observer filter's stream it reads up to the first response chunk
// (what timing a first token needs) and then ends the stream, as kvroute
// does for a response it does not follow to its end. It parses no body,
// tokenizes, matches and accounts nothing: its cost per request is gRPC's
// and protobuf's, the floor under kvroute's own on the same protocol. It
// is for measuring (kvbench overhead -floor, the overhead package's
// benchmarks), never for routing.
type FloorProcessor struct {
	extprocv3.UnimplementedExternalProcessorServer
	endpoints []string
	seq       atomic.Uint64
}

// NewFloorProcessor routes to endpoints ("ip:port") in turn.
func NewFloorProcessor(endpoints []string) (*FloorProcessor, error) {
	if len(endpoints) == 0 {
		return nil, errors.New("floor processor: no endpoints")
	}
	return &FloorProcessor{endpoints: endpoints}, nil
}

// Process serves one ext_proc stream.
func (f *FloorProcessor) Process(s extprocv3.ExternalProcessor_ProcessServer) error {
	for {
		req, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil // the proxy ended the stream
		}
		if err != nil {
			return err
		}
		if req.GetObservabilityMode() {
			if req.GetResponseBody() != nil {
				return nil // the first token: stop the rest of the chunks
			}
			continue
		}
		var resp *extprocv3.ProcessingResponse
		switch req.GetRequest().(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			resp = requestHeadersResponse(&pick{})
		case *extprocv3.ProcessingRequest_RequestBody:
			resp = f.pick()
		case *extprocv3.ProcessingRequest_RequestTrailers:
			resp = reqTrailersContinue
		default:
			continue // a response phase this filter was not configured to send
		}
		if err := s.Send(resp); err != nil {
			return err
		}
	}
}

// pick answers a buffered request body with the next endpoint, built as
// Server builds a pick's answer.
func (f *FloorProcessor) pick() *extprocv3.ProcessingResponse {
	n := f.seq.Add(1)
	dest := f.endpoints[n%uint64(len(f.endpoints))]
	return requestBodyResponse(&pick{
		set:      []*corev3.HeaderValueOption{setHeader(DefaultDestinationHeader, dest), setHeader(DecisionHeader, "floor."+strconv.FormatUint(n, 36))},
		metadata: destinationMetadata(dest),
	})
}

// ServeFloor serves a FloorProcessor on lis, with kvroute's own gRPC
// server options (Config.ServerOptions: its codec, windows and stream
// workers) and the gRPC health service Envoy's health check asks,
// until ctx ends; it then stops the server and returns.
func ServeFloor(ctx context.Context, lis net.Listener, endpoints []string) error {
	f, err := NewFloorProcessor(endpoints)
	if err != nil {
		return err
	}
	g := grpc.NewServer(Config{}.ServerOptions()...)
	extprocv3.RegisterExternalProcessorServer(g, f)
	hs := NewHealth()
	hs.SetReady(true)
	hs.Register(g)
	done := make(chan error, 1)
	go func() { done <- g.Serve(lis) }()
	select {
	case <-ctx.Done():
		g.Stop()
		return <-done
	case err := <-done:
		return err
	}
}
