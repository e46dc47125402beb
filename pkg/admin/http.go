package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"strconv"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	kvroutev1 "github.com/kvroute/kvroute/proto/kvroute/v1"
)

// MaxExplainBody bounds the request body POST /debug/explain reads.
const MaxExplainBody = 16 << 20

var jsonOut = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true, Multiline: true}

// Handler returns the HTTP JSON mirror of the Admin service:
// POST /debug/explain, GET /debug/decisions, GET /debug/replicas,
// GET /debug/index; and the Go
// profiler under /debug/pprof/ (net/http/pprof), which is why the admin
// listener stays on loopback unless TLS (tls.admin) protects it.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("POST /debug/explain", s.httpExplain)
	mux.HandleFunc("GET /debug/decisions", func(w http.ResponseWriter, r *http.Request) {
		var limit int64
		if v := r.URL.Query().Get("limit"); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				writeError(w, http.StatusBadRequest, "limit: "+err.Error())
				return
			}
			limit = n
		}
		out, err := s.Decisions(r.Context(), &kvroutev1.DecisionsRequest{Limit: limit})
		s.reply(w, out, err)
	})
	mux.HandleFunc("GET /debug/replicas", func(w http.ResponseWriter, r *http.Request) {
		out, err := s.Replicas(r.Context(), &kvroutev1.ReplicasRequest{})
		s.reply(w, out, err)
	})
	mux.HandleFunc("GET /debug/index", func(w http.ResponseWriter, r *http.Request) {
		out, err := s.IndexStats(r.Context(), &kvroutev1.IndexStatsRequest{})
		s.reply(w, out, err)
	})
	return mux
}

func (s *Server) httpExplain(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxExplainBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, "request body too large")
			return
		}
		writeError(w, http.StatusBadRequest, "reading body: "+err.Error())
		return
	}
	q := r.URL.Query()
	session := q.Get("session")
	if session == "" {
		session = r.Header.Get("x-session-id")
	}
	out, err := s.Explain(r.Context(), &kvroutev1.ExplainRequest{
		Body:       body,
		Path:       q.Get("path"),
		SessionKey: session,
	})
	s.reply(w, out, err)
}

func (s *Server) reply(w http.ResponseWriter, m proto.Message, err error) {
	if err != nil {
		st := status.Convert(err)
		writeError(w, httpStatus(st.Code()), st.Message())
		return
	}
	b, err := jsonOut.Marshal(m)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// httpStatus maps the gRPC codes Explain returns to HTTP statuses.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.NotFound:
		return http.StatusNotFound
	case codes.FailedPrecondition:
		return http.StatusConflict
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.Canceled:
		return 499 // client closed the request
	}
	return http.StatusInternalServerError
}

type errorBody struct {
	Error struct {
		Message string `json:"message"`
		Code    int    `json:"code"`
	} `json:"error"`
}

// maxErrorBytes bounds an error message (which may quote request values,
// e.g. a model name) written back.
const maxErrorBytes = 512

func writeError(w http.ResponseWriter, code int, msg string) {
	if len(msg) > maxErrorBytes {
		cut := msg[:maxErrorBytes]
		for len(cut) > 0 && !utf8.ValidString(cut) {
			cut = cut[:len(cut)-1]
		}
		msg = fmt.Sprintf("%s... (%d bytes)", cut, len(msg))
	}
	var e errorBody
	e.Error.Message = msg
	e.Error.Code = code
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(e)
}
