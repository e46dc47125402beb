package main

import (
	"context"
	"fmt"
	"io"
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

// workloadNames expands -workload.
func (f *simFlags) workloadNames() []string {
	if f.workloads == "all" {
		return append([]string{"trace"}, bench.Generators()...)
	}
	return splitList(f.workloads)
}

// workloadCache builds each (workload, seed) once; the trace, which has no
// seed, is read once.
type workloadCache struct {
	sf    *simFlags
	trace *bench.Workload
	built map[string]*bench.Workload
}

func (c *workloadCache) get(name string, seed uint64, rate float64) (*bench.Workload, error) {
	return c.getSized(name, seed, rate, c.sf.size)
}

// sized returns the generator workload name at utilization u on fleet
// whose session starts span duration: it measures the start span of the
// size-1 workload at that utilization and scales the number of sessions
// (the generator's size) by duration over that span. The trace is not
// resized.
func (c *workloadCache) sized(name string, seed uint64, u float64, fleet bench.FleetConfig, duration time.Duration) (*bench.Workload, error) {
	if name == "trace" {
		return c.get(name, seed, 1)
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
	span := o.Span.Seconds() * util / u // the start span at utilization u
	size := duration.Seconds() / span
	// A tiny size may leave a single start time (no rate to scale): grow
	// it until the workload has two.
	for range 20 {
		w, err := c.getSized(name, seed, 1, size)
		if err != nil || w.Offered().Span > 0 {
			return w, err
		}
		size *= 2
	}
	return nil, fmt.Errorf("workload %s: no size gives two session start times", name)
}

func (c *workloadCache) getSized(name string, seed uint64, rate, size float64) (*bench.Workload, error) {
	key := fmt.Sprintf("%s/%d/%v/%v", name, seed, rate, size)
	if w, ok := c.built[key]; ok {
		return w, nil
	}
	var w *bench.Workload
	if name == "trace" {
		if c.trace == nil {
			path := c.sf.trace
			if path == "" {
				wd, err := os.Getwd()
				if err != nil {
					return nil, err
				}
				root := bench.RepoRoot(wd)
				if root == "" {
					return nil, fmt.Errorf("%w: no repository root above %s: pass -trace", errUsage, wd)
				}
				path = bench.DefaultTracePath(root)
			}
			t, err := bench.ReadTraceFile(path, bench.TraceOptions{Limit: c.sf.limit, Repeat: c.sf.repeat})
			if err != nil {
				return nil, err
			}
			c.trace = t
		}
		w = c.trace
	} else {
		var err error
		w, err = bench.Generate(name, bench.GenOptions{Seed: seed, SizeScale: size})
		if err != nil {
			return nil, fmt.Errorf("%w: %w", errUsage, err)
		}
	}
	if rate != 1 {
		w = w.ScaleRate(rate)
	}
	c.built[key] = w
	return w, nil
}

// buildGrid lays out every (fleet, workload, util, policy, seed) case. With
// no utils the workloads run at -rate. With a duration (and utils), each
// generator's size is set so that its session starts span duration at the
// case's utilization (see workloadCache.sized). keepFirst keeps the first
// seed's runs (for figures).
func buildGrid(sf *simFlags, workloads []string, seeds []uint64, utils []float64, duration time.Duration, fleets []bench.FleetConfig,
	names []string, pcfg policy.Config, keepFirst bool) (*grid, error) {
	wc := &workloadCache{sf: sf, built: map[string]*bench.Workload{}}
	g := &grid{start: time.Now()}
	levels := utils
	if len(levels) == 0 {
		levels = []float64{0}
	}
	for _, fleet := range fleets {
		for _, wname := range workloads {
			for _, u := range levels {
				cell := gridCell{replicas: fleet.Replicas, workload: wname, util: u, names: names, policies: make([][]int, len(names))}
				for si, seed := range seeds {
					var w *bench.Workload
					var err error
					if duration > 0 && u > 0 {
						w, err = wc.sized(wname, seed, u, fleet, duration)
					} else {
						w, err = wc.get(wname, seed, sf.rate)
					}
					if err != nil {
						return nil, err
					}
					if u > 0 {
						if w, err = w.AtUtil(u, fleet); err != nil {
							return nil, err
						}
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
