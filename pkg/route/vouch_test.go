package route

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/kvblock"
	"github.com/kvroute/kvroute/pkg/load"
	"github.com/kvroute/kvroute/pkg/policy"
)

// gapState is a fakeState whose replicas' views may be known to miss
// stores (ViewGaps).
type gapState struct {
	*fakeState
	gaps map[index.ReplicaID]bool
}

func (s *gapState) ViewGaps(id index.ReplicaID) bool { return s.gaps[id] }

// A trajectory's next turn resends the prompt the router sent r0, whose
// stores the index never got. Only once r0's view is known to miss stores
// is r0 credited with that prompt (Vouched), and then it keeps the turn
// although it is the busiest; the credit is withheld for a prompt still in
// flight there (the pending credit's), for a prompt not resent, beyond
// what the index shows; a replica whose view is being relearned (trust 0)
// is credited the whole prompt at the approximate mode's trust.
func TestVouchCreditsSentPromptOnGappedView(t *testing.T) {
	st := &gapState{fakeState: fleet(3), gaps: map[index.ReplicaID]bool{}}
	ix := index.New(index.Config{})
	now := time.Unix(1000, 0)
	p, err := policy.New(policy.NameKVRoute, policy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rt := New(Options{Matcher: ix, State: st, Policy: p, Seed: 1,
		Pending: NewApproxIndex(ApproxConfig{TTL: DefaultPendingTTL}), Now: func() time.Time { return now }})
	cand := func(d Decision, id index.ReplicaID) Candidate {
		t.Helper()
		for _, c := range d.Candidates {
			if c.Replica == id {
				return c
			}
		}
		t.Fatalf("no candidate %s", id)
		return Candidate{}
	}
	explain := func(toks []uint32) Decision {
		t.Helper()
		d, err := rt.Explain(t.Context(), Request{Model: model, Tokens: toks})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}

	turn1 := seq(30*16, 100)
	d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: turn1})
	if err != nil {
		t.Fatal(err)
	}
	if d.Replica != "r0" {
		t.Fatalf("first turn went to %s, want the least loaded r0", d.Replica)
	}
	turn2 := append(append([]uint32(nil), turn1...), seq(4*16, 5000)...)
	st.gaps["r0"] = true

	// Still in flight: the pending credit weighs it, nothing is vouched.
	if c := cand(explain(turn2), "r0"); c.Vouched != 0 || c.Pending != 30 {
		t.Fatalf("in flight: r0 vouched %d pending %d, want 0 and 30", c.Vouched, c.Pending)
	}

	now = now.Add(DefaultPendingTTL + time.Second)
	st.loads["r0"] = load.Load{Healthy: true, ActivePrefillBlocks: 40}
	st.gaps["r0"] = false
	if e := explain(turn2); cand(e, "r0").Vouched != 0 || e.Replica == "r0" {
		t.Fatalf("no gaps: r0 vouched %d, pick %s; want nothing vouched and the turn on a less loaded replica", cand(e, "r0").Vouched, e.Replica)
	}

	st.gaps["r0"] = true
	e := explain(turn2)
	if c := cand(e, "r0"); c.Vouched != 30 || c.Matched != ([index.NumTiers]int{}) {
		t.Fatalf("gaps: r0 vouched %d matched %v, want the 30 blocks sent there and the index's own match (none) apart", c.Vouched, c.Matched)
	}
	if e.Replica != "r0" || e.VouchedBlocks() != 30 {
		t.Fatalf("gaps: pick %s vouched %d, want r0 with its 30 vouched blocks", e.Replica, e.VouchedBlocks())
	}
	if c := cand(e, "r1"); c.Vouched != 0 {
		t.Fatalf("r1 vouched %d: nothing was sent there", c.Vouched)
	}

	// A prompt that does not resend turn 1 (it differs in block 0).
	other := append(seq(16, 9000), turn2[16:]...)
	if c := cand(explain(other), "r0"); c.Vouched != 0 {
		t.Fatalf("other prompt: r0 vouched %d, want 0", c.Vouched)
	}

	// The index showing part of the prompt: only the rest is vouched;
	// showing all of it, nothing.
	store(t, ix, "r0", model, turn1[:12*16], 16)
	if c := cand(explain(turn2), "r0"); c.Vouched != 18 || c.Matched[index.TierGPU] != 12 {
		t.Fatalf("partial index: r0 vouched %d matched %v, want 18 beyond the indexed 12", c.Vouched, c.Matched)
	}
	ix.Cleared("r0")
	store(t, ix, "r0", model, turn1, 16)
	if c := cand(explain(turn2), "r0"); c.Vouched != 0 || c.Matched[index.TierGPU] != 30 {
		t.Fatalf("full index: r0 vouched %d matched %v, want 0 and 30", c.Vouched, c.Matched)
	}

	// A view being relearned (trust 0) counts for nothing, not even the
	// part it still shows: the whole prompt is vouched for, at the
	// approximate mode's trust. Without gaps it stays cold.
	st.trust["r0"] = 0
	e = explain(turn2)
	if c := cand(e, "r0"); c.Vouched != 30 || c.Trust != DefaultApproxTrust || c.Matched[index.TierGPU] != 30 {
		t.Fatalf("resyncing: r0 vouched %d trust %v matched %v, want 30 at trust %v beside the index's 30", c.Vouched, c.Trust, c.Matched, DefaultApproxTrust)
	}
	if e.Replica != "r0" {
		t.Fatalf("resyncing: pick %s, want r0", e.Replica)
	}
	// Sent again (its view now empty): in flight there, it is the pending
	// credit's (which the restored trust lets count), not vouched for.
	ix.Cleared("r0")
	if d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: turn2}); err != nil || d.Replica != "r0" {
		t.Fatalf("resyncing: decided %s, %v; want r0", d.Replica, err)
	}
	if c := cand(explain(turn2), "r0"); c.Vouched != 0 || c.Pending == 0 || c.Trust != DefaultApproxTrust {
		t.Fatalf("resyncing, in flight: r0 vouched %d pending %d trust %v, want 0, >0, %v", c.Vouched, c.Pending, c.Trust, DefaultApproxTrust)
	}
	st.gaps["r0"] = false
	if c := cand(explain(turn2), "r0"); c.Vouched != 0 || c.Trust != 0 {
		t.Fatalf("resyncing, no gaps: r0 vouched %d trust %v, want 0 and 0", c.Vouched, c.Trust)
	}
}

