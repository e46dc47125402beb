package bench

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/policy"
)

// The ceiling is what a perfect router could have served on the run's
// timing: identical prompts sent at once and placed apart cannot hit each
// other, so their ceiling is 0; placed on one replica they are admitted
// into one engine step, where the first computes the prompt and the
// others find it, so theirs is the prompt's full blocks but the last
// token's, as is that of a copy sent after they were computed.
func TestCeilingFollowsEngineTiming(t *testing.T) {
	prompt := []Segment{{ID: 42, Len: 1000}}
	turn := func() []Turn { return []Turn{{Append: prompt, Output: 4}} }
	w := &Workload{Name: "siblings", Sessions: []Session{
		{ID: "a", Start: 0, Turns: turn()},
		{ID: "b", Start: 0, Turns: turn()},
		{ID: "c", Start: 0, Turns: turn()},
		{ID: "later", Start: 5 * time.Second, Turns: turn()},
	}}
	one := smallFleet()
	one.Replicas = 1
	for _, fc := range []struct {
		name   string
		fleet  FleetConfig
		shared int // the simultaneous copies that find the prompt
	}{
		{policy.NameRoundRobin, smallFleet(), 0},
		{policy.NameRoundRobin, one, 2},
	} {
		name := fc.name
		r, err := Simulate(context.Background(), w, mustPolicy(t, name), fc.fleet)
		if err != nil {
			t.Fatal(err)
		}
		found := 0
		for _, q := range r.Requests {
			want := 0
			if q.Session == 3 {
				want = (1000 - 1) / 16 * 16
			} else if q.CachedTokens > 0 {
				want = (1000 - 1) / 16 * 16
				found++
			}
			if q.CeilingTokens != want {
				t.Errorf("%s: session %d ceiling %d tokens, want %d", name, q.Session, q.CeilingTokens, want)
			}
			if q.CachedTokens > q.CeilingTokens {
				t.Errorf("%s: session %d cached %d above its ceiling %d", name, q.Session, q.CachedTokens, q.CeilingTokens)
			}
		}
		if found != fc.shared {
			t.Errorf("%s on %d replicas: %d simultaneous copies found the prompt, want %d", name, fc.fleet.Replicas, found, fc.shared)
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
