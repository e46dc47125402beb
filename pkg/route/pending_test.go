package route

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/policy"
)

// A request sharing a prefix with one just sent to r1 (not yet in r1's
// events) is credited there with that prefix while Options.Pending
// remembers it, the extra blocks on the GPU tier; Explain reads but does
// not record; after DefaultPendingTTL the credit is gone; the index's own
// longer match is never shortened.
func TestDecidePendingPrefix(t *testing.T) {
	st := fleet(3)
	ix := index.New(index.Config{})
	now := time.Unix(1000, 0)
	p, err := policy.New(policy.NameBlended, policy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pending := NewApproxIndex(ApproxConfig{TTL: DefaultPendingTTL})
	rt := New(Options{Matcher: ix, State: st, Policy: p, Seed: 1, Pending: pending, Now: func() time.Time { return now }})

	task := seq(20*16, 500)
	first := append(append([]uint32(nil), task...), seq(4*16, 9000)...)
	d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: first})
	if err != nil {
		t.Fatal(err)
	}
	if d.MatchedBlocks() != 0 || d.Replica != "r0" { // cold: the least loaded
		t.Fatalf("first decision: %s matched %d", d.Replica, d.MatchedBlocks())
	}
	sibling := append(append([]uint32(nil), task...), seq(4*16, 7000)...)
	matchedOn := func(d Decision, r index.ReplicaID) [index.NumTiers]int {
		for _, c := range d.Candidates {
			if c.Replica == r {
				return c.Matched
			}
		}
		t.Fatalf("no candidate %s", r)
		return [index.NumTiers]int{}
	}

	e, err := rt.Explain(t.Context(), Request{Model: model, Tokens: sibling})
	if err != nil {
		t.Fatal(err)
	}
	if m := matchedOn(e, "r0"); m[index.TierGPU] != 20 || e.Replica != "r0" {
		t.Fatalf("sibling: r0 matched %v (want the 20-block task prefix on the GPU tier), picked %s", m, e.Replica)
	}
	if m := matchedOn(e, "r1"); m != ([index.NumTiers]int{}) {
		t.Fatalf("sibling: r1 matched %v, want nothing", m)
	}
	if s := pending.Stats(); s.Keys != 24 {
		t.Fatalf("pending holds %d keys after one Decide and one Explain, want the first request's 24", s.Keys)
	}

	// The index's longer match on r2 wins over a shorter pending one.
	store(t, ix, "r2", model, sibling, 16)
	if _, err := rt.Decide(t.Context(), Request{Model: model, Tokens: task[:5*16]}); err != nil { // records 5 blocks for its pick
		t.Fatal(err)
	}
	e, err = rt.Explain(t.Context(), Request{Model: model, Tokens: sibling})
	if err != nil {
		t.Fatal(err)
	}
	if m := matchedOn(e, "r2"); m[index.TierGPU] != 24 {
		t.Fatalf("r2 matched %v, want its 24 indexed blocks", m)
	}

	now = now.Add(DefaultPendingTTL + time.Second)
	e, err = rt.Explain(t.Context(), Request{Model: model, Tokens: sibling})
	if err != nil {
		t.Fatal(err)
	}
	if m := matchedOn(e, "r0"); m != ([index.NumTiers]int{}) {
		t.Fatalf("after the TTL r0 still matched %v", m)
	}
}