// GRPO siblings send one task prompt to several replicas. A sibling's next
// turn, resending it, is credited with it at every gapped replica it went
// to, not only at the last: each holds it, and naming the last alone would
// draw every sibling's next turn there.
func TestVouchCreditsEverySender(t *testing.T) {
	st := &gapState{fakeState: fleet(3), gaps: map[index.ReplicaID]bool{"r0": true, "r1": true, "r2": true}}
	ix := index.New(index.Config{})
	now := time.Unix(1000, 0)
	p, err := policy.New(policy.NameKVRoute, policy.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rt := New(Options{Matcher: ix, State: st, Policy: p, Seed: 1, Now: func() time.Time { return now }})
	task := seq(20*16, 100)
	for _, id := range []index.ReplicaID{"r0", "r1"} {
		// The other replicas busy: the task goes to the idle one.
		for _, o := range []index.ReplicaID{"r0", "r1", "r2"} {
			st.loads[o] = load.Load{Healthy: true, ActivePrefillBlocks: 200}
		}
		st.loads[id] = load.Load{Healthy: true}
		d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: task})
		if err != nil || d.Replica != id {
			t.Fatalf("task sent to %s (%v), want %s", d.Replica, err, id)
		}
	}
	for _, o := range []index.ReplicaID{"r0", "r1", "r2"} {
		st.loads[o] = load.Load{Healthy: true}
	}
	next := append(append([]uint32(nil), task...), seq(3*16, 7000)...)
	d, err := rt.Explain(t.Context(), Request{Model: model, Tokens: next})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range d.Candidates {
		want := 20
		if c.Replica == "r2" {
			want = 0
		}
		if c.Vouched != want {
			t.Fatalf("%s vouched %d, want %d", c.Replica, c.Vouched, want)
		}
	}
	// r1's view without gaps: only r0 is credited.
	st.gaps["r1"] = false
	if d, err = rt.Explain(t.Context(), Request{Model: model, Tokens: next}); err != nil {
		t.Fatal(err)
	}
	for _, c := range d.Candidates {
		if want := map[index.ReplicaID]int{"r0": 20}[c.Replica]; c.Vouched != want {
			t.Fatalf("r1 without gaps: %s vouched %d, want %d", c.Replica, c.Vouched, want)
		}
	}
}

