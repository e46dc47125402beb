package bench

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/kvroute/kvroute/pkg/engine"
	"github.com/kvroute/kvroute/pkg/policy"
)

// Case is one simulation of a comparison: a workload, a policy built fresh
// from its name and config, and a fleet.
type Case struct {
	Workload *Workload
	Policy   string
	Config   policy.Config
	Fleet    FleetConfig
	// KeepRun keeps the whole Run in the result (figures need it);
	// otherwise only its summary is kept, which bounds the memory of a
	// large grid.
	KeepRun bool
}

// CaseResult is one Case's outcome.
type CaseResult struct {
	Summary Summary
	// Run is set when the case asked for it (Case.KeepRun).
	Run *Run
}

// RunCases simulates every case on at most workers goroutines (0 or less:
// runtime.GOMAXPROCS(0)) and returns the results in case order. Each case
// runs alone on one goroutine with a policy of its own, and a simulation
// depends only on its inputs, so the results are the same whatever the
// number of workers or the scheduling. Workloads may be shared between
// cases: Simulate only reads them. The first error cancels the cases not
// yet finished and is returned (wrapped with the case's policy and
// workload). progress, when not nil, is called once per finished case, in
// completion order, never concurrently. Every goroutine started here has
// returned when RunCases returns.
func RunCases(ctx context.Context, cases []Case, workers int, progress func(i int, r CaseResult)) ([]CaseResult, error) {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	out := make([]CaseResult, len(cases))
	preps := newPrepCache(cases)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(workers)
	var mu sync.Mutex
	for _, i := range longestFirst(cases) {
		c := &cases[i]
		g.Go(func() error {
			if err := gctx.Err(); err != nil {
				return err
			}
			p, err := policy.New(c.Policy, c.Config)
			if err != nil {
				return err
			}
			pre, release := preps.get(c)
			var r *Run
			// Labelled, a CPU profile of a grid shows each case's share.
			pprof.Do(gctx, pprof.Labels("policy", c.Policy, "workload", c.Workload.Name), func(ctx context.Context) {
				r, err = simulate(ctx, c.Workload, p, c.Fleet, pre)
			})
			release()
			if err != nil {
				return fmt.Errorf("%s on %s: %w", c.Policy, c.Workload.Name, err)
			}
			res := CaseResult{Summary: Summarize(r)}
			res.Summary.OfferedUtil = c.Workload.OfferedUtil(c.Fleet)
			if c.KeepRun {
				res.Run = r
			}
			out[i] = res
			if progress != nil {
				mu.Lock()
				progress(i, res)
				mu.Unlock()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return out, nil
}

// longestFirst returns the cases' indices, the costliest simulation first:
// with the long ones started early, the last to finish is a short one, so
// workers do not sit idle while one long case runs alone at the end. The
// cost estimate is the workload's prompt and output tokens (a simulation's
// work grows with its blocks) and, among one workload's cases, the
// policy's relative cost (policyCost). A workload's cases stay together
// (they share its preparation, which is freed when the last of them
// ends); equal estimates keep their order.
func longestFirst(cases []Case) []int {
	cost := map[*Workload]int64{}
	first := map[*Workload]int{}
	order := make([]int, len(cases))
	for i := range cases {
		order[i] = i
		w := cases[i].Workload
		if _, ok := first[w]; ok || w == nil {
			continue
		}
		first[w] = i
		var n int64
		for j := range w.Sessions {
			ss := &w.Sessions[j]
			for k, l := range ss.PromptLens() {
				n += int64(l + ss.Turns[k].Output)
			}
		}
		cost[w] = n
	}
	slices.SortStableFunc(order, func(a, b int) int {
		wa, wb := cases[a].Workload, cases[b].Workload
		if c := cmp.Compare(cost[wb], cost[wa]); c != 0 {
			return c
		}
		if c := cmp.Compare(first[wa], first[wb]); c != 0 {
			return c
		}
		return cmp.Compare(policyCost(cases[b].Policy), policyCost(cases[a].Policy))
	})
	return order
}

// policyCost is a policy's simulation cost relative to round robin's on
// one workload: CPU seconds per policy in a labelled profile of the
// 12,000-request trace (kvbench sim -repeat 3 -cpuprofile, pprof -tags;
// docs/benchmarks.md). A policy that follows the cache makes the engines
// compute, evict and report fewer blocks, which is most of a simulation's
// work. Only the order of cases depends on it (longestFirst), never a
// result; an unlisted policy counts as round robin.
func policyCost(name string) float64 {
	switch name {
	case policy.NameLeastLoad:
		return 0.9
	case policy.NameKVRoute, policy.NameSession:
		return 0.7
	case policy.NameBlended:
		return 0.63
	case policy.NameHardSwitch, policy.NamePureAffinity:
		return 0.54
	case policy.NamePrefixAffinity, policy.NameWeighted:
		return 0.48
	}
	return 1
}

// prepCache shares each workload's prepared relevance between the cases
// that simulate it on the same engines (the policies and seeds of a grid
// cell): the first case to need it computes it, the others wait for it,
// and the last to finish drops it, so a grid holds only the workloads
// being simulated.
type prepCache struct {
	mu sync.Mutex
	m  map[prepKey]*prepEntry
}

type prepKey struct {
	w   *Workload
	eng engine.Config
}

type prepEntry struct {
	once  sync.Once
	pre   *prepared
	users int
}

func newPrepCache(cases []Case) *prepCache {
	pc := &prepCache{m: map[prepKey]*prepEntry{}}
	for i := range cases {
		if k, ok := prepKeyOf(&cases[i]); ok {
			e := pc.m[k]
			if e == nil {
				e = &prepEntry{}
				pc.m[k] = e
			}
			e.users++
		}
	}
	return pc
}

func prepKeyOf(c *Case) (prepKey, bool) {
	if !filterIrrelevant {
		return prepKey{}, false
	}
	f, err := c.Fleet.withDefaults()
	if err != nil {
		return prepKey{}, false // Simulate reports it
	}
	return prepKey{w: c.Workload, eng: f.Engine}, true
}

// get returns c's prepared relevance (nil: simulate prepares its own) and
// the function to call when c no longer needs it.
func (pc *prepCache) get(c *Case) (*prepared, func()) {
	k, ok := prepKeyOf(c)
	if !ok {
		return nil, func() {}
	}
	pc.mu.Lock()
	e := pc.m[k]
	pc.mu.Unlock()
	e.once.Do(func() {
		// An error leaves pre nil: simulate then prepares again and
		// reports it.
		e.pre, _ = prepare(c.Workload, k.eng)
	})
	pre := e.pre
	return pre, func() {
		pc.mu.Lock()
		defer pc.mu.Unlock()
		if e.users--; e.users == 0 {
			if e.pre != nil {
				e.pre.blocks.free() // every user has copied it and finished
			}
			e.pre = nil
			delete(pc.m, k)
		}
	}
}

// Spread is a figure over seeds: its median (the mean of the two middle
// values for an even count), minimum and maximum.
type Spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// SpreadOf returns the spread of xs (zero for none). NaNs are ignored.
func SpreadOf(xs []float64) Spread {
	s := slices.DeleteFunc(slices.Clone(xs), math.IsNaN)
	if len(s) == 0 {
		return Spread{}
	}
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return Spread{Median: med, Min: s[0], Max: s[n-1]}
}

// Aggregate is one policy on one workload over several seeds: the median
// and range of each headline figure, and every seed's summary. Comparisons
// between policies use the medians.
type Aggregate struct {
	Policy   string   `json:"policy"`
	Workload string   `json:"workload"`
	Seeds    []uint64 `json:"seeds"`

	TTFTMean       Spread `json:"ttft_mean_s"`
	TTFTP50        Spread `json:"ttft_p50_s"`
	TTFTP90        Spread `json:"ttft_p90_s"`
	TTFTP99        Spread `json:"ttft_p99_s"`
	E2EP99         Spread `json:"e2e_p99_s"`
	Throughput     Spread `json:"throughput_tok_s"`
	HitRate        Spread `json:"hit_rate"`
	Ceiling        Spread `json:"ceiling"`
	HitOverCeiling Spread `json:"hit_over_ceiling"`
	LoadCV         Spread `json:"load_cv"`
	Preemptions    Spread `json:"preemptions"`
	Makespan       Spread `json:"makespan_s"`
	QueueFactor    Spread `json:"queue_factor"`
	OfferedUtil    Spread `json:"offered_util"`
	RunUtil        Spread `json:"run_util"`

	PerSeed []Summary `json:"per_seed"`
}

// AggregateSeeds combines one policy's summaries of one workload under
// several seeds (seeds[i] produced ss[i]).
func AggregateSeeds(seeds []uint64, ss []Summary) Aggregate {
	a := Aggregate{Seeds: slices.Clone(seeds), PerSeed: slices.Clone(ss)}
	if len(ss) > 0 {
		a.Policy, a.Workload = ss[0].Policy, ss[0].Workload
	}
	f := func(get func(Summary) float64) Spread {
		xs := make([]float64, len(ss))
		for i, s := range ss {
			xs[i] = get(s)
		}
		return SpreadOf(xs)
	}
	a.TTFTMean = f(func(s Summary) float64 { return s.TTFTMean })
	a.TTFTP50 = f(func(s Summary) float64 { return s.TTFTP50 })
	a.TTFTP90 = f(func(s Summary) float64 { return s.TTFTP90 })
	a.TTFTP99 = f(func(s Summary) float64 { return s.TTFTP99 })
	a.E2EP99 = f(func(s Summary) float64 { return s.E2EP99 })
	a.Throughput = f(func(s Summary) float64 { return s.Throughput })
	a.HitRate = f(func(s Summary) float64 { return s.HitRate })
	a.Ceiling = f(func(s Summary) float64 { return s.Ceiling })
	a.HitOverCeiling = f(func(s Summary) float64 { return s.HitOverCeiling })
	a.LoadCV = f(func(s Summary) float64 { return s.LoadCV })
	a.Preemptions = f(func(s Summary) float64 { return float64(s.Preemptions) })
	a.Makespan = f(func(s Summary) float64 { return s.Makespan })
	a.QueueFactor = f(func(s Summary) float64 { return s.QueueFactor })
	a.OfferedUtil = f(func(s Summary) float64 { return s.OfferedUtil })
	a.RunUtil = f(func(s Summary) float64 { return s.RunUtil })
	return a
}

// ParseSeeds reads a seed list: comma-separated seeds and inclusive ranges,
// e.g. "1-5" or "1,3,7-9". Seeds are kept in the order given; a repeated
// seed or an empty or reversed range is an error.
func ParseSeeds(s string) ([]uint64, error) {
	var out []uint64
	seen := map[uint64]bool{}
	for _, part := range splitComma(s) {
		lo, hi := part, part
		if a, b, ok := cutRange(part); ok {
			lo, hi = a, b
		}
		a, err1 := parseUint(lo)
		b, err2 := parseUint(hi)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%w: seeds %q: %q is not a seed or a range a-b", ErrSim, s, part)
		}
		if b < a || b-a > 1<<16 {
			return nil, fmt.Errorf("%w: seeds %q: range %q is reversed or too long", ErrSim, s, part)
		}
		for x := a; ; x++ {
			if seen[x] {
				return nil, fmt.Errorf("%w: seeds %q: seed %d repeats", ErrSim, s, x)
			}
			seen[x] = true
			out = append(out, x)
			if x == b {
				break
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: seeds %q: none given", ErrSim, s)
	}
	return out, nil
}

func splitComma(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func cutRange(s string) (lo, hi string, ok bool) {
	lo, hi, ok = strings.Cut(s, "-")
	return strings.TrimSpace(lo), strings.TrimSpace(hi), ok
}

func parseUint(s string) (uint64, error) { return strconv.ParseUint(s, 10, 64) }
