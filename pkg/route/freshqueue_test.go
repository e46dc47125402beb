package route

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/index"
	"github.com/kvroute/kvroute/pkg/policy"
)

// A session's turn whose home was just sent a long document waits for
// all of it, not half: the engine runs the document's chunks, step after
// step, ahead of the turn. The charged backlog (held until each request's
// first token) cannot tell a document sent a moment ago from one nearly
// done; the router's fluid queue can, and kvroute waits on it where it
// says more is queued (mixed at 0.95: agent turns kept home 0.2-0.5 s
// after a 90k-token document waited 5-6 s, where an idle replica would
// have re-prefilled their history in 3-4). The same charge met late, the
// document mostly computed by the fluid estimate, keeps the turn home.
func TestDecideHomeTurnLeavesAFreshDocument(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after time.Duration // from the document's dispatch to the turn
		want  index.ReplicaID
	}{
		{"fresh", 100 * time.Millisecond, "r1"},
		{"late", 800 * time.Millisecond, "r0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policy.New(policy.NameKVRoute, policy.Config{})
			if err != nil {
				t.Fatal(err)
			}
			g := newTrackedRig(t, 2, p)
			rt, ix := g.rt, g.ix
			decide := func(req Request) Decision {
				t.Helper()
				d, err := rt.Decide(t.Context(), req)
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			// The session's first turn (300 blocks of history) goes to
			// r0, which then holds it: r0 is its home.
			history := seq(300*16, 1)
			store(t, ix, "r0", model, history, 16)
			if d := decide(Request{Model: model, Tokens: history, SessionKey: "s"}); d.Replica != "r0" {
				t.Fatalf("first turn went to %s", d.Replica)
			} else {
				d.Hold.Done()
			}
			// A 1,000-block document pinned to r0 (16,000 tokens/s: one
			// second of prefill), charged there until its first token.
			g.now = g.now.Add(time.Second)
			doc := decide(Request{Model: model, Tokens: seq(1000*16, 1<<24), Subset: []string{"10.0.0.0:8000"}})
			if doc.Replica != "r0" {
				t.Fatalf("document went to %s", doc.Replica)
			}
			g.now = g.now.Add(tc.after)
			turn := append(append([]uint32(nil), history...), seq(2*16, 1<<25)...)
			d := decide(Request{Model: model, Tokens: turn, SessionKey: "s"})
			if home := candidate(t, d, "r0"); !home.Home || home.Load.ActivePrefillBlocks != 1000 {
				t.Fatalf("home candidate %+v, want r0 as home with the document's 1,000 blocks charged", home)
			}
			if d.Replica != tc.want {
				t.Errorf("turn %v after the document went to %s (costs r0 %.3f, r1 %.3f), want %s",
					tc.after, d.Replica, d.Candidates[0].Cost, d.Candidates[1].Cost, tc.want)
			}
		})
	}
}
