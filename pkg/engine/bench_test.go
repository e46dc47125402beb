package engine

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// BenchmarkSimulate measures the discrete-event cost of the model: 1000
// requests (1024-token prompts over 8 shared 512-token prefixes, 64 output
// tokens) arriving 20 ms apart, stepped until idle.
func BenchmarkSimulate(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	prefixes := make([][]uint32, 8)
	for i := range prefixes {
		prefixes[i] = prompt(512, uint64(i))
	}
	reqs := make([]Request, 1000)
	for i := range reqs {
		p := append(append([]uint32(nil), prefixes[rng.IntN(8)]...), prompt(512, uint64(100+i))...)
		reqs[i] = Request{Prompt: p, MaxTokens: 64}
	}
	var steps int64
	for b.Loop() {
		e, _ := New(Config{NumGPUBlocks: 8192, NumCPUBlocks: 4096}, 1)
		next := 0
		for {
			at, busy := e.NextEventTime()
			arrival := time.Duration(next) * 20 * time.Millisecond
			if next < len(reqs) && (!busy || arrival <= at) {
				_, _ = e.Submit(arrival, reqs[next])
				next++
				continue
			}
			if !busy {
				break
			}
			e.Step(at)
		}
		steps = e.Stats().Steps
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "ns/request")
	b.ReportMetric(float64(steps), "steps")
}

// Example of a discrete-event driver: arrivals interleaved with steps, all
// in simulated time.
func ExampleEngine_Step() {
	e, _ := New(Config{BlockSize: 16, MaxNumSeqs: 4}, 1)
	shared := make([]uint32, 64)
	for i := range 3 {
		p := append(append([]uint32(nil), shared...), uint32(1000+i))
		_, _ = e.Submit(time.Duration(i)*time.Second, Request{Prompt: p, MaxTokens: 4})
		for {
			at, busy := e.NextEventTime()
			if !busy {
				break
			}
			for _, f := range e.Step(at).Finished {
				fmt.Printf("request %d: cached %d of %d prompt tokens, %d tokens out\n",
					f.ID, f.CachedTokens, f.PromptTokens, f.OutputTokens)
			}
		}
	}
	// Output:
	// request 1: cached 0 of 65 prompt tokens, 4 tokens out
	// request 2: cached 64 of 65 prompt tokens, 4 tokens out
	// request 3: cached 64 of 65 prompt tokens, 4 tokens out
}
