package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"github.com/kvroute/kvroute/pkg/bench"
	"github.com/kvroute/kvroute/pkg/policy"
)

// grid is a set of simulation cases and how they group into table cells:
// one cell per (fleet, workload, utilization), one row per policy, one case
// per seed.
type grid struct {
	cases []bench.Case
	cells []gridCell
	start time.Time
	done  int
}

type gridCell struct {
	replicas int
	workload string
	// util is the -util target, 0 when the rate came from -rate.
	util     float64
	requests int
	names    []string
	// policies[i] are the case indices of names[i], one per seed in order.
	policies [][]int
}

// workloadNames expands -workload: "all" is the bar's workloads, the trace
// and every generator but reasoning, which is judged on its own sweep and
// runs only when named (at the bar's utilizations its decodes would need
// hundreds of times the sessions, see bench.BarGenerators).
func (f *simFlags) workloadNames() []string {
	if f.workloads == "all" {
		return append([]string{"trace"}, bench.BarGenerators()...)
	}
	return splitList(f.workloads)
}

// workloadCache builds each (workload, seed, rate, size) once, from its
// rate-1 build; the trace, which has no seed and is not resized, is read
// once, or once a seed's window with -trace-windows.
type workloadCache struct {
	sf    *simFlags
	built map[string]*bench.Workload
}

func (c *workloadCache) get(name string, seed uint64, rate float64) (*bench.Workload, error) {
	return c.getSized(name, seed, rate, c.sf.size)
}

var sizingTrace = os.Getenv("KVBENCH_SIZING_TRACE") != ""

// sized returns the generator workload name at utilization u on fleet
// (Workload.AtUtil) with as many sessions as make their starts span
// duration: it starts from the size-1 workload's start span scaled to u,
// then corrects the size by duration over the span the calibrated workload
// actually has (closed-loop sessions need slower starts than their start
// rate alone says, see Workload.OfferedUtil) until it is within 10%. The
// trace is not resized, only calibrated.
func (c *workloadCache) sized(name string, seed uint64, u float64, fleet bench.FleetConfig, duration time.Duration) (*bench.Workload, error) {
	if name == "trace" {
		w, err := c.get(name, seed, 1)
		if err != nil {
			return nil, err
		}
		return w.AtUtil(u, fleet)
	}
	base, err := c.getSized(name, seed, 1, 1)
	if err != nil {
		return nil, err
	}
	o := base.Offered()
	util := base.OfferedUtil(fleet)
	if !(util > 0) || o.Span <= 0 {
		return nil, fmt.Errorf("workload %s has no offered rate to scale", name)
	}
	size := duration.Seconds() / (o.Span.Seconds() * util / u)
	var best *bench.Workload
	bestOff := math.Inf(1)
	short, long := 0.0, 0.0 // sizes known to give a span below and above duration
	for range 10 {
		w, err := c.getSized(name, seed, 1, size)
		if err != nil {
			return nil, err
		}
		if w.Offered().Span <= 0 {
			// A tiny size may leave a single start time (no rate to
			// scale): grow it until the workload has two.
			size *= 2
			continue
		}
		s, err := w.AtUtil(u, fleet)
		if err != nil {
			return nil, err
		}
		if got := s.OfferedUtil(fleet); got < u*0.99 {
			// Too few sessions to load the fleet at any start rate.
			if sizingTrace {
				fmt.Fprintf(os.Stderr, "sized %s u=%v size=%v: reaches %v\n", name, u, size, got)
			}
			size *= 2
			continue
		}
		span := s.Offered().Span
		off := math.Abs(span.Seconds()/duration.Seconds() - 1)
		if sizingTrace {
			fmt.Fprintf(os.Stderr, "sized %s u=%v size=%v: span %v\n", name, u, size, span)
		}
		if off < bestOff {
			best, bestOff = s, off
		}
		if off <= 0.1 {
			break
		}
		if span < duration {
			short = size
		} else {
			long = size
		}
		if short > 0 && long > 0 {
			// Bracketed: bisect (the span is not smooth in the size for
			// lumpy workloads such as mixed's long documents).
			size = math.Sqrt(short * long)
		} else {
			// At most ×4 a round.
			size *= min(4, max(0.25, duration.Seconds()/span.Seconds()))
		}
	}
	if best == nil {
		return nil, fmt.Errorf("workload %s: no size gives two session start times", name)
	}
	return best, nil
}

