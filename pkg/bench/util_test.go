package bench

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"
)

func TestOfferedAndAtUtil(t *testing.T) {
	// Two sessions starting 10 s apart (span 2 × 10 s), prompts 100, then
	// 100 + 20 output + 30; and one single-turn trace request of 500.
	w := &Workload{Name: "x", Sessions: []Session{
		{Start: 0, Turns: []Turn{{Append: []Segment{{1, 100}}, Output: 20}, {Append: []Segment{{2, 30}}, Output: 5, Gap: time.Second}}},
		{Start: 10 * time.Second, Turns: []Turn{{TraceIDs: []int64{1}, TraceLen: 500, Output: 7}}},
	}}
	if got := w.Sessions[0].PromptLens(); !slices.Equal(got, []int{100, 150}) {
		t.Fatalf("prompt lens %v", got)
	}
	o := w.Offered()
	if o.Requests != 3 || o.PromptTokens != 750 || o.Span != 20*time.Second || o.TokensPerSec != 37.5 {
		t.Fatalf("offered %+v", o)
	}
	fleet := FleetConfig{Replicas: 2}
	fleet.Engine = DefaultEngine()
	fleet.Engine.PrefillTokensPerSec = 100
	if c := fleet.PrefillCapacity(); c != 200 {
		t.Fatalf("capacity %v", c)
	}
	if u := w.OfferedUtil(fleet); u != 37.5/200 {
		t.Fatalf("util %v", u)
	}
	for _, target := range []float64{0.5, 0.95, 1.1} {
		s, err := w.AtUtil(target, fleet)
		if err != nil {
			t.Fatal(err)
		}
		if u := s.OfferedUtil(fleet); math.Abs(u-target) > 1e-6 {
			t.Errorf("AtUtil(%v) gives %v", target, u)
		}
		// Think times stay; the original is untouched.
		if s.Sessions[0].Turns[1].Gap != time.Second || w.Sessions[1].Start != 10*time.Second {
			t.Errorf("AtUtil changed think times or the original")
		}
	}
	if _, err := w.AtUtil(0, fleet); !errors.Is(err, ErrSim) {
		t.Errorf("util 0: %v", err)
	}
	one := &Workload{Sessions: w.Sessions[:1]}
	if _, err := one.AtUtil(0.5, fleet); !errors.Is(err, ErrSim) {
		t.Errorf("one start time: %v", err)
	}
}

// Every generator can be set to a utilization: its offered load scales
// with the target.
func TestGeneratorsAtUtil(t *testing.T) {
	fleet := smallFleet()
	for _, name := range Generators() {
		w, err := Generate(name, GenOptions{Seed: 1, SizeScale: 0.1})
		if err != nil {
			t.Fatal(err)
		}
		lo, err := w.AtUtil(0.3, fleet)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		hi, err := w.AtUtil(0.9, fleet)
		if err != nil {
			t.Fatal(err)
		}
		if r := hi.Offered().TokensPerSec / lo.Offered().TokensPerSec; math.Abs(r-3) > 1e-6 {
			t.Errorf("%s: 0.9 vs 0.3 offered ratio %v", name, r)
		}
	}
}