// Without a State reporting view gaps nothing is vouched for: the prompt
// book is kept (a request without a key finds the conversation it
// continues there), but the index's view stands.
func TestVouchNeedsViewGaps(t *testing.T) {
	rt := newRouter(t, fleet(2), index.New(index.Config{}), nil)
	turn1 := seq(20*16, 100)
	d, err := rt.Decide(t.Context(), Request{Model: model, Tokens: turn1})
	if err != nil {
		t.Fatal(err)
	}
	turn2 := append(append([]uint32(nil), turn1...), seq(3*16, 9000)...)
	e, err := rt.Explain(t.Context(), Request{Model: model, Tokens: turn2})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range e.Candidates {
		if c.Vouched != 0 {
			t.Fatalf("%s vouched %d without ViewGaps (turn 1 went to %s)", c.Replica, c.Vouched, d.Replica)
		}
	}
}

// The prompt book finds the longest recorded prompt a prompt begins with,
// checks a record's length against its position, keeps the last
// bookSenders replicas a prompt went to (most recent first, each once), and
// forgets after two generations.
func TestPromptBook(t *testing.T) {
	sent := func(blocks int, to ...index.ReplicaID) sentPrompt {
		s := sentPrompt{blocks: blocks}
		copy(s.to[:], to)
		return s
	}
	b := newPromptBook(4)
	keys := kvblock.Keys(nil, kvblock.Root(model, ""), seq(6*16, 1), 16, kvblock.Options{})
	b.set(keys[1], "r1", 2, "")
	b.set(keys[3], "r3", 4, "")
	if s, ok := b.longest(keys, 0); !ok || s != sent(4, "r3") {
		t.Fatalf("longest %+v %v, want r3's 4 blocks", s, ok)
	}
	if s, ok := b.longest(keys[:3], 0); !ok || s != sent(2, "r1") {
		t.Fatalf("3 blocks: %+v %v, want r1's 2", s, ok)
	}
	// Two records filled the first generation, now the old one. keys[4]
	// recorded with the wrong length never matches at position 4.
	b.set(keys[4], "r4", 2, "")
	if s, _ := b.longest(keys, 0); s != sent(4, "r3") {
		t.Fatalf("mislabelled record matched: %+v", s)
	}
	b.set(keys[0], "r0", 1, "") // fills the generation again: r1's and r3's records are gone
	b.set(keys[2], "r2", 3, "")
	if s, ok := b.longest(keys, 0); !ok || s != sent(3, "r2") {
		t.Fatalf("after two rotations %+v %v, want r2's 3", s, ok)
	}
	if _, ok := b.longest(keys, 3); ok {
		t.Fatal("r2's 3 blocks found when asked for more than 3")
	}

	// One prompt sent to several replicas: each named once, the latest
	// first, the oldest dropped past bookSenders; another length starts over.
	b = newPromptBook(64)
	for _, id := range []index.ReplicaID{"a", "b", "a", "c", "d", "e"} {
		b.set(keys[2], id, 3, "")
	}
	s, ok := b.longest(keys, 0)
	if !ok || s != sent(3, "e", "d", "c", "a") {
		t.Fatalf("senders %+v %v, want e d c a", s, ok)
	}
	if s.sentTo("b") || !s.sentTo("a") || s.sentTo("") {
		t.Fatalf("sentTo: b %v a %v empty %v", s.sentTo("b"), s.sentTo("a"), s.sentTo(""))
	}
	b.set(keys[2], "f", 2, "") // replaces the senders; mislabelled, it never matches
	if s, ok := b.longest(keys, 0); ok {
		t.Fatalf("a record of another length kept or matched: %+v", s)
	}
	if newPromptBook(0) != nil {
		t.Fatal("a book of size 0")
	}
}
