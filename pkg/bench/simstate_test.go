package bench

import (
	"context"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/policy"
)

// recorder is a policy that remembers the candidates of its last pick.
type recorder struct {
	policy.Policy
	last []policy.Candidate
}

func (r *recorder) Pick(req policy.Request, cands []policy.Candidate, env policy.Env) policy.Result {
	r.last = append(r.last[:0], cands...)
	return r.Policy.Pick(req, cands, env)
}

// The simulated router learns each replica's speeds from its finished
// requests, as a live router does from responses: by the end of a run
// every candidate's Load carries a prefill speed near the engine's and a
// decode step near its decode-only step (8 ms + 0.08 ms a sequence), not
// the fixed defaults.
func TestSimRouterLearnsRates(t *testing.T) {
	rec := &recorder{Policy: mustPolicy(t, policy.NameKVRoute)}
	fleet := smallFleet()
	if _, err := Simulate(context.Background(), mustGen(t, GenAgentic, 0.1), rec, fleet); err != nil {
		t.Fatal(err)
	}
	if len(rec.last) != fleet.Replicas {
		t.Fatalf("last pick saw %d candidates, want %d", len(rec.last), fleet.Replicas)
	}
	learned := 0
	for _, c := range rec.last {
		l := c.Load
		if l.PrefillRate == 0 && l.DecodeStep == 0 {
			continue // a replica that served nothing has nothing learned
		}
		learned++
		if r := fleet.Engine.PrefillTokensPerSec; l.PrefillRate < 0.8*r || l.PrefillRate > 1.25*r {
			t.Errorf("%s: learned prefill %.0f tokens/s, engine runs %.0f", c.Replica, l.PrefillRate, r)
		}
		if l.DecodeStep < fleet.Engine.StepTime || l.DecodeStep > 2*fleet.Engine.StepTime+10*time.Millisecond {
			t.Errorf("%s: learned decode step %v, engine's decode-only step is about %v", c.Replica, l.DecodeStep, fleet.Engine.StepTime)
		}
	}
	if learned < 2 {
		t.Fatalf("only %d replicas have learned rates: %+v", learned, rec.last)
	}
}
