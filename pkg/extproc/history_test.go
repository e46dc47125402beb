package extproc

import (
	"errors"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/route"
)

func TestHistoryKeepsNewestOldestFirst(t *testing.T) {
	h := newHistory(3)
	t0 := time.Unix(1000, 0)
	for i := range 5 {
		h.add(t0.Add(time.Duration(i)*time.Second), route.Decision{PromptTokens: i})
	}
	recs, total := h.recent(0)
	if total != 5 || len(recs) != 3 {
		t.Fatalf("recent(0) = %d records, total %d; want 3, 5", len(recs), total)
	}
	for i, r := range recs {
		if want := i + 2; r.Decision.PromptTokens != want || !r.At.Equal(t0.Add(time.Duration(want)*time.Second)) {
			t.Errorf("record %d = decision %d at %v, want decision %d (oldest first)", i, r.Decision.PromptTokens, r.At, want)
		}
	}
	recs, _ = h.recent(2)
	if len(recs) != 2 || recs[0].Decision.PromptTokens != 3 || recs[1].Decision.PromptTokens != 4 {
		t.Errorf("recent(2) = %+v, want decisions 3 and 4", recs)
	}
	if newHistory(0) != nil {
		t.Error("newHistory(0) keeps a history")
	}
}

func TestHistoryDropsTheInFlightCharge(t *testing.T) {
	tr, err := load.NewTracker(nil)
	if err != nil {
		t.Fatal(err)
	}
	hold := tr.Start("r1", 4, 4)
	defer hold.Done()
	h := newHistory(1)
	h.add(time.Now(), route.Decision{Replica: "r1", Hold: hold})
	recs, _ := h.recent(0)
	if len(recs) != 1 || recs[0].Decision.Hold != nil || recs[0].Decision.Replica != "r1" {
		t.Fatalf("recorded %+v, want the decision without its Hold", recs)
	}
}

func TestServerRecordsRoutedDecisions(t *testing.T) {
	fd := &fakeDecider{dec: decision()}
	h := newHarness(t, Config{Decider: fd, DecisionHistory: 8})
	for range 3 {
		h.exchange(reqHeaders(false, ":path", "/v1/completions"), reqBody(`{"model":"m","prompt":"hello"}`, true))
	}
	recs, total, err := h.server.Decisions(2)
	if err != nil {
		t.Fatal(err)
	}
	if total != 3 || len(recs) != 2 {
		t.Fatalf("Decisions(2) = %d records, total %d; want 2, 3", len(recs), total)
	}
	if d := recs[1].Decision; d.Replica != "r1" || len(d.Candidates) != 2 || d.Candidates[1].Cost != 4 || recs[1].At.IsZero() {
		t.Errorf("newest record = %+v at %v, want the decider's pick with both candidates", d, recs[1].At)
	}

	off := newHarness(t, Config{Decider: fd})
	off.exchange(reqHeaders(false, ":path", "/v1/completions"), reqBody(`{"model":"m","prompt":"hello"}`, true))
	if _, _, err := off.server.Decisions(0); !errors.Is(err, ErrNoHistory) {
		t.Errorf("without a history: %v, want ErrNoHistory", err)
	}
}

func TestConfigDecisionHistoryBounds(t *testing.T) {
	if err := (Config{Decider: &fakeDecider{}, DecisionHistory: MaxDecisionHistory}).WithDefaults().Validate(); err != nil {
		t.Fatalf("DecisionHistory %d refused: %v", MaxDecisionHistory, err)
	}
	for _, n := range []int{-1, MaxDecisionHistory + 1} {
		c := Config{Decider: &fakeDecider{}, DecisionHistory: n}.WithDefaults()
		if err := c.Validate(); err == nil {
			t.Errorf("DecisionHistory %d accepted", n)
		}
	}
}
