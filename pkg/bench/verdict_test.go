package bench

import (
	"errors"
	"testing"
)

func agg(name string, mean, p99, hit float64) Aggregate {
	return Aggregate{Policy: name, TTFTMean: Spread{Median: mean}, TTFTP99: Spread{Median: p99}, HitOverCeiling: Spread{Median: hit}}
}

func TestJudge(t *testing.T) {
	cr := DefaultCriteria()
	res := []Aggregate{agg("rr", 1.0, 5.0, 0.5), agg("a", 0.50, 3.0, 0.99), agg("def", 0.504, 2.9, 0.95)}
	tests := []struct {
		name    string
		util    float64
		results []Aggregate
		pass    bool
		checks  int
		failing string
	}{
		// Mean within 1 % of the best other (0.504 vs 0.50), p99 lowest,
		// hit 0.95 >= 0.9.
		{"tie counts", 0.5, res, true, 3, ""},
		// At 0.95 no hit check.
		{"no hit check above 0.8", 0.95, res, true, 2, ""},
		{"mean lost", 0.8, []Aggregate{agg("rr", 1, 5, 0.5), agg("a", 0.49, 3, 0.99), agg("def", 0.5, 2.9, 0.95)}, false, 3, "mean"},
		{"hit below 0.9", 0.8, []Aggregate{agg("rr", 1, 5, 0.5), agg("def", 0.5, 2.9, 0.85)}, false, 3, "hit/ceiling"},
		// At 1.1 only round robin counts: 4 % worse on the mean is fine,
		// 6 % on the p99 is not.
		{"overload within 5%", 1.1, []Aggregate{agg("rr", 1, 5, 0.5), agg("a", 0.1, 0.2, 1), agg("def", 1.04, 5.2, 0.1)}, true, 2, ""},
		{"overload p99 too high", 1.1, []Aggregate{agg("rr", 1, 5, 0.5), agg("def", 1.0, 5.3, 0.1)}, false, 2, "p99 vs rr"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := Judge(tt.util, tt.results, "def", "rr", cr)
			if err != nil {
				t.Fatal(err)
			}
			if v.Pass != tt.pass || len(v.Checks) != tt.checks {
				t.Fatalf("verdict %+v, want pass %v with %d checks", v, tt.pass, tt.checks)
			}
			for _, c := range v.Checks {
				if !c.Pass && c.Name != tt.failing {
					t.Errorf("check %s failed, want only %q", c, tt.failing)
				}
			}
		})
	}
	if _, err := Judge(0.5, res, "nope", "rr", cr); !errors.Is(err, ErrSim) {
		t.Errorf("missing default: %v", err)
	}
	if _, err := Judge(1.1, res, "def", "nope", cr); !errors.Is(err, ErrSim) {
		t.Errorf("missing baseline: %v", err)
	}
}
