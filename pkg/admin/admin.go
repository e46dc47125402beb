package admin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvroutev1 "github.com/kvroute/kvroute/proto/kvroute/v1"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/route"
)

// ErrBadRequest classifies input errors: a RequestParser wraps it (with %w)
// when the body is not a request it understands. Explain answers them with
// InvalidArgument (HTTP 400).
var ErrBadRequest = errors.New("admin: bad request")

// Explainer runs the routing decision without side effects: no load counter,
// no session state and no round-robin cursor may move.
type Explainer interface {
	Explain(ctx context.Context, req route.Request) (route.Decision, error)
}

// RequestParser turns an OpenAI request body, for the given path, into the
// protocol-free request. Errors the client caused wrap ErrBadRequest.
type RequestParser func(path string, body []byte) (route.Request, error)

// ReplicaInfo is one replica (or data-parallel rank) as the admin API lists
// it.
type ReplicaInfo struct {
	ID      index.ReplicaID
	Address string
	Model   string
	Engine  string
	Load    load.Load
	// Event stream state.
	EventsConfigured bool
	Resyncing        bool
	Warm             bool
	LastSeq          uint64
	Silent           bool
	// Credit is the cache credit the router gives the replica's index view.
	Credit float64
	// Cache: cached tokens predicted at routing time vs served
	// (load.Fidelity.Totals).
	Cache load.CacheTotals
}

// ReplicaLister lists the current replica set.
type ReplicaLister interface {
	ReplicaInfos() []ReplicaInfo
}

// IndexStater reports the prefix index's size (index.Index implements it).
type IndexStater interface {
	Stats() index.Stats
}

// RecordedDecision is a routing decision as it was made: when, and the
// decision (its candidates' match, load and cost).
type RecordedDecision struct {
	At       time.Time
	Decision route.Decision
}

// ErrNoHistory is a DecisionLister's answer when no decisions are kept;
// Decisions answers it with FAILED_PRECONDITION (HTTP 409).
var ErrNoHistory = errors.New("no decision history is kept (routing.decision_history is 0)")

// DecisionLister lists the newest routing decisions made, oldest first (at
// most limit of them; limit <= 0: every one kept), and how many were made
// since start; ErrNoHistory when none are kept.
type DecisionLister interface {
	Decisions(limit int) ([]RecordedDecision, uint64, error)
}

// Config is what a Server reads. Every field is required except Decisions
// (nil: Decisions answers FAILED_PRECONDITION) and Logger (nil:
// slog.Default()).
type Config struct {
	Explainer Explainer
	Parse     RequestParser
	Replicas  ReplicaLister
	Index     IndexStater
	Decisions DecisionLister
	Logger    *slog.Logger
}

// Server implements kvroutev1.AdminServer and its HTTP JSON mirror.
type Server struct {
	kvroutev1.UnimplementedAdminServer
	cfg Config
	log *slog.Logger
}

var _ kvroutev1.AdminServer = (*Server)(nil)

// New checks cfg and returns a Server. It starts nothing.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Explainer == nil:
		return nil, errors.New("admin: Config.Explainer is nil")
	case cfg.Parse == nil:
		return nil, errors.New("admin: Config.Parse is nil")
	case cfg.Replicas == nil:
		return nil, errors.New("admin: Config.Replicas is nil")
	case cfg.Index == nil:
		return nil, errors.New("admin: Config.Index is nil")
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Server{cfg: cfg, log: log}, nil
}

// Register adds the Admin service to a gRPC server.
func (s *Server) Register(g grpc.ServiceRegistrar) { kvroutev1.RegisterAdminServer(g, s) }

// Explain implements kvroutev1.AdminServer.
func (s *Server) Explain(ctx context.Context, in *kvroutev1.ExplainRequest) (*kvroutev1.ExplainResponse, error) {
	req, err := s.request(in)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	d, err := s.cfg.Explainer.Explain(ctx, req)
	if err != nil {
		return nil, decideStatus(err)
	}
	return decisionProto(d), nil
}

// Decisions implements kvroutev1.AdminServer.
func (s *Server) Decisions(_ context.Context, in *kvroutev1.DecisionsRequest) (*kvroutev1.DecisionsResponse, error) {
	if in.GetLimit() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "limit must not be negative, got %d", in.GetLimit())
	}
	if s.cfg.Decisions == nil {
		return nil, status.Error(codes.FailedPrecondition, ErrNoHistory.Error())
	}
	recs, total, err := s.cfg.Decisions.Decisions(int(min(in.GetLimit(), math.MaxInt32)))
	if errors.Is(err, ErrNoHistory) {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	out := &kvroutev1.DecisionsResponse{Total: int64(min(total, math.MaxInt64)), Decisions: make([]*kvroutev1.RecordedDecision, 0, len(recs))}
	for _, r := range recs {
		out.Decisions = append(out.Decisions, &kvroutev1.RecordedDecision{UnixNanos: r.At.UnixNano(), Decision: decisionProto(r.Decision)})
	}
	return out, nil
}

