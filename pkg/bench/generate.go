package bench

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
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
	GenAgents  = "agents"
	GenGRPO    = "grpo"
	GenMixed   = "mixed"
	GenGroups  = "groups"
	GenReason  = "reasoning"
)

// Generators lists the synthetic workloads Generate builds.
func Generators() []string {
	return append(BarGenerators(), GenReason)
}

// BarGenerators are the generators of issue 17's bar (kvbench bar's
// default workloads, with the trace): every one but reasoning, which came
// after the bar was set and is judged on its own sweep (its KV memory
// binds at a third of the prefill utilization the bar sweeps).
func BarGenerators() []string {
	return []string{GenChat, GenAgentic, GenRL, GenHerding, GenFanout, GenAgents, GenGRPO, GenMixed, GenGroups}
}

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
//   - agents: coding-agent sessions. Sessions start in bursts (a Poisson
//     process of bursts at 1 per 20 s, each starting 1–6 sessions within
//     2 s of each other), 80 sessions in all. Each session uses one of 3
//     agent harnesses (a shared tool/system prompt of 3–6K tokens) plus a
//     200–2,000-token task, then runs 10–60 turns: every turn generates
//     50–800 tokens (log-uniform) and the next appends a tool output of
//     200–8,000 tokens (log-uniform), after a tool/think time drawn from a
//     bounded Pareto distribution on [1 s, 30 s] (shape 1.2: median about
//     1.8 s, one in ten above 6 s). A session ends early when its next
//     prompt would pass 128K tokens (agents compact or hand off there).
//   - grpo: GRPO-style RL rollouts. 8 training batches (at least 2 at any
//     size), one every 30 s; each releases 4 tasks at once, each task a
//     group of 8–16 samples sharing a 1K-token environment prompt (common
//     to all tasks) and a 500–3,000-token task prompt. A sample is a
//     trajectory of 3–12 steps that resends its whole history: each step
//     generates 200–2,000 tokens and the next appends a tool result of
//     100–1,500 tokens when the tool returns, after a delay drawn from a
//     bounded Pareto distribution on [0.2 s, 60 s] (shape 1.1: median
//     0.38 s, 83 % within a second, a few stragglers take tens of seconds).
//     Meant to be pushed past saturation (-util 1.1).
//   - mixed: the agents shape (20 sessions, bursts every 60 s), short
//     chats (300 sessions of 1–4 turns over 4 shared 500–1,500-token system
//     prompts, 30–500-token messages, 50–400-token answers, 2–20 s think)
//     and one-shot documents (60 single requests of a unique
//     20–100K-token document, 100–500 output tokens), chats and documents
//     starting as Poisson processes over the span of the agents' starts.
//   - groups: shared-prefix groups (the shape of SGLang's
//     generated-shared-prefix benchmark, with a skew): 4000 single
//     requests at 10/s, each one of 128 long prefixes (a system prompt or
//     document of 1–6K tokens, log-uniform) followed by a unique 64–1,024
//     token question, generating 64–512 tokens. Prefixes are picked by
//     Zipf popularity (exponent 1.1): the hottest takes about 23 % of the
//     requests, half the groups under 0.25 % each. A router has to keep
//     each group where it is cached and still spread the hot ones.
//   - reasoning: a reasoning model's chats, decode-bound. 300 sessions
//     starting as a Poisson process at 1/s; each picks one of 4 shared
//     system prompts (500–2,000 tokens, log-uniform) and runs 1–8 turns of
//     a 30–2,000-token user message (log-uniform), with exponential think
//     times (mean 15 s, at most 120 s). A turn generates its thinking
//     (200–12,000 tokens) then its answer (100–1,000), both log-uniform,
//     and the next turn resends the answer only (Turn.Hidden: Qwen3's and
//     DeepSeek-R1's templates drop earlier turns' thinking), so most of
//     what a replica caches for a turn is never asked for again, and the
//     fleet's KV memory fills with decodes at about 0.3 of prefill
//     utilization on the default engine.
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
	case GenAgents:
		g.agents(w, g.n(80), 20)
	case GenGRPO:
		g.grpo(w)
	case GenMixed:
		g.mixed(w)
	case GenGroups:
		g.groups(w)
	case GenReason:
		g.reasoning(w)
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
	g.chatSessions(w, "chat-", g.n(400), 2, sys, func() int { return g.uniform(2, 12) }, func() Turn {
		return Turn{Append: []Segment{g.seg(g.uniform(32, 512))}, Output: g.uniform(64, 512)}
	}, 8, 60)
}

