package extproc

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync/atomic"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// instrumentationName names the tracer.
const instrumentationName = "github.com/kvroute/kvroute/pkg/extproc"

// Server is the ext_proc ExternalProcessor service. It is safe for
// concurrent use; each stream is served by the gRPC goroutine that calls
// Process and holds only that stream's state.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	cfg     Config
	tracer  trace.Tracer
	metrics *metrics
	// propFields are the (lower-case) headers the propagator reads.
	propFields map[string]bool
	// ending is set by EndStreams: every stream ends at the next message
	// that arrives after it, once that message is answered.
	ending atomic.Bool
	// slots holds one token per large-body decision being computed
	// (Config.DecideConcurrency); nil without a bound.
	slots chan struct{}
	// flights are the routed requests whose response has not ended.
	flights *flights
	// history keeps the newest decisions (Config.DecisionHistory); nil
	// when off.
	history *history
}

// ErrEndStreams is the status of a stream ended by EndStreams: UNAVAILABLE,
// which a proxy configured to fail open (Envoy's failure_mode_allow) acts on
// by serving the rest of the request without the router.
var ErrEndStreams = status.Error(codes.Unavailable, "kvroute is shutting down: its drain deadline passed; serve the rest of this request without it")

// EndStreams makes every open stream, and any stream opened later, end
// with ErrEndStreams at its next message from the proxy, after that
// message's own answer (so in FULL_DUPLEX_STREAMED mode the chunk it
// carried is echoed, not lost). A shutdown calls it when streams outlive
// the drain deadline, so that each ends with a status the proxy sees and
// acts on instead of a cut connection. A stream waiting for its next
// message (for the upstream's response headers) is not woken: the
// caller's final close of the connections ends it, which the proxy also
// sees as a failed stream.
func (s *Server) EndStreams() { s.ending.Store(true) }

// New validates cfg, applies defaults and registers the request-path
// metrics. It starts nothing.
func New(cfg Config) (*Server, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("extproc: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("extproc: register metrics: %w", err)
	}
	fields := map[string]bool{}
	for _, f := range cfg.Propagator.Fields() {
		fields[strings.ToLower(f)] = true
	}
	srv := &Server{cfg: cfg, tracer: cfg.TracerProvider.Tracer(instrumentationName), metrics: m, propFields: fields, flights: newFlights(), history: newHistory(cfg.DecisionHistory)}
	if cfg.DecideConcurrency > 0 {
		srv.slots = make(chan struct{}, cfg.DecideConcurrency)
	}
	return srv, nil
}

// ServerOptions are the gRPC server options this server's configuration
// needs (Config.ServerOptions of its validated configuration).
func (s *Server) ServerOptions() []grpc.ServerOption { return s.cfg.ServerOptions() }

// MaxRecvMsgBytes is the gRPC receive limit this server's configuration
// needs (Config.MaxRecvMsgBytes); other gRPC services that take the same
// request bodies (explain) use it too.
func (s *Server) MaxRecvMsgBytes() int { return s.cfg.MaxRecvMsgBytes() }

// Register adds the ext_proc service to g.
func (s *Server) Register(g *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(g, s)
}

// Process serves one ext_proc stream (one HTTP request). It returns nil
// when the proxy ends the stream (EOF or cancellation). A panic while
// handling a message is recovered, counted, answered with a 500 immediate
// response when possible, and ends only this stream. Whatever the exit,
// the request's load counters are released and its span ended.
func (s *Server) Process(ps extprocv3.ExternalProcessor_ProcessServer) (err error) {
	if s.cfg.Ready != nil && !s.cfg.Ready() {
		return status.Error(codes.Unavailable, "kvroute is not ready: no engine probe round completed yet")
	}
	s.metrics.active.Inc()
	st := newProcStream(s, ps.Context())
	defer func() {
		// Registered first, so it runs last: after panic recovery below.
		st.close()
		s.metrics.active.Dec()
	}()
	defer func() {
		if r := recover(); r != nil {
			s.metrics.streamErrs.WithLabelValues("panic").Inc()
			s.cfg.Logger.Error("ext_proc stream panic", slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			if !st.answered {
				s.metrics.rejected(500, ReasonInternal)
				_ = ps.Send(immediateResponse(rejection{code: 500, reason: ReasonInternal, message: "internal router error"}))
			}
			err = nil
		}
	}()
	// One request message per stream, decoded into again for each message
	// (decoding resets it): the stream state keeps no reference into it
	// beyond byte slices, which decoding allocates afresh.
	req := new(extprocv3.ProcessingRequest)
	for {
		rerr := ps.RecvMsg(req)
		if rerr != nil {
			if errors.Is(rerr, io.EOF) || status.Code(rerr) == codes.Canceled {
				return nil
			}
			s.metrics.streamErrs.WithLabelValues("recv").Inc()
			return rerr
		}
		// Read when the message arrives, not after it is answered: a stream
		// ends at the first message that arrives after EndStreams (answered
		// first), never at the one it was answering while EndStreams ran.
		ending := s.ending.Load()
		for _, resp := range st.handle(req) {
			if serr := ps.Send(resp); serr != nil {
				if status.Code(serr) != codes.Canceled {
					s.metrics.streamErrs.WithLabelValues("send").Inc()
				}
				return serr
			}
		}
		st.commitRecords() // after the pick is sent: Envoy need not wait for them
		if st.stop {
			// An observer stream with nothing (more) to observe: closing
			// it tells the proxy to send nothing more on it.
			return nil
		}
		if ending {
			s.metrics.streamErrs.WithLabelValues("ended").Inc()
			return ErrEndStreams
		}
	}
}
