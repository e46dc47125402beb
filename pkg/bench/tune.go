package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/kvroute/kvroute/pkg/policy"
)

// Knob is one tunable parameter of a policy and the grid it is searched on.
type Knob struct {
	Name   string
	Values []float64
	// Set writes v into cfg.
	Set func(cfg *policy.Config, v float64)
}

// Knobs returns the tunable knobs of the named policy (nil when it has
// none), with grids around their defaults.
func Knobs(name string) []Knob {
	f := policy.Float
	switch name {
	case policy.NameKVRoute:
		return []Knob{
			{"move_weight", []float64{0, 0.25, 0.5, 1, 2}, func(c *policy.Config, v float64) { c.KVRoute.MoveWeight = f(v) }},
			{"move_pressure_max", []float64{1, 2, 4, 8, 12, 16}, func(c *policy.Config, v float64) { c.KVRoute.MovePressureMax = f(v) }},
			{"move_fill", []float64{0, 0.5, 1, 2}, func(c *policy.Config, v float64) { c.KVRoute.MoveFill = f(v) }},
			{"memory_weight", []float64{0, 1, 2, 4}, func(c *policy.Config, v float64) { c.KVRoute.MemoryWeight = f(v) }},
			{"memory_wait", []float64{0, 0.5, 1}, func(c *policy.Config, v float64) { c.KVRoute.MemoryWait = f(v) }},
			{"memory_reserve", []float64{0, 0.05, 0.1, 0.2}, func(c *policy.Config, v float64) { c.KVRoute.MemoryReserve = f(v) }},
			{"backlog_weight", []float64{0.25, 0.5, 0.75, 1, 1.5}, func(c *policy.Config, v float64) { c.KVRoute.BacklogWeight = f(v) }},
			{"decode_weight", []float64{0, 0.01, 0.02, 0.05, 0.1, 0.2}, func(c *policy.Config, v float64) { c.KVRoute.DecodeWeight = f(v) }},
			{"request_weight", []float64{0, 1, 2, 4, 8, 16, 32}, func(c *policy.Config, v float64) { c.KVRoute.RequestWeight = f(v) }},
			{"running_weight", []float64{0, 0.01, 0.02, 0.05, 0.1, 1}, func(c *policy.Config, v float64) { c.KVRoute.RunningWeight = f(v) }},
			{"spread_util", []float64{0, 0.5, 2.0 / 3, 0.8, 0.9}, func(c *policy.Config, v float64) { c.KVRoute.SpreadUtil = f(v) }},
			{"load_bound", []float64{0, 1.1, 1.25, 1.5, 2, 3}, func(c *policy.Config, v float64) { c.KVRoute.LoadBound = f(v) }},
			{"load_bound_min", []float64{1, 2, 3, 4, 5, 6}, func(c *policy.Config, v float64) { c.KVRoute.LoadBoundMin = f(v) }},
			{"prefix_share_bound", []float64{0, 1.1, 1.25, 1.5, 2}, func(c *policy.Config, v float64) { c.KVRoute.PrefixShareBound = f(v) }},
			{"future_weight", []float64{0, 0.5, 1, 2, 4}, func(c *policy.Config, v float64) { c.KVRoute.FutureWeight = f(v) }},
			{"step_tokens", []float64{2048, 4096, 8192, 16384}, func(c *policy.Config, v float64) { c.KVRoute.StepTokens = f(v) }},
		}
	case policy.NameBlended:
		return []Knob{
			{"overlap_score_credit", []float64{0, 0.5, 1, 1.5, 2}, func(c *policy.Config, v float64) { c.Blended.OverlapScoreCredit = f(v) }},
			{"overlap_score_credit_decay", []float64{0, 0.5, 1, 2, 4}, func(c *policy.Config, v float64) { c.Blended.OverlapScoreCreditDecay = v }},
			{"prefill_load_scale", []float64{0.5, 1, 2, 4, 8}, func(c *policy.Config, v float64) { c.Blended.PrefillLoadScale = f(v) }},
			{"decode_active_request_weight", []float64{0, 1, 4, 16}, func(c *policy.Config, v float64) { c.Blended.DecodeActiveRequestWeight = v }},
		}
	case policy.NameHardSwitch:
		return []Knob{
			{"cache_threshold", []float64{0.1, 0.2, 0.3, 0.5, 0.7}, func(c *policy.Config, v float64) { c.HardSwitch.CacheThreshold = f(v) }},
			{"balance_abs_threshold", []float64{2, 8, 32, 64, 128}, func(c *policy.Config, v float64) { c.HardSwitch.BalanceAbsThreshold = f(v) }},
			{"balance_rel_threshold", []float64{1.1, 1.25, 1.5, 2, 4}, func(c *policy.Config, v float64) { c.HardSwitch.BalanceRelThreshold = f(v) }},
		}
	case policy.NamePrefixAffinity:
		return []Knob{
			{"imbalanced_threshold", []float64{2, 5, 10, 20, math.Inf(1)}, func(c *policy.Config, v float64) { c.PrefixAffinity.ImbalancedThreshold = f(v) }},
			{"match_rate_threshold", []float64{0.05, 0.1, 0.2, 0.4}, func(c *policy.Config, v float64) { c.PrefixAffinity.MatchRateThreshold = f(v) }},
		}
	case policy.NameWeighted:
		return []Knob{
			{"prefix_weight", []float64{1, 2, 3, 5, 8}, func(c *policy.Config, v float64) { c.Weighted.PrefixWeight = f(v) }},
			{"queue_weight", []float64{0, 1, 2, 4}, func(c *policy.Config, v float64) { c.Weighted.QueueWeight = f(v) }},
			{"kv_utilization_weight", []float64{0, 1, 2, 4}, func(c *policy.Config, v float64) { c.Weighted.KVUtilizationWeight = f(v) }},
		}
	case policy.NameSession:
		return []Knob{
			{"bounded_load_factor", []float64{0, 1.1, 1.25, 1.5, 2}, func(c *policy.Config, v float64) { c.Session.BoundedLoadFactor = v }},
		}
	}
	return nil
}