func (s *Server) request(in *kvroutev1.ExplainRequest) (route.Request, error) {
	if len(in.GetBody()) == 0 {
		if len(in.GetTokenIds()) == 0 {
			return route.Request{}, fmt.Errorf("%w: body or token_ids is required", ErrBadRequest)
		}
		if in.GetModel() == "" {
			return route.Request{}, fmt.Errorf("%w: model is required with token_ids", ErrBadRequest)
		}
		return route.Request{
			Model:      in.GetModel(),
			Tokens:     append([]uint32(nil), in.GetTokenIds()...),
			SessionKey: in.GetSessionKey(),
		}, nil
	}
	req, err := s.cfg.Parse(in.GetPath(), in.GetBody())
	if err != nil {
		return route.Request{}, err
	}
	if len(in.GetTokenIds()) > 0 {
		req.Tokens = append([]uint32(nil), in.GetTokenIds()...)
	}
	if in.GetModel() != "" {
		req.Model = in.GetModel()
	}
	if in.GetSessionKey() != "" {
		req.SessionKey = in.GetSessionKey()
	}
	return req, nil
}

// decideStatus maps a decision error to a gRPC status, in one place.
func decideStatus(err error) error {
	switch {
	case errors.Is(err, ErrBadRequest):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, route.ErrUnknownModel):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, route.ErrNoReplica):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// Replicas implements kvroutev1.AdminServer.
func (s *Server) Replicas(context.Context, *kvroutev1.ReplicasRequest) (*kvroutev1.ReplicasResponse, error) {
	infos := s.cfg.Replicas.ReplicaInfos()
	out := &kvroutev1.ReplicasResponse{Replicas: make([]*kvroutev1.Replica, 0, len(infos))}
	for _, r := range infos {
		out.Replicas = append(out.Replicas, &kvroutev1.Replica{
			Id:                    string(r.ID),
			Address:               r.Address,
			Model:                 r.Model,
			Engine:                r.Engine,
			Healthy:               r.Load.Healthy,
			Load:                  loadProto(r.Load),
			EventsConfigured:      r.EventsConfigured,
			Resyncing:             r.Resyncing,
			Warm:                  r.Warm,
			LastSeq:               r.LastSeq,
			Silent:                r.Silent,
			Credit:                r.Credit,
			PredictedCachedTokens: r.Cache.Predicted,
			ServedCachedTokens:    r.Cache.Served,
		})
	}
	return out, nil
}

// IndexStats implements kvroutev1.AdminServer.
func (s *Server) IndexStats(context.Context, *kvroutev1.IndexStatsRequest) (*kvroutev1.IndexStatsResponse, error) {
	st := s.cfg.Index.Stats()
	return &kvroutev1.IndexStatsResponse{
		Keys:         int64(st.Keys),
		Holders:      int64(st.Holders),
		EngineHashes: int64(st.Engine),
		Replicas:     int64(st.Replicas),
		Bytes:        st.Bytes,
		BudgetBytes:  st.Budget,
		Evicted:      st.Evicted,
	}, nil
}

func loadProto(l load.Load) *kvroutev1.Load {
	return &kvroutev1.Load{
		ActivePrefillBlocks:     l.ActivePrefillBlocks,
		ActiveDecodeBlocks:      l.ActiveDecodeBlocks,
		ActiveRequests:          int64(l.ActiveRequests),
		WaitingRequests:         int64(l.WaitingRequests),
		KvUsage:                 l.KVUsage,
		Healthy:                 l.Healthy,
		KvBlocks:                l.KVBlocks,
		PrefillTokensPerSecond:  l.PrefillRate,
		DecodeStepMicros:        l.DecodeStep.Microseconds(),
		OldestPrefillWaitMicros: l.OldestPrefillWait.Microseconds(),
		OldestPrefillBlocks:     l.OldestPrefillBlocks,
		Preempting:              l.Preempting,
		MemoryBound:             l.MemoryBound(),
	}
}

func decisionProto(d route.Decision) *kvroutev1.ExplainResponse {
	out := &kvroutev1.ExplainResponse{
		Replica:              string(d.Replica),
		Address:              d.Address,
		Fallbacks:            append([]string(nil), d.Fallbacks...),
		Policy:               d.Policy,
		Reason:               d.Reason,
		Degraded:             d.Degraded,
		PromptTokens:         int64(d.PromptTokens),
		PromptBlocks:         int64(d.PromptBlocks),
		TokenSource:          d.TokenSource,
		TokenizeMicros:       d.TokenizeTime.Microseconds(),
		DecideMicros:         d.DecideTime.Microseconds(),
		Candidates:           make([]*kvroutev1.Candidate, 0, len(d.Candidates)),
		Session:              d.Session,
		QueuedTokens:         int64(d.QueuedTokens),
		SessionFromPrompt:    d.SessionFromPrompt,
		MaxTokens:            int64(d.MaxTokens),
		ExpectedOutputTokens: int64(d.ExpectedOutputTokens),
	}
	for _, c := range d.Candidates {
		out.Candidates = append(out.Candidates, &kvroutev1.Candidate{
			Replica: string(c.Replica),
			Address: c.Address,
			Matched: &kvroutev1.TierBlocks{
				Gpu:  int64(c.Matched[index.TierGPU]),
				Cpu:  int64(c.Matched[index.TierCPU]),
				Disk: int64(c.Matched[index.TierDisk]),
			},
			Credit:        c.Trust,
			Load:          loadProto(c.Load),
			Cost:          c.Cost,
			Eligible:      c.Eligible,
			Picked:        d.Replica != "" && c.Replica == d.Replica,
			Approximate:   c.Approximate,
			Home:          c.Home,
			PendingBlocks: int64(c.Pending),
			VouchedBlocks: int64(c.Vouched),
		})
	}
	return out
}
