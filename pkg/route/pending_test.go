package route

import (
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/policy"
)

// A request sharing a prefix with one just sent to r0 (not yet in r0's
// events) sees that prefix in flight there (Candidate.Pending, apart from
// the indexed match) while Options.Pending remembers it; Explain reads but
// does not record; after DefaultPendingTTL it is gone; a longer indexed
// match elsewhere leaves nothing in flight beyond it.
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
	candOf := func(d Decision, r index.ReplicaID) Candidate {
		for _, c := range d.Candidates {
			if c.Replica == r {
				return c
			}
		}
		t.Fatalf("no candidate %s", r)
		return Candidate{}
	}
	matchedOn := func(d Decision, r index.ReplicaID) [index.NumTiers]int { return candOf(d, r).Matched }

	e, err := rt.Explain(t.Context(), Request{Model: model, Tokens: sibling})
	if err != nil {
		t.Fatal(err)
	}
	if c := candOf(e, "r0"); c.Pending != 20 || c.Matched != ([index.NumTiers]int{}) {
		t.Fatalf("sibling: r0 pending %d matched %v, want the 20-block task prefix in flight and nothing held", c.Pending, c.Matched)
	}
	if c := candOf(e, "r1"); c.Matched != ([index.NumTiers]int{}) || c.Pending != 0 {
		t.Fatalf("sibling: r1 matched %v pending %d, want nothing", c.Matched, c.Pending)
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
	if c := candOf(e, "r0"); c.Pending != 0 {
		t.Fatalf("r0 pending %d, want none beyond r2's indexed 24 blocks", c.Pending)
	}

	now = now.Add(DefaultPendingTTL + time.Second)
	e, err = rt.Explain(t.Context(), Request{Model: model, Tokens: sibling})
	if err != nil {
		t.Fatal(err)
	}
	if c := candOf(e, "r0"); c.Pending != 0 || c.Matched != ([index.NumTiers]int{}) {
		t.Fatalf("after the TTL r0 still pending %d matched %v", c.Pending, c.Matched)
	}
}

// A fan-out's second request (the same new prompt, sent right after the
// first) joins the first where its prompt is in flight, when waiting
// there for the prefix beats prefilling it again behind another replica's
// queue: the engine shares a prefix while computing it, whether the
// sibling joins the prefix's step (short queues) or a later one (long
// ones). Without the in-flight memory it goes to the shorter queue. On an
// idle fleet waiting for the prefix costs the sibling what computing it
// elsewhere does, and computing it elsewhere is work the fleet does
// twice: a keyless sibling pays the move charge away from the holder, and
// the siblings stay together (without the memory they spread).
// With the spread regime on (spread_util 2/3), the router's work meter
// puts these two requests far below it, and the second spreads.
func TestDecideFanoutJoinsInFlightPrefix(t *testing.T) {
	prompt := seq(64*16, 100)
	spreading := 2.0 / 3
	spread, err := policy.New(policy.NameKVRoute, policy.Config{KVRoute: policy.KVRouteConfig{SpreadUtil: &spreading}})
	if err != nil {
		t.Fatal(err)
	}
	run := func(queues []float64, pending bool, pol ...policy.Policy) []index.ReplicaID {
		st := fleet(len(queues))
		for i, q := range queues {
			st.loads[st.reps[i].ID] = load.Load{Healthy: true, ActivePrefillBlocks: q, ActiveRequests: 1}
		}
		opts := Options{State: st, Seed: 1, Now: func() time.Time { return time.Unix(1000, 0) }}
		if len(pol) > 0 {
			opts.Policy = pol[0]
		}
		if pending {
			opts.Pending = NewApproxIndex(ApproxConfig{TTL: DefaultPendingTTL})
		}
		rt := New(opts)
		var picks []index.ReplicaID
		for range len(queues) {
			d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: prompt})
			if err != nil {
				t.Fatal(err)
			}
			picks = append(picks, d.Replica)
			l := st.loads[d.Replica] // the router's in-flight view: the pick's charge
			l.ActivePrefillBlocks += float64(d.PrefillBlocks)
			l.ActiveRequests++
			st.loads[d.Replica] = l
		}
		return picks
	}
	for _, queues := range [][]float64{{150, 200}, {600, 650}} {
		if got := run(queues, true); got[0] != "r0" || got[1] != "r0" {
			t.Errorf("queues %v, with in-flight memory: picks %v, want both on r0", queues, got)
		}
		if got := run(queues, false); got[0] != "r0" || got[1] != "r1" {
			t.Errorf("queues %v, without in-flight memory: picks %v, want r0 then r1", queues, got)
		}
	}
	if got := run([]float64{0, 0, 0, 0}, true); len(slices.Compact(slices.Sorted(slices.Values(got)))) != 1 {
		t.Errorf("idle fleet: picks %v, want the 4 siblings on one replica", got)
	}
	if got := run([]float64{0, 0, 0, 0}, false); len(slices.Compact(slices.Sorted(slices.Values(got)))) != 4 {
		t.Errorf("idle fleet, without in-flight memory: picks %v, want 4 siblings on 4 replicas", got)
	}
	if got := run([]float64{150, 200}, true, spread); got[0] != "r0" || got[1] != "r1" {
		t.Errorf("spread regime: picks %v, want r0 then r1", got)
	}
}