// Objectives lists the objectives Tune minimises.
func Objectives() []string {
	return []string{"ttft_p99", "ttft_mean", "ttft_p90", "e2e_p99", "makespan"}
}

// Objective returns the named figure of s (lower is better).
func Objective(name string, s Summary) (float64, error) {
	switch name {
	case "ttft_p99":
		return s.TTFTP99, nil
	case "ttft_mean":
		return s.TTFTMean, nil
	case "ttft_p90":
		return s.TTFTP90, nil
	case "e2e_p99":
		return s.E2EP99, nil
	case "makespan":
		return s.Makespan, nil
	}
	return 0, fmt.Errorf("%w: objective %q: unknown (want one of %s)", ErrSim, name, strings.Join(Objectives(), ", "))
}

// TuneResult is a coordinate search's outcome.
type TuneResult struct {
	Policy    string             `json:"policy"`
	Workload  string             `json:"workload"`
	Objective string             `json:"objective"`
	Default   float64            `json:"default"`
	Best      float64            `json:"best"`
	Setting   map[string]float64 `json:"setting"`
	// Sensitivity per knob at the best setting: the objective over the
	// knob's grid with every other knob at its best value.
	Sensitivity []KnobSensitivity `json:"sensitivity"`
	Evaluations int               `json:"evaluations"`
}

// KnobSensitivity is one knob's sweep at the best setting.
type KnobSensitivity struct {
	Knob   string    `json:"knob"`
	Values []float64 `json:"values"`
	Scores []float64 `json:"scores"`
	// Spread is (worst - best) / best over the sweep.
	Spread float64 `json:"spread"`
}

// Tune searches the named policy's knobs on w by coordinate descent over
// each knob's grid (rounds passes at most, stopping early when a pass
// changes nothing), minimising the objective. It is deterministic: every
// evaluation is a fresh Simulate with the same fleet. Ties keep the
// earlier (default-side) value. progress, when not nil, sees every
// evaluation.
func Tune(ctx context.Context, w *Workload, name, objective string, fleet FleetConfig, rounds int, progress func(setting map[string]float64, score float64)) (*TuneResult, error) {
	knobs := Knobs(name)
	if len(knobs) == 0 {
		return nil, fmt.Errorf("%w: policy %q has no tunable knobs", ErrSim, name)
	}
	if _, err := Objective(objective, Summary{}); err != nil {
		return nil, err
	}
	res := &TuneResult{Policy: name, Workload: w.Name, Objective: objective, Setting: map[string]float64{}}
	cache := map[string]float64{}
	keyOf := func(set map[string]float64) string {
		var b strings.Builder
		for _, k := range knobs {
			if v, ok := set[k.Name]; ok {
				fmt.Fprintf(&b, "%s=%v;", k.Name, v)
			}
		}
		return b.String()
	}
	eval := func(set map[string]float64) (float64, error) {
		key := keyOf(set)
		if v, ok := cache[key]; ok {
			return v, nil
		}
		var cfg policy.Config
		for _, k := range knobs {
			if v, ok := set[k.Name]; ok {
				k.Set(&cfg, v)
			}
		}
		p, err := policy.New(name, cfg)
		if err != nil {
			return 0, err
		}
		r, err := Simulate(ctx, w, p, fleet)
		if err != nil {
			return 0, err
		}
		v, _ := Objective(objective, Summarize(r))
		cache[key] = v
		res.Evaluations++
		if progress != nil {
			progress(set, v)
		}
		return v, nil
	}
	best, err := eval(res.Setting)
	if err != nil {
		return nil, err
	}
	res.Default = best
	for range max(rounds, 1) {
		changed := false
		for _, k := range knobs {
			for _, v := range k.Values {
				try := clone(res.Setting)
				try[k.Name] = v
				s, err := eval(try)
				if err != nil {
					return nil, err
				}
				if s < best && !near(s, best) {
					best, res.Setting, changed = s, try, true
				}
			}
		}
		if !changed {
			break
		}
	}
	res.Best = best
	for _, k := range knobs {
		ks := KnobSensitivity{Knob: k.Name, Values: k.Values}
		for _, v := range k.Values {
			try := clone(res.Setting)
			try[k.Name] = v
			s, err := eval(try)
			if err != nil {
				return nil, err
			}
			ks.Scores = append(ks.Scores, s)
		}
		if best > 0 {
			ks.Spread = (slices.Max(ks.Scores) - best) / best
		}
		res.Sensitivity = append(res.Sensitivity, ks)
	}
	return res, nil
}

func clone(m map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }
