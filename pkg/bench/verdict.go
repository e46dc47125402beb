package bench

import (
	"fmt"
	"math"
)

// Criteria are issue 17's "Done when" bars for the default policy in one
// (fleet, workload, utilization) case, judged on medians over seeds.
type Criteria struct {
	// Tie is the relative margin within which the default's mean or p99
	// TTFT counts as lowest (0.01: within 1 % of the best other policy).
	Tie float64
	// JudgedUtil is the highest utilization at which the default must have
	// the lowest mean and p99 (0.95); above it, the overload bar applies.
	JudgedUtil float64
	// HitUtil is the highest utilization at which the default's hit rate
	// must reach HitFloor of the ceiling (0.8 and 0.9).
	HitUtil, HitFloor float64
	// Overload is how much worse than the baseline the default may be on
	// mean and p99 above JudgedUtil (0.05).
	Overload float64
}

// DefaultCriteria are the numbers.
func DefaultCriteria() Criteria {
	return Criteria{Tie: 0.01, JudgedUtil: 0.95, HitUtil: 0.8, HitFloor: 0.9, Overload: 0.05}
}

// Verdict is the judgement of one case.
type Verdict struct {
	Pass bool `json:"pass"`
	// Checks lists each bar applied and whether it held.
	Checks []Check `json:"checks"`
}

// Check is one bar: the default's figure against the reference (the best
// other policy, the baseline, or a constant) and the bound it had to meet.
type Check struct {
	Name string `json:"name"`
	Pass bool   `json:"pass"`
	// Value is the default's median; Ref the reference figure (the best
	// other policy's median, the baseline's, or the floor) and RefPolicy
	// who holds it; Bound the limit Value had to meet.
	Value     float64 `json:"value"`
	Ref       float64 `json:"ref"`
	RefPolicy string  `json:"ref_policy,omitempty"`
	Bound     float64 `json:"bound"`
}

func (c Check) String() string {
	state := "ok"
	if !c.Pass {
		state = "FAIL"
	}
	if c.RefPolicy == "" {
		return fmt.Sprintf("%s %s %.3f (floor %.3f)", c.Name, state, c.Value, c.Bound)
	}
	return fmt.Sprintf("%s %s %.3f vs %s %.3f (%+.1f%%)", c.Name, state, c.Value, c.RefPolicy, c.Ref, 100*(c.Value/c.Ref-1))
}

// Judge applies cr to one case: results are every policy's aggregate at
// utilization util (the -util target), def names the default policy and
// baseline the overload reference (round robin). A policy missing from
// results is an error.
func Judge(util float64, results []Aggregate, def, baseline string, cr Criteria) (Verdict, error) {
	find := func(name string) (Aggregate, bool) {
		for _, a := range results {
			if a.Policy == name {
				return a, true
			}
		}
		return Aggregate{}, false
	}
	d, ok := find(def)
	if !ok {
		return Verdict{}, fmt.Errorf("%w: default policy %q not among the results", ErrSim, def)
	}
	var v Verdict
	add := func(c Check) { v.Checks = append(v.Checks, c) }
	if util <= cr.JudgedUtil {
		for _, m := range []struct {
			name string
			get  func(Aggregate) float64
		}{
			{"mean", func(a Aggregate) float64 { return a.TTFTMean.Median }},
			{"p99", func(a Aggregate) float64 { return a.TTFTP99.Median }},
		} {
			best, who := math.Inf(1), ""
			for _, a := range results {
				if a.Policy != def && m.get(a) < best {
					best, who = m.get(a), a.Policy
				}
			}
			if who == "" {
				continue
			}
			bound := best * (1 + cr.Tie)
			add(Check{Name: m.name, Pass: m.get(d) <= bound, Value: m.get(d), Ref: best, RefPolicy: who, Bound: bound})
		}
		if util <= cr.HitUtil {
			h := d.HitOverCeiling.Median
			add(Check{Name: "hit/ceiling", Pass: h >= cr.HitFloor, Value: h, Ref: cr.HitFloor, Bound: cr.HitFloor})
		}
	} else {
		b, ok := find(baseline)
		if !ok {
			return Verdict{}, fmt.Errorf("%w: baseline policy %q not among the results", ErrSim, baseline)
		}
		for _, m := range []struct {
			name   string
			dv, bv float64
		}{
			{"mean vs " + baseline, d.TTFTMean.Median, b.TTFTMean.Median},
			{"p99 vs " + baseline, d.TTFTP99.Median, b.TTFTP99.Median},
		} {
			bound := m.bv * (1 + cr.Overload)
			add(Check{Name: m.name, Pass: m.dv <= bound, Value: m.dv, Ref: m.bv, RefPolicy: baseline, Bound: bound})
		}
	}
	v.Pass = true
	for _, c := range v.Checks {
		v.Pass = v.Pass && c.Pass
	}
	return v, nil
}