func (c *workloadCache) getSized(name string, seed uint64, rate, size float64) (*bench.Workload, error) {
	if name == "trace" {
		size = 1 // the trace is not resized
		if !c.sf.traceWindowed() {
			seed = 0 // one trace for every seed
		}
	}
	key := fmt.Sprintf("%s/%d/%v/%v", name, seed, rate, size)
	if w, ok := c.built[key]; ok {
		return w, nil
	}
	var w *bench.Workload
	var err error
	switch {
	case rate != 1:
		if w, err = c.getSized(name, seed, 1, size); err != nil {
			return nil, err
		}
		w = w.ScaleRate(rate)
	case name == "trace":
		if w, err = c.sf.readTrace(1, seed); err != nil {
			return nil, err
		}
	default:
		if w, err = bench.Generate(name, bench.GenOptions{Seed: seed, SizeScale: size}); err != nil {
			return nil, fmt.Errorf("%w: %w", errUsage, err)
		}
	}
	c.built[key] = w
	return w, nil
}

// buildGrid lays out every (fleet, workload, util, policy, seed) case. With
// no utils the workloads run at -rate. With a duration (and utils), each
// generator's size is set so that its session starts span duration at the
// case's utilization (see workloadCache.sized). keepFirst keeps the first
// seed's runs (for figures). namesAt, when not nil, returns the policies to
// run at a utilization (a subset of names; nil for all of them).
func buildGrid(sf *simFlags, workloads []string, seeds []uint64, utils []float64, duration time.Duration, fleets []bench.FleetConfig,
	names []string, pcfg policy.Config, keepFirst bool, namesAt func(u float64) []string) (*grid, error) {
	wc := &workloadCache{sf: sf, built: map[string]*bench.Workload{}}
	g := &grid{start: time.Now()}
	levels := utils
	if len(levels) == 0 {
		levels = []float64{0}
	}
	for _, fleet := range fleets {
		for _, wname := range workloads {
			for _, u := range levels {
				names := names
				if namesAt != nil {
					if sub := namesAt(u); sub != nil {
						names = sub
					}
				}
				cell := gridCell{replicas: fleet.Replicas, workload: wname, util: u, names: names, policies: make([][]int, len(names))}
				for si, seed := range seeds {
					var w *bench.Workload
					var err error
					switch {
					case duration > 0 && u > 0:
						w, err = wc.sized(wname, seed, u, fleet, duration)
					case u > 0:
						if w, err = wc.get(wname, seed, sf.rate); err == nil {
							w, err = w.AtUtil(u, fleet)
						}
					default:
						w, err = wc.get(wname, seed, sf.rate)
					}
					if err != nil {
						return nil, err
					}
					if si == 0 {
						cell.requests = w.Requests()
					}
					f := fleet
					f.Seed = seed
					for pi, n := range names {
						cell.policies[pi] = append(cell.policies[pi], len(g.cases))
						g.cases = append(g.cases, bench.Case{Workload: w, Policy: n, Config: pcfg, Fleet: f, KeepRun: keepFirst && si == 0})
					}
				}
				g.cells = append(g.cells, cell)
			}
		}
	}
	return g, nil
}

// run runs every case of the grid under gf's parallelism and CPU profile,
// printing a line per finished case on w unless quiet.
func (g *grid) run(ctx context.Context, gf *gridFlags, quiet bool, w io.Writer) ([]bench.CaseResult, error) {
	progress := func(int, bench.CaseResult) {}
	if !quiet {
		progress = g.progress(w)
	}
	stop, err := gf.profile()
	if err != nil {
		return nil, err
	}
	defer stop()
	return bench.RunCases(ctx, g.cases, gf.parallel, progress)
}

// progress returns a RunCases progress callback that prints one line per
// finished case.
func (g *grid) progress(w io.Writer) func(int, bench.CaseResult) {
	return func(i int, r bench.CaseResult) {
		g.done++
		c := g.cases[i]
		s := r.Summary
		var b strings.Builder
		fmt.Fprintf(&b, "[%d/%d %.0fs] %s/%s r%d seed %d util %.2f (run %.2f): ttft mean %.3fs p99 %.3fs hit %.3f/%.3f cv %.3f preempt %d",
			g.done, len(g.cases), time.Since(g.start).Seconds(), s.Workload, s.Policy, c.Fleet.Replicas, c.Fleet.Seed,
			s.OfferedUtil, s.RunUtil, s.TTFTMean, s.TTFTP99, s.HitRate, s.Ceiling, s.LoadCV, s.Preemptions)
		fmt.Fprintln(w, b.String())
	}
}
