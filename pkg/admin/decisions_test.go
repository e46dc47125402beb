package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvroutev1 "github.com/kvroute/kvroute/proto/kvroute/v1"

	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/route"
)

type fakeHistory struct {
	recs  []RecordedDecision
	total uint64
	err   error
	limit int
}

func (f *fakeHistory) Decisions(limit int) ([]RecordedDecision, uint64, error) {
	f.limit = limit
	if f.err != nil {
		return nil, 0, f.err
	}
	n := len(f.recs)
	if limit > 0 && limit < n {
		return f.recs[n-limit:], f.total, nil
	}
	return f.recs, f.total, nil
}

func historyServer(t *testing.T, h DecisionLister) *Server {
	t.Helper()
	s := newServer(t, &fakeExplainer{d: decision()})
	s.cfg.Decisions = h
	return s
}

func TestDecisionsGRPC(t *testing.T) {
	d := decision()
	d.Session, d.QueuedTokens, d.SessionFromPrompt = "conv:p7", 4096, true
	d.Candidates[1].Home, d.Candidates[1].Pending = true, 3
	d.Candidates[1].Load.PrefillRate, d.Candidates[1].Load.DecodeStep = 16000, 9*time.Millisecond
	d.Candidates[1].Load.OldestPrefillWait, d.Candidates[1].Load.OldestPrefillBlocks = 2500*time.Millisecond, 70
	at := time.Unix(1700000000, 5)
	h := &fakeHistory{recs: []RecordedDecision{{At: at.Add(-time.Second), Decision: decision()}, {At: at, Decision: d}}, total: 9}
	c := dial(t, historyServer(t, h))
	out, err := c.Decisions(t.Context(), &kvroutev1.DecisionsRequest{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if h.limit != 1 || out.GetTotal() != 9 || len(out.GetDecisions()) != 1 {
		t.Fatalf("limit %d, response %v", h.limit, out)
	}
	r := out.GetDecisions()[0]
	got := r.GetDecision()
	if r.GetUnixNanos() != at.UnixNano() || got.GetSession() != "conv:p7" || !got.GetSessionFromPrompt() || got.GetQueuedTokens() != 4096 || got.GetReplica() != "r1" {
		t.Fatalf("decision %v", r)
	}
	if out, err := c.Decisions(t.Context(), &kvroutev1.DecisionsRequest{Limit: 2}); err != nil || len(out.GetDecisions()) != 2 || out.GetDecisions()[0].GetDecision().GetSessionFromPrompt() {
		t.Fatalf("the older decision, its session its own: %v, %v", out, err)
	}
	c1 := got.GetCandidates()[1]
	if !c1.GetHome() || c1.GetPendingBlocks() != 3 || c1.GetLoad().GetPrefillTokensPerSecond() != 16000 || c1.GetLoad().GetDecodeStepMicros() != 9000 || !c1.GetPicked() ||
		c1.GetLoad().GetOldestPrefillWaitMicros() != 2_500_000 || c1.GetLoad().GetOldestPrefillBlocks() != 70 {
		t.Fatalf("candidate r1 = %v", c1)
	}
	if got.GetCandidates()[0].GetHome() {
		t.Error("r0 marked home")
	}
	if _, err := c.Decisions(t.Context(), &kvroutev1.DecisionsRequest{Limit: -1}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("negative limit: %v, want InvalidArgument", err)
	}
}

func TestDecisionsWithoutHistory(t *testing.T) {
	for name, s := range map[string]*Server{
		"no lister":         historyServer(t, nil),
		"lister keeps none": historyServer(t, &fakeHistory{err: ErrNoHistory}),
	} {
		t.Run(name, func(t *testing.T) {
			srv := httptest.NewServer(s.Handler())
			defer srv.Close()
			resp, err := srv.Client().Get(srv.URL + "/debug/decisions")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusConflict {
				t.Fatalf("status %d, body %s; want 409", resp.StatusCode, b)
			}
		})
	}
}

func TestDecisionsHTTP(t *testing.T) {
	d := decision()
	d.Candidates[0].Load = load.Load{Healthy: true, ActiveRequests: 2}
	h := &fakeHistory{recs: []RecordedDecision{{At: time.Unix(1, 0), Decision: route.Decision{Replica: "r0"}}, {At: time.Unix(2, 0), Decision: d}}, total: 2}
	srv := httptest.NewServer(historyServer(t, h).Handler())
	defer srv.Close()
	get := func(path string) (int, map[string]any) {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	code, m := get("/debug/decisions")
	decs, _ := m["decisions"].([]any)
	if code != 200 || len(decs) != 2 || h.limit != 0 {
		t.Fatalf("status %d, %d decisions, limit %d: %v", code, len(decs), h.limit, m)
	}
	if last := decs[1].(map[string]any)["decision"].(map[string]any); last["replica"] != "r1" || len(last["candidates"].([]any)) != 3 {
		t.Fatalf("newest decision %v", last)
	}
	if code, _ := get("/debug/decisions?limit=1"); code != 200 || h.limit != 1 {
		t.Fatalf("limit=1: status %d, lister limit %d", code, h.limit)
	}
	if code, _ := get("/debug/decisions?limit=x"); code != http.StatusBadRequest {
		t.Fatalf("limit=x: status %d, want 400", code)
	}
}