// chatSessions appends n chat sessions keyed prefix and their number,
// starting as a Poisson process at rate per second from 0. A session runs
// turns() turns, each built by turn (its Append the message), the first
// opening with one of sys, the others after an exponential think time of
// mean think seconds, at most maxThink.
func (g *gen) chatSessions(w *Workload, prefix string, n int, rate float64, sys []Segment, turns func() int, turn func() Turn, think, maxThink float64) {
	t := time.Duration(0)
	for i := range n {
		t = g.poisson(t, rate)
		s := Session{Start: t}
		s.identify(key(prefix, i))
		for k := range turns() {
			tu := turn()
			if k == 0 {
				tu.Append = append([]Segment{sys[g.rng.IntN(len(sys))]}, tu.Append...)
			} else {
				tu.Gap = time.Duration(math.Min(maxThink, g.rng.ExpFloat64()*think) * float64(time.Second))
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

// logUniform draws an integer in [lo, hi] whose logarithm is uniform.
func (g *gen) logUniform(lo, hi int) int {
	x := math.Exp(math.Log(float64(lo)) + g.rng.Float64()*(math.Log(float64(hi+1))-math.Log(float64(lo))))
	return min(hi, max(lo, int(x)))
}

// pareto draws seconds from a Pareto distribution of shape alpha bounded
// to [lo, hi] (inverse CDF).
func (g *gen) pareto(lo, hi, alpha float64) time.Duration {
	u := g.rng.Float64()
	x := lo / math.Pow(1-u*(1-math.Pow(lo/hi, alpha)), 1/alpha)
	return time.Duration(min(hi, x) * float64(time.Second))
}

// agentPromptCap ends an agent session before a prompt passes it.
const agentPromptCap = 128 << 10

// agentSessions appends n coding-agent sessions whose bursts start as a
// Poisson process with mean gap burstGap seconds, starting at 0.
func (g *gen) agentSessions(w *Workload, prefix string, n int, burstGap float64) {
	harness := make([]Segment, 3)
	for i := range harness {
		harness[i] = g.seg(g.uniform(3072, 6144))
	}
	t := time.Duration(0)
	for i := 0; i < n; {
		t = g.poisson(t, 1/burstGap)
		for range g.uniform(1, 6) {
			if i >= n {
				break
			}
			s := Session{Start: t + g.secs(0, 2)}
			s.identify(key(prefix, i))
			i++
			h := harness[g.rng.IntN(len(harness))]
			turns := g.uniform(10, 60)
			first := Turn{Append: []Segment{h, g.seg(g.uniform(200, 2000))}, Output: g.logUniform(50, 800)}
			s.Turns = append(s.Turns, first)
			size := h.Len + first.Append[1].Len + first.Output
			for k := 1; k < turns; k++ {
				tu := Turn{
					Append: []Segment{g.seg(g.logUniform(200, 8000))},
					Output: g.logUniform(50, 800),
					Gap:    g.pareto(1, 30, 1.2),
				}
				size += tu.Append[0].Len
				if size > agentPromptCap {
					break
				}
				size += tu.Output
				s.Turns = append(s.Turns, tu)
			}
			w.Sessions = append(w.Sessions, s)
		}
	}
}

func (g *gen) agents(w *Workload, n int, burstGap float64) {
	g.agentSessions(w, "agents-", n, burstGap)
	sortSessions(w)
}

func (g *gen) grpo(w *Workload) {
	env := g.seg(1024)
	every := 30 * time.Second
	id := 0
	for b := range max(2, g.n(8)) {
		at := time.Duration(b) * every
		for range 4 {
			task := g.seg(g.uniform(500, 3000))
			for range g.uniform(8, 16) {
				s := Session{Start: at}
				s.identify(key("grpo-", id))
				id++
				steps := g.uniform(3, 12)
				for k := range steps {
					tu := Turn{Output: g.uniform(200, 2000)}
					if k == 0 {
						tu.Append = []Segment{env, task}
					} else {
						tu.Append = []Segment{g.seg(g.uniform(100, 1500))}
						tu.Gap = g.pareto(0.2, 60, 1.1)
					}
					s.Turns = append(s.Turns, tu)
				}
				w.Sessions = append(w.Sessions, s)
			}
		}
	}
}

func (g *gen) mixed(w *Workload) {
	// The agents' bursts come every 60 s on average; chats and documents
	// start over the span of the agents' starts.
	nAgents := g.n(20)
	g.agentSessions(w, "mixed-agent-", nAgents, 60)
	span := 0.0
	for _, s := range w.Sessions {
		span = max(span, s.Start.Seconds())
	}
	span = max(span, 1)
	sys := make([]Segment, 4)
	for i := range sys {
		sys[i] = g.seg(g.uniform(500, 1500))
	}
	nChats := g.n(300)
	t := time.Duration(0)
	for i := range nChats {
		t = g.poisson(t, float64(nChats)/span)
		s := Session{Start: t}
		s.identify(key("mixed-chat-", i))
		for k := range g.uniform(1, 4) {
			tu := Turn{Append: []Segment{g.seg(g.uniform(30, 500))}, Output: g.uniform(50, 400)}
			if k == 0 {
				tu.Append = append([]Segment{sys[g.rng.IntN(len(sys))]}, tu.Append...)
			} else {
				tu.Gap = g.secs(2, 20)
			}
			s.Turns = append(s.Turns, tu)
		}
		w.Sessions = append(w.Sessions, s)
	}
	nDocs := g.n(60)
	t = 0
	for i := range nDocs {
		t = g.poisson(t, float64(nDocs)/span)
		s := Session{Start: t, Turns: []Turn{{Append: []Segment{g.seg(g.uniform(20000, 100000))}, Output: g.uniform(100, 500)}}}
		s.identify(key("mixed-doc-", i))
		w.Sessions = append(w.Sessions, s)
	}
	sortSessions(w)
}

func (g *gen) groups(w *Workload) {
	const n, exponent = 128, 1.1
	prefixes := make([]Segment, n)
	cum := make([]float64, n) // cumulative Zipf weights by popularity rank
	total := 0.0
	for i := range prefixes {
		prefixes[i] = g.seg(g.logUniform(1024, 6144))
		total += math.Pow(float64(i+1), -exponent)
		cum[i] = total
	}
	t := time.Duration(0)
	for i := range g.n(4000) {
		t = g.poisson(t, 10)
		k, _ := slices.BinarySearch(cum, g.rng.Float64()*total)
		s := Session{Start: t, Turns: []Turn{{
			Append: []Segment{prefixes[min(k, n-1)], g.seg(g.uniform(64, 1024))},
			Output: g.uniform(64, 512),
		}}}
		s.identify(key("group-", i))
		w.Sessions = append(w.Sessions, s)
	}
}

// sortSessions orders sessions by start time (stable: equal starts keep
// their order).
func sortSessions(w *Workload) {
	slices.SortStableFunc(w.Sessions, func(a, b Session) int { return cmp.Compare(a.Start, b.Start) })
}

func (g *gen) reasoning(w *Workload) {
	sys := make([]Segment, 4)
	for i := range sys {
		sys[i] = g.seg(g.logUniform(500, 2000))
	}
	g.chatSessions(w, "reason-", g.n(300), 1, sys, func() int { return g.uniform(1, 8) }, func() Turn {
		think, answer := g.logUniform(200, 12000), g.logUniform(100, 1000)
		return Turn{Append: []Segment{g.seg(g.logUniform(30, 2000))}, Output: think + answer, Hidden: think}
	}, 15, 120)
}
