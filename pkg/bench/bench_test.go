package bench

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/pkg/policy"
)

// BenchmarkSimulate measures the simulator's cost per request: the
// herding workload (300 requests, 2K shared + 1–6K unique prompt tokens)
// through 8 default replicas routed by kvroute.
func BenchmarkSimulate(b *testing.B) {
	w, err := Generate(GenHerding, GenOptions{Seed: 1, SizeScale: 0.2})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		p, _ := policy.New(policy.NameKVRoute, policy.Config{})
		if _, err := Simulate(context.Background(), w, p, FleetConfig{Seed: 1}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/float64(w.Requests()), "µs/request")
}
