package bench

import (
	"context"
	"errors"
	"math"
	"reflect"
	"slices"
	"testing"

	"go.uber.org/goleak"

	"github.com/kvroute/kvroute/pkg/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The same cases give the same results on one worker and on several, in
// case order, whatever finishes first.
func TestRunCasesParallelMatchesSequential(t *testing.T) {
	var cases []Case
	for _, seed := range []uint64{1, 2} {
		w, err := Generate(GenChat, GenOptions{Seed: seed, SizeScale: 0.02})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{policy.NameRoundRobin, policy.NameKVRoute, policy.NameSession} {
			f := smallFleet()
			f.Seed = seed
			cases = append(cases, Case{Workload: w, Policy: p, Fleet: f})
		}
	}
	seq, err := RunCases(context.Background(), cases, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	var order []int
	par, err := RunCases(context.Background(), cases, 4, func(i int, r CaseResult) {
		order = append(order, i)
		if r.Run != nil {
			t.Errorf("case %d kept its run without KeepRun", i)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(seq, par) {
		t.Fatal("parallel results differ from sequential ones")
	}
	slices.Sort(order)
	if len(order) != len(cases) || order[0] != 0 || order[len(order)-1] != len(cases)-1 {
		t.Fatalf("progress saw %v", order)
	}
	for i, r := range seq {
		if r.Summary.Policy != cases[i].Policy || r.Summary.Requests != cases[i].Workload.Requests() {
			t.Fatalf("case %d: result %s with %d requests, want %s with %d", i, r.Summary.Policy, r.Summary.Requests, cases[i].Policy, cases[i].Workload.Requests())
		}
		if !(r.Summary.OfferedUtil > 0) || r.Summary.QueueFactor < 1 {
			t.Fatalf("case %d: offered util %v, queue factor %v", i, r.Summary.OfferedUtil, r.Summary.QueueFactor)
		}
	}
}

// RunCases shares each workload's prepared relevance between its cases
// (two engine configurations here: two preparations of one workload) and
// drops it after the last; every run is the one Simulate gives alone, with
// a preparation of its own.
func TestRunCasesSharedPreparation(t *testing.T) {
	w, err := Generate(GenAgents, GenOptions{Seed: 3, SizeScale: 0.05})
	if err != nil {
		t.Fatal(err)
	}
	small, big := smallFleet(), smallFleet()
	big.Engine.BlockSize = 32
	var cases []Case
	for _, f := range []FleetConfig{small, big} {
		for _, p := range []string{policy.NameRoundRobin, policy.NameKVRoute, policy.NameSession} {
			cases = append(cases, Case{Workload: w, Policy: p, Fleet: f, KeepRun: true})
		}
	}
	got, err := RunCases(context.Background(), cases, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cases {
		alone, err := Simulate(context.Background(), w, mustPolicy(t, c.Policy), c.Fleet)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got[i].Run, alone) {
			t.Fatalf("case %d (%s, block size %d): shared preparation changes the run", i, c.Policy, c.Fleet.Engine.BlockSize)
		}
	}
	pc := newPrepCache(cases)
	if len(pc.m) != 2 {
		t.Fatalf("%d preparations for two engine configurations", len(pc.m))
	}
	for i := range cases {
		pre, release := pc.get(&cases[i])
		if pre == nil {
			t.Fatalf("case %d: no preparation", i)
		}
		release()
	}
	if len(pc.m) != 0 {
		t.Fatalf("%d preparations left after every case", len(pc.m))
	}
}

func TestRunCasesErrors(t *testing.T) {
	w := mustGen(t, GenHerding, 0.01)
	_, err := RunCases(context.Background(), []Case{
		{Workload: w, Policy: policy.NameRoundRobin, Fleet: smallFleet()},
		{Workload: w, Policy: "nope", Fleet: smallFleet()},
	}, 2, nil)
	if err == nil {
		t.Fatal("unknown policy: no error")
	}
	bad := smallFleet()
	bad.Replicas = -1
	if _, err := RunCases(context.Background(), []Case{{Workload: w, Policy: policy.NameRandom, Fleet: bad}}, 0, nil); !errors.Is(err, ErrSim) {
		t.Fatalf("bad fleet: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := RunCases(ctx, []Case{{Workload: w, Policy: policy.NameRandom, Fleet: smallFleet()}}, 1, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

func TestSpreadAndAggregate(t *testing.T) {
	if s := SpreadOf([]float64{3, 1, 2, math.NaN(), 10, 4}); s != (Spread{Median: 3, Min: 1, Max: 10}) {
		t.Errorf("odd spread %+v", s)
	}
	if s := SpreadOf([]float64{4, 1, 2, 3}); s != (Spread{Median: 2.5, Min: 1, Max: 4}) {
		t.Errorf("even spread %+v", s)
	}
	if s := SpreadOf(nil); s != (Spread{}) {
		t.Errorf("empty spread %+v", s)
	}
	a := AggregateSeeds([]uint64{1, 2, 3}, []Summary{
		{Policy: "p", Workload: "w", TTFTMean: 1, TTFTP99: 9, Preemptions: 5},
		{Policy: "p", Workload: "w", TTFTMean: 3, TTFTP99: 7, Preemptions: 0},
		{Policy: "p", Workload: "w", TTFTMean: 2, TTFTP99: 8, Preemptions: 1},
	})
	if a.Policy != "p" || a.Workload != "w" || a.TTFTMean != (Spread{2, 1, 3}) || a.TTFTP99 != (Spread{8, 7, 9}) ||
		a.Preemptions != (Spread{1, 0, 5}) || len(a.PerSeed) != 3 || !slices.Equal(a.Seeds, []uint64{1, 2, 3}) {
		t.Fatalf("aggregate %+v", a)
	}
}

func TestParseSeeds(t *testing.T) {
	good := map[string][]uint64{
		"1-5":      {1, 2, 3, 4, 5},
		"7":        {7},
		"1,3, 7-9": {1, 3, 7, 8, 9},
		"4-4":      {4},
	}
	for in, want := range good {
		got, err := ParseSeeds(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%q: %v %v, want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "5-1", "a", "1,1", "1-3,2", "-3", "1-", "1-99999999"} {
		if _, err := ParseSeeds(in); !errors.Is(err, ErrSim) {
			t.Errorf("%q: %v, want ErrSim", in, err)
		}
	}
}

// RunCases starts the costliest cases first (on one worker, progress sees
// them in that order): by workload, then by policy, keeping the order of
// cases of equal cost, and still returns results in case order.
func TestRunCasesLongestFirst(t *testing.T) {
	small, err := Generate(GenChat, GenOptions{Seed: 1, SizeScale: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	big, err := Generate(GenChat, GenOptions{Seed: 1, SizeScale: 0.03})
	if err != nil {
		t.Fatal(err)
	}
	var cases []Case
	for _, w := range []*Workload{small, big, small} {
		for _, p := range []string{policy.NameSession, policy.NameRoundRobin} {
			cases = append(cases, Case{Workload: w, Policy: p, Fleet: smallFleet()})
		}
	}
	// The big workload first, then the small one's four cases together;
	// within a workload round robin (costlier to simulate) before session,
	// equal cases in their order.
	want := []int{3, 2, 1, 5, 0, 4}
	if got := longestFirst(cases); !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	var started []int
	res, err := RunCases(context.Background(), cases, 1, func(i int, _ CaseResult) { started = append(started, i) })
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(started, want) {
		t.Fatalf("one worker ran %v, want %v", started, want)
	}
	for i, r := range res {
		if r.Summary.Policy != cases[i].Policy || r.Summary.Requests != cases[i].Workload.Requests() {
			t.Fatalf("result %d is %s with %d requests, want case %d's", i, r.Summary.Policy, r.Summary.Requests, i)
		}
	}
	if small.Requests() >= big.Requests() {
		t.Fatalf("the bigger workload has %d requests, the smaller %d", big.Requests(), small.Requests())
	}
}
