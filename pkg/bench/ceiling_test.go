package bench

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/policy"
)

// The ceiling is what a perfect router could have served on the run's
// timing: identical prompts sent at once (fanout siblings admitted in one
// engine step) cannot hit each other, so their ceiling is 0; a copy sent
// after they were computed can hit all of its full blocks but the last
// token's.
func TestCeilingFollowsEngineTiming(t *testing.T) {
	prompt := []Segment{{ID: 42, Len: 1000}}
	turn := func() []Turn { return []Turn{{Append: prompt, Output: 4}} }
	w := &Workload{Name: "siblings", Sessions: []Session{
		{ID: "a", Start: 0, Turns: turn()},
		{ID: "b", Start: 0, Turns: turn()},
		{ID: "c", Start: 0, Turns: turn()},
		{ID: "later", Start: 5 * time.Second, Turns: turn()},
	}}
	for _, name := range []string{policy.NameRoundRobin, policy.NameSession, policy.NamePureAffinity} {
		r, err := Simulate(context.Background(), w, mustPolicy(t, name), smallFleet())
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range r.Requests {
			want := 0
			if q.Session == 3 {
				want = (1000 - 1) / 16 * 16
			}
			if q.CeilingTokens != want {
				t.Errorf("%s: session %d ceiling %d tokens, want %d", name, q.Session, q.CeilingTokens, want)
			}
			if q.CachedTokens > q.CeilingTokens {
				t.Errorf("%s: session %d cached %d above its ceiling %d", name, q.Session, q.CachedTokens, q.CeilingTokens)
			}
		}
	}
}

// No request is ever served more from cache than its ceiling, whatever the
// policy and workload (closed-loop histories, fanout siblings, shared
// system prompts, preemption and recomputation included).
func TestCeilingBoundsEveryRequest(t *testing.T) {
	for _, gen := range []string{GenFanout, GenAgentic, GenHerding, GenRL} {
		w := mustGen(t, gen, 0.05)
		positive := 0
		for _, name := range []string{policy.NameRoundRobin, policy.NameSession, policy.NameKVRoute} {
			r, err := Simulate(context.Background(), w, mustPolicy(t, name), smallFleet())
			if err != nil {
				t.Fatal(err)
			}
			for _, q := range r.Requests {
				if q.CachedTokens > q.CeilingTokens {
					t.Fatalf("%s/%s: session %d turn %d cached %d above its ceiling %d", gen, name, q.Session, q.Turn, q.CachedTokens, q.CeilingTokens)
				}
				if q.CeilingTokens > 0 {
					positive++
				}
			}
		}
		// Session affinity queues fanout siblings on one replica, where
		// the later ones are admitted after the first was computed.
		if positive == 0 {
			t.Errorf("%s: no request of any policy has a ceiling above 0", gen)
		}
	}
}
