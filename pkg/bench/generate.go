package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"time"
)

// Generator names, as accepted by Generate.
const (
	GenChat    = "chat"
	GenAgentic = "agentic"
	GenRL      = "rl"
	GenHerding = "herding"
	GenFanout  = "fanout"
)

// Generators lists the synthetic workloads Generate builds.
func Generators() []string { return []string{GenChat, GenAgentic, GenRL, GenHerding, GenFanout} }

// GenOptions parameterise a generator. The zero value is each generator's
// documented default shape.
type GenOptions struct {
	// Seed drives every random choice: the same seed gives the same
	// workload.
	Seed uint64
	// RateScale multiplies arrival rates (session starts); 0 means 1.
	RateScale float64
	// SizeScale multiplies the number of sessions (rounded, at least 1);
	// 0 means 1. Tests use small values.
	SizeScale float64
}

// ErrGenerator classifies unknown generator names and bad options.
var ErrGenerator = fmt.Errorf("generator")

// Generate builds the named synthetic workload:
//
//   - chat: multi-turn chat sessions. 400 sessions starting as a Poisson
//     process at 2/s; each picks one of 4 shared system prompts (1–3K
//     tokens), runs 2–12 turns of a 32–512-token user message and a
//     64–512-token answer, with exponential think times (mean 8 s, at most
//     60 s) between turns; every turn resends the whole history.
//   - agentic: agent loops. 60 sessions at 0.3/s over one shared 6K-token
//     harness prompt (tool specs); 10–20 turns, each appending a long tool
//     output (512–8192 tokens) and generating 64–512 tokens, with 0.2–3 s
//     of tool time between turns.
//   - rl: asynchronous multi-turn RL rollouts after Anyscale's experiment:
//     16 steps of 8 rollouts, a step starting every 45 s (about 16 rollouts
//     in flight); the 8 rollouts of a step share a 2K-token task prompt;
//     each runs 10 turns generating 1K tokens, with a 128–512-token
//     environment observation and 0.5–2 s between turns; two stragglers
//     per step generate 8K tokens in their final turn.
//   - herding: the herding bait. 1500 single requests at 20/s, every one
//     a shared 2K-token system prompt followed by a unique 1–6K-token body,
//     generating 64–320 tokens.
//   - fanout: 150 groups at 2/s of 8 siblings sent at once with the same
//     unique 1–6K-token prompt (n samples), each generating 128–512 tokens.
func Generate(name string, opt GenOptions) (*Workload, error) {
	rs, ss := opt.RateScale, opt.SizeScale
	if rs == 0 {
		rs = 1
	}
	if ss == 0 {
		ss = 1
	}
	if !(rs > 0) || math.IsInf(rs, 0) || !(ss > 0) || math.IsInf(ss, 0) {
		return nil, fmt.Errorf("%w: rate scale %v and size scale %v must be positive numbers", ErrGenerator, rs, ss)
	}
	g := &gen{
		rng: rand.New(rand.NewPCG(opt.Seed, 0x6b76726f75746521)),
		rs:  rs,
		ss:  ss,
	}
	w := &Workload{Name: name}
	switch name {
	case GenChat:
		g.chat(w)
	case GenAgentic:
		g.agentic(w)
	case GenRL:
		g.rl(w)
	case GenHerding:
		g.herding(w)
	case GenFanout:
		g.fanout(w)
	default:
		return nil, fmt.Errorf("%w: %q: unknown (want one of %v)", ErrGenerator, name, Generators())
	}
	return w, nil
}

type gen struct {
	rng    *rand.Rand
	rs, ss float64
}

func (g *gen) n(base int) int { return max(1, int(math.Round(float64(base)*g.ss))) }

// seg returns a fresh segment of n tokens.
func (g *gen) seg(n int) Segment { return Segment{ID: g.rng.Uint64(), Len: n} }

func (g *gen) uniform(lo, hi int) int { return lo + g.rng.IntN(hi-lo+1) }

