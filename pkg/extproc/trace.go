package extproc

import (
	"cmp"
	"math"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/pkg/route"
)

// maxCostEvents bounds the candidates listed in a decision span's event.
const maxCostEvents = 16

// annotate records a decision on its span: policy, pick, prompt and match
// sizes, timings, degradation, and the best candidates' costs as one event.
func annotate(span trace.Span, dec route.Decision, elapsed time.Duration) {
	if !span.IsRecording() {
		return
	}
	best := 0
	for _, c := range dec.Candidates {
		best = max(best, c.Matched[0]+c.Matched[1]+c.Matched[2])
	}
	span.SetAttributes(
		attribute.String("kvroute.policy", dec.Policy),
		attribute.String("kvroute.reason", dec.Reason),
		attribute.String("kvroute.replica", string(dec.Replica)),
		attribute.String("kvroute.endpoint", dec.Address),
		attribute.Int("kvroute.prompt_tokens", dec.PromptTokens),
		attribute.Int("kvroute.prompt_blocks", dec.PromptBlocks),
		attribute.Int("kvroute.matched_blocks.best", best),
		attribute.Int("kvroute.matched_blocks.chosen", dec.MatchedBlocks()),
		attribute.Int("kvroute.vouched_blocks.chosen", dec.VouchedBlocks()),
		attribute.String("kvroute.tokenize.source", dec.TokenSource),
		attribute.Float64("kvroute.tokenize.ms", float64(dec.TokenizeTime)/float64(time.Millisecond)),
		attribute.Float64("kvroute.decide.ms", float64(dec.DecideTime)/float64(time.Millisecond)),
		attribute.Float64("kvroute.decide.wall_ms", float64(elapsed)/float64(time.Millisecond)),
		attribute.String("kvroute.fallback_reason", dec.Degraded),
		attribute.Int("kvroute.candidates", len(dec.Candidates)),
		attribute.StringSlice("kvroute.fallbacks", dec.Fallbacks),
	)
	if len(dec.Candidates) > 0 {
		span.AddEvent("candidate_costs", trace.WithAttributes(costAttributes(dec.Candidates)...))
	}
}

// costAttributes lists up to maxCostEvents candidates, eligible ones first,
// cheapest first (NaN costs last), as parallel arrays.
func costAttributes(cands []route.Candidate) []attribute.KeyValue {
	sorted := slices.Clone(cands)
	slices.SortStableFunc(sorted, func(a, b route.Candidate) int {
		if a.Eligible != b.Eligible {
			if a.Eligible {
				return -1
			}
			return 1
		}
		an, bn := math.IsNaN(a.Cost), math.IsNaN(b.Cost)
		switch {
		case an && bn:
			return strings.Compare(string(a.Replica), string(b.Replica))
		case an:
			return 1
		case bn:
			return -1
		}
		if c := cmp.Compare(a.Cost, b.Cost); c != 0 {
			return c
		}
		return strings.Compare(string(a.Replica), string(b.Replica))
	})
	sorted = sorted[:min(len(sorted), maxCostEvents)]
	var (
		ids     = make([]string, len(sorted))
		costs   = make([]float64, len(sorted))
		matched = make([]int64, len(sorted))
		elig    = make([]bool, len(sorted))
	)
	for i, c := range sorted {
		ids[i], costs[i], elig[i] = string(c.Replica), c.Cost, c.Eligible
		matched[i] = int64(c.Matched[0] + c.Matched[1] + c.Matched[2])
	}
	return []attribute.KeyValue{
		attribute.StringSlice("replica", ids),
		attribute.Float64Slice("cost", costs),
		attribute.Int64Slice("matched_blocks", matched),
		attribute.BoolSlice("eligible", elig),
		attribute.Int("total", len(cands)),
	}
}

// subsetList reads the subset hint value: a list of "ip:port" strings, or
// one comma-separated string. Blank entries are dropped; the result is
// never nil.
func subsetList(v *structpb.Value) []string {
	out := []string{}
	add := func(s string) {
		for _, part := range strings.Split(s, ",") {
			if part = strings.TrimSpace(part); part != "" {
				out = append(out, part)
			}
		}
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_ListValue:
		for _, e := range k.ListValue.GetValues() {
			add(e.GetStringValue())
		}
	case *structpb.Value_StringValue:
		add(k.StringValue)
	}
	return out
}