// With Options.DeferRecords a decision's pending record is staged (seen by
// the next decision at once) and written by Decision.Commit; the
// dispatch-learned index's record waits for Commit.
func TestDeferRecords(t *testing.T) {
	t.Run("pending", func(t *testing.T) {
		p, err := policy.New(policy.NameBlended, policy.Config{})
		if err != nil {
			t.Fatal(err)
		}
		pending := NewApproxIndex(ApproxConfig{TTL: DefaultPendingTTL})
		rt := New(Options{Matcher: index.New(index.Config{}), State: fleet(3), Policy: p, Seed: 1, Pending: pending, DeferRecords: true,
			Now: func() time.Time { return t0 }})
		task := seq(20*16, 500)
		d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: task})
		if err != nil {
			t.Fatal(err)
		}
		if s := pending.Stats(); s.Keys != 0 {
			t.Fatalf("pending holds %d keys before Commit, want 0 (staged only)", s.Keys)
		}
		sibling := append(slices.Clone(task), seq(16, 7000)...)
		e, err := rt.Explain(t.Context(), Request{Model: model, Tokens: sibling})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range e.Candidates {
			if want := map[bool]int{true: 20, false: 0}[c.Replica == d.Replica]; c.Pending != want {
				t.Fatalf("before Commit: %s pending %d, want %d", c.Replica, c.Pending, want)
			}
		}
		d.Commit()
		d.Commit() // a second call does nothing
		if s := pending.Stats(); s.Keys != 20 || len(pending.staged) != 0 {
			t.Fatalf("after Commit: %d keys, %d staged; want 20 and 0", s.Keys, len(pending.staged))
		}
		if e, err = rt.Explain(t.Context(), Request{Model: model, Tokens: sibling}); err != nil {
			t.Fatal(err)
		}
		if c := candidate(t, e, d.Replica); c.Pending != 20 {
			t.Fatalf("after Commit: %s pending %d, want 20", d.Replica, c.Pending)
		}
	})
	t.Run("approximate", func(t *testing.T) {
		prompt := seq(40*16, 3)
		g := newApproxRig(t, approxTokenizer(prompt))
		g.rt.opts.DeferRecords = true
		d, err := g.rt.Decide(t.Context(), Request{Model: model, Input: TokenizeInput{Prompt: "x"}})
		if err != nil {
			t.Fatal(err)
		}
		if st := g.ax.Stats(); st.Entries != 0 {
			t.Fatalf("learned %+v before Commit, want nothing", st)
		}
		d.Commit()
		if st := g.ax.Stats(); st.Entries != 40 {
			t.Fatalf("learned %+v after Commit, want 40 entries", st)
		}
	})
}

// A request whose prompt is in flight on its pick (a fan-out sibling
// behind the request that carried it there) adds to that replica's fluid
// queue only the blocks it computes itself: the engine computes the
// shared prefix once, for the request that carried it, even when the
// sibling joins the step computing it (policy.InFlightCredit). Counting it again
// over-stated the queue ahead of the next request, and with it the
// prefill speed the rate learner took from that request
// (RateSample.Queued): on fan-out at 8 replicas, 1.1, learned speeds of
// 18,000-22,000 tokens/s (up to 29,000) where the engine does 15,700.
func TestDecideFluidQueueSkipsPrefixInFlight(t *testing.T) {
	st := fleet(1)
	st.loads["r0"] = load.Load{Healthy: true, ActivePrefillBlocks: 1000, PrefillRate: 1600}
	p, err := policy.New(policy.NameRoundRobin, policy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	pending := NewApproxIndex(ApproxConfig{TTL: DefaultPendingTTL})
	rt := New(Options{Matcher: index.New(index.Config{}), State: st, Policy: p, Seed: 1, Pending: pending, Now: func() time.Time { return now }})
	task := seq(20*16, 500)
	decide := func(name string, tokens []uint32, ahead int) {
		t.Helper()
		d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: tokens})
		if err != nil {
			t.Fatal(err)
		}
		if d.QueuedTokens != ahead*16 {
			t.Errorf("%s: %d tokens queued ahead, want %d blocks' %d", name, d.QueuedTokens, ahead, ahead*16)
		}
	}
	queued := func() float64 {
		q, _ := rt.fluid.get("r0", now, 100)
		return q
	}
	// Nothing but the prefix queued: the sibling joins its step, which
	// computes the prefix once for both.
	st.loads["r0"] = load.Load{Healthy: true, ActivePrefillBlocks: 20, PrefillRate: 1600}
	decide("alone: first", append(append([]uint32(nil), task...), seq(4*16, 9000)...), 0)
	decide("alone: sibling", append(append([]uint32(nil), task...), seq(4*16, 7000)...), 20) // capped by the 20 charged blocks
	if q := queued(); q != 28 {
		t.Errorf("alone: fluid queue %v blocks, want the first's 24 and the sibling's own 4", q)
	}
	st.loads["r0"] = load.Load{Healthy: true, ActivePrefillBlocks: 1000, PrefillRate: 1600}
	now = now.Add(time.Hour)
	task = seq(20*16, 40000)
	for i, tc := range []struct {
		tokens []uint32
		ahead  int // blocks queued ahead
	}{
		{append(append([]uint32(nil), task...), seq(4*16, 9000)...), 0},
		{append(append([]uint32(nil), task...), seq(4*16, 7000)...), 24}, // its 20-block task in flight
		{seq(50*16, 20000), 28}, // 24 + the sibling's own 4
	} {
		d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: tc.tokens})
		if err != nil {
			t.Fatal(err)
		}
		if d.QueuedTokens != tc.ahead*16 {
			t.Errorf("request %d: %d tokens queued ahead, want %d blocks' %d", i, d.QueuedTokens, tc.ahead, tc.ahead*16)
		}
	}
	if q := queued(); q != 78 {
		t.Errorf("fluid queue %v blocks, want 24 + 4 + 50", q)
	}
}