func (g *gen) secs(lo, hi float64) time.Duration {
	return time.Duration((lo + g.rng.Float64()*(hi-lo)) * float64(time.Second))
}

// poisson returns the next arrival after t for a process of rate per
// second (scaled by the rate scale).
func (g *gen) poisson(t time.Duration, rate float64) time.Duration {
	return t + time.Duration(g.rng.ExpFloat64()/(rate*g.rs)*float64(time.Second))
}

func key(prefix string, i int) string { return prefix + strconv.Itoa(i) }

func (g *gen) chat(w *Workload) {
	sys := make([]Segment, 4)
	for i := range sys {
		sys[i] = g.seg(g.uniform(1024, 3072))
	}
	t := time.Duration(0)
	for i := range g.n(400) {
		t = g.poisson(t, 2)
		s := Session{Start: t}
		s.identify(key("chat-", i))
		turns := g.uniform(2, 12)
		for k := range turns {
			tu := Turn{Append: []Segment{g.seg(g.uniform(32, 512))}, Output: g.uniform(64, 512)}
			if k == 0 {
				tu.Append = append([]Segment{sys[g.rng.IntN(len(sys))]}, tu.Append...)
			} else {
				tu.Gap = time.Duration(math.Min(60, g.rng.ExpFloat64()*8) * float64(time.Second))
			}
			s.Turns = append(s.Turns, tu)
		}
		w.Sessions = append(w.Sessions, s)
	}
}

func (g *gen) agentic(w *Workload) {
	harness := g.seg(6144)
	t := time.Duration(0)
	for i := range g.n(60) {
		t = g.poisson(t, 0.3)
		s := Session{Start: t}
		s.identify(key("agent-", i))
		turns := g.uniform(10, 20)
		for k := range turns {
			tu := Turn{Output: g.uniform(64, 512)}
			if k == 0 {
				tu.Append = []Segment{harness, g.seg(g.uniform(256, 1024))}
			} else {
				tu.Append = []Segment{g.seg(g.uniform(512, 8192))}
				tu.Gap = g.secs(0.2, 3)
			}
			s.Turns = append(s.Turns, tu)
		}
		w.Sessions = append(w.Sessions, s)
	}
}

func (g *gen) rl(w *Workload) {
	steps := g.n(16)
	every := time.Duration(45 / g.rs * float64(time.Second))
	for st := range steps {
		task := g.seg(2048)
		stragglers := map[int]bool{}
		for len(stragglers) < 2 {
			stragglers[g.rng.IntN(8)] = true
		}
		for r := range 8 {
			s := Session{Start: time.Duration(st) * every}
			s.identify(fmt.Sprintf("rl-%d-%d", st, r))
			for k := range 10 {
				tu := Turn{Output: 1024}
				if k == 0 {
					tu.Append = []Segment{task}
				} else {
					tu.Append = []Segment{g.seg(g.uniform(128, 512))}
					tu.Gap = g.secs(0.5, 2)
				}
				if k == 9 && stragglers[r] {
					tu.Output = 8192
				}
				s.Turns = append(s.Turns, tu)
			}
			w.Sessions = append(w.Sessions, s)
		}
	}
}

func (g *gen) herding(w *Workload) {
	sys := g.seg(2048)
	t := time.Duration(0)
	for i := range g.n(1500) {
		t = g.poisson(t, 20)
		s := Session{Start: t, Turns: []Turn{{
			Append: []Segment{sys, g.seg(g.uniform(1024, 6144))},
			Output: g.uniform(64, 320),
		}}}
		s.identify(key("herd-", i))
		w.Sessions = append(w.Sessions, s)
	}
}

func (g *gen) fanout(w *Workload) {
	t := time.Duration(0)
	for i := range g.n(150) {
		t = g.poisson(t, 2)
		p := g.seg(g.uniform(1024, 6144))
		for range 8 {
			s := Session{Start: t, Turns: []Turn{{
				Append: []Segment{p},
				Output: g.uniform(128, 512),
			}}}
			s.identify(key("fan-", i))
			w.Sessions = append(w.Sessions, s)
		}
	}
}
