//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/pkg/testbed"
)

// TestActiveActiveRouters measures two kvroute replicas behind one Envoy
// against a single kvroute, on the same fleet shape (4 simulated engines)
// and the multi-turn workload of TestMultiTurnSessionsStick (its 11
// sessions, prompts and 5 turns), with the sessions started together and
// run side by side so that there is load for the routers to see, repeated
// for several rounds with new prompts. Each router subscribes to every
// engine's events and holds the full index; Envoy spreads the ext_proc
// streams over both with LEAST_REQUEST. Load sent by the other router
// reaches each one only through the engines' scraped metrics.
//
// "Within reach of a single router", as asserted:
//
//	stickiness_aa       >= 0.9 × stickiness_single
//	meanRoundCV_aa      <= meanRoundCV_single + (randomCV − meanRoundCV_single) / 2
//
// stickiness is the share of later turns served by the replica that served
// the session's previous turn. A round's CV is the coefficient of variation
// (standard deviation / mean) of the requests each engine served in that
// round; meanRoundCV is its mean over the rounds. randomCV is the expected
// round CV of placing the round's 11 sessions on the 4 engines uniformly at
// random (computed exactly, randomPlacementCV: 0.48), what routers blind to
// load would give. So the bound says: two routers remove at least half of
// the imbalance that load-blind placement has over one router's.
//
// Why per round and not over the whole run: each round starts on an idle
// fleet with its 11 sessions' first turns together, and one router spreads
// them 3/3/3/2 (round CV 0.157) every round, but which engine gets the 2
// varies, so the whole run's CV of a perfect router still ranges 0.03–0.13
// with 8 rounds; comparing two such sums is comparing noise. Two routers
// each see the other's requests only one scrape later, so sessions that
// start together on different routers can land on the same engine: with
// each router balancing its own share the round CVs are 0.157 or 0.30
// (mean 0.19–0.23 simulated; 0.24 measured on a loaded machine, where a
// late start sometimes gives a round 0.4–0.7, the mean of 24 rounds below
// 0.31 in 99.9 % of resamples), while load-blind placement's 24-round mean
// stays above 0.39 in 99 % of simulated runs. Both routers must have made decisions
// (kvroute_decisions_total), together one per request, and each must have
// turned ready because its index was warm (every engine replayed), not
// because the warm timeout passed.
func TestActiveActiveRouters(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	single := runRounds(t, c.chat, "single", addrs(c.engines))
	// Free the cores for the second run.
	c.g.Kill()

	aa := newActiveActive(t, 2)
	aaStats := runRounds(t, aa.front.chat, "aa", addrs(aa.engines))
	var perRouter []float64
	for _, r := range aa.routers {
		n, err := decisions(r)
		if err != nil {
			t.Fatal(err)
		}
		perRouter = append(perRouter, n)
	}

	random := randomPlacementCV(sessions, len(aa.engines))
	t.Logf("single router: stickiness %.3f (%d/%d), mean round CV %.3f, load CV %.3f, requests per replica %v",
		single.stickiness(), single.stuck, single.later, single.meanCV(), single.cv(), single.counts())
	t.Logf("active-active: stickiness %.3f (%d/%d), mean round CV %.3f, load CV %.3f, requests per replica %v; decisions per router %v; random placement's round CV %.3f",
		aaStats.stickiness(), aaStats.stuck, aaStats.later, aaStats.meanCV(), aaStats.cv(), aaStats.counts(), perRouter, random)
	for i, n := range perRouter {
		if n == 0 {
			t.Errorf("router %d made no decision: Envoy did not spread the streams", i)
		}
	}
	if total := perRouter[0] + perRouter[1]; total < float64(aaStats.requests) {
		t.Errorf("the routers made %v decisions for %d requests: some bypassed kvroute", total, aaStats.requests)
	}
	if got, min := aaStats.stickiness(), 0.9*single.stickiness(); got < min {
		t.Errorf("active-active stickiness %.3f < 0.9 × single %.3f", got, single.stickiness())
	}
	if got, max := aaStats.meanCV(), single.meanCV()+(random-single.meanCV())/2; got > max {
		t.Errorf("active-active mean round CV %.3f > %.3f, halfway from the single router's %.3f to random placement's %.3f",
			got, max, single.meanCV(), random)
	}
}

// randomPlacementCV is the expected CV of the sessions per engine when each
// of sessions sessions goes to one of engines engines uniformly at random:
// the exact mean over every outcome, weighted by its multinomial
// probability. Sessions of equal length make it the requests' CV too.
func randomPlacementCV(sessions, engines int) float64 {
	counts := make([]int, engines)
	var sum float64
	// logFact[k] = log k!
	logFact := make([]float64, sessions+1)
	for k := 1; k <= sessions; k++ {
		logFact[k] = logFact[k-1] + math.Log(float64(k))
	}
	var walk func(i, left int)
	walk = func(i, left int) {
		if i == engines-1 {
			counts[i] = left
			lp := logFact[sessions] - float64(sessions)*math.Log(float64(engines))
			c := workloadStats{perReplica: map[string]int{}}
			for j, n := range counts {
				lp -= logFact[n]
				r := strconv.Itoa(j)
				c.replicas = append(c.replicas, r)
				c.perReplica[r] = n
			}
			sum += math.Exp(lp) * c.cv()
			return
		}
		for n := 0; n <= left; n++ {
			counts[i] = n
			walk(i+1, left-n)
		}
	}
	walk(0, sessions)
	return sum
}

// workloadStats summarises one multi-turn run.
type workloadStats struct {
	requests, later, stuck int
	perReplica             map[string]int // requests served, by engine address
	replicas               []string       // every engine, served or not
	roundCVs               []float64      // cv of each round (runRounds)
}

// meanCV is the mean of the rounds' CVs.
func (s workloadStats) meanCV() float64 {
	var sum float64
	for _, v := range s.roundCVs {
		sum += v
	}
	return sum / float64(max(len(s.roundCVs), 1))
}

func (s workloadStats) stickiness() float64 {
	if s.later == 0 {
		return 0
	}
	return float64(s.stuck) / float64(s.later)
}

func (s workloadStats) counts() []int {
	out := make([]int, len(s.replicas))
	for i, r := range s.replicas {
		out[i] = s.perReplica[r]
	}
	return out
}

// cv is the coefficient of variation of requests per engine (population
// standard deviation over the mean), engines that served nothing included.
func (s workloadStats) cv() float64 {
	c := s.counts()
	var sum float64
	for _, n := range c {
		sum += float64(n)
	}
	mean := sum / float64(len(c))
	if mean == 0 {
		return 0
	}
	var ss float64
	for _, n := range c {
		ss += (float64(n) - mean) * (float64(n) - mean)
	}
	return math.Sqrt(ss/float64(len(c))) / mean
}

func addrs(es []*engine) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.addr()
	}
	return out
}

// rounds of the workload per setup, and its sessions and turns (those of
// TestMultiTurnSessionsStick). The asserted mean of the rounds' CVs: one
// round's is 0.157 or 0.30 for two routers balancing their own shares
// (more when a session starts late on a loaded machine), and 24 rounds
// hold the mean's spread well inside the band between that and random
// placement's.
const (
	rounds          = 24
	sessions, turns = 11, 5
)

// runRounds runs the session workload rounds times, one round after the
// other, each with new prompts, and sums the figures.
func runRounds(t *testing.T, chat chatFunc, tag string, replicas []string) workloadStats {
	t.Helper()
	sum := workloadStats{perReplica: map[string]int{}, replicas: replicas}
	for i := range rounds {
		r := runSessions(t, chat, fmt.Sprintf("%s%d", tag, i), replicas)
		t.Logf("%s round %d: stickiness %.3f, CV %.3f, %v", tag, i, r.stickiness(), r.cv(), r.counts())
		sum.roundCVs = append(sum.roundCVs, r.cv())
		sum.requests += r.requests
		sum.later += r.later
		sum.stuck += r.stuck
		for k, v := range r.perReplica {
			sum.perReplica[k] += v
		}
	}
	return sum
}

type chatFunc func(ctx context.Context, msgs []message, maxTokens int, hdr map[string]string) result

// runSessions runs TestMultiTurnSessionsStick's workload, its 11 sessions
// side by side (each one's turns in order), with the session tags prefixed
// by tag so that runs on one fleet never share a prompt.
func runSessions(t *testing.T, chat chatFunc, tag string, replicas []string) workloadStats {
	t.Helper()
	st := workloadStats{perReplica: map[string]int{}, replicas: replicas}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	for s := range sessions {
		wg.Go(func() {
			hist := []message{{Role: "system", Content: prompt(fmt.Sprintf("%s-agent%d", tag, s), 40)}}
			var last string
			for turn := range turns {
				hist = append(hist, message{Role: "user", Content: prompt(fmt.Sprintf("%s-s%d-t%d", tag, s, turn), 25)})
				r := chat(t.Context(), hist, 8, nil)
				if r.err != nil || r.status != 200 {
					errs <- fmt.Errorf("%s session %d turn %d: %d %v %s", tag, s, turn, r.status, r.err, r.body)
					return
				}
				mu.Lock()
				st.requests++
				st.perReplica[r.upstream]++
				if turn > 0 {
					st.later++
					if r.upstream == last {
						st.stuck++
					}
				}
				mu.Unlock()
				last = r.upstream
				hist = append(hist, message{Role: "assistant", Content: r.text})
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return st
}

// activeActive is n kvroute replicas, each subscribed to every engine,
// behind one Envoy whose ext_proc cluster lists them all.
type activeActive struct {
	engines []*engine
	routers []*cluster // one per kvroute: its ports, config and process
	front   *cluster   // Envoy's ports and process
}

func newActiveActive(t *testing.T, n int) *activeActive {
	t.Helper()
	ctx := t.Context()
	g := newGroup(t)
	sock, err := testbed.SocketDir(g)
	if err != nil {
		t.Fatal(err)
	}
	aa := &activeActive{}
	var tes []*testbed.Engine
	for i := range 4 {
		e := &engine{id: i, seed: 100 + i, g: g, Engine: &testbed.Engine{
			Events: fmt.Sprintf("ipc://%s/ev%d", sock, i),
			Replay: fmt.Sprintf("ipc://%s/rp%d", sock, i),
		}}
		aa.engines = append(aa.engines, e)
		tes = append(tes, e.Engine)
	}
	var wg sync.WaitGroup
	for _, e := range aa.engines {
		wg.Go(func() {
			e.Name = fmt.Sprintf("enginesim-%d-seed%d", e.id, e.seed)
			e.Args = engineArgs(e.seed)
			if err := e.Start(ctx, g, bins.EngineSim); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	// Both start together: each replays every engine and turns ready warm.
	extprocPorts := make([]int, n)
	for i := range n {
		k := &testbed.KVRoute{Name: fmt.Sprintf("kvroute-%d", i), Engines: tes, Model: "sim-model", Extra: kvrouteConfig("")}
		if err := k.Launch(g, bins.KVRoute); err != nil {
			t.Fatal(err)
		}
		r := &cluster{t: t, g: g, engines: aa.engines, kv: k}
		r.setPorts()
		extprocPorts[i] = k.ExtProc
		aa.routers = append(aa.routers, r)
	}
	for i, r := range aa.routers {
		if err := r.kv.Ready(ctx); err != nil {
			t.Fatal(err)
		}
		// Ready because every engine's stream replayed (the warm timeout
		// is 10 s), and the replica view agrees.
		if l := r.kv.Proc.Lines("msg=ready "); len(l) != 1 || !strings.Contains(l[0], "events_warm=true") {
			t.Errorf("kvroute-%d did not turn ready warm: %q", i, l)
		}
		reps := r.replicas()
		for _, e := range aa.engines {
			if st, ok := reps[e.addr()]; !ok || !st.Warm || !st.Healthy {
				t.Errorf("kvroute-%d ready with engine %s not warm and healthy: %+v", i, e.addr(), st)
			}
		}
	}

	// One Envoy whose kvroute_extproc cluster lists every router; the
	// envoy/envoy.yaml cluster's LEAST_REQUEST policy and gRPC health
	// check apply to all. Start waits until it sees each one healthy.
	env := &testbed.Envoy{Name: "envoy-aa", Config: testbed.EnvoyConfig{
		ExtProc: extprocPorts, Engines: tes2ports(tes), UpstreamHeader: "x-e2e-upstream",
	}}
	if err := env.Start(ctx, g, bins.Envoy, envoyTmpl); err != nil {
		t.Fatal(err)
	}
	aa.front = &cluster{t: t, g: g, engines: aa.engines, envoy: env}
	aa.front.setPorts()
	return aa
}

func tes2ports(es []*testbed.Engine) []int {
	ps := make([]int, len(es))
	for i, e := range es {
		ps[i] = e.Port
	}
	return ps
}

// decisions sums kvroute_decisions_total on a router's /metrics.
func decisions(r *cluster) (float64, error) {
	code, b, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/metrics", r.metricsPort))
	if err != nil {
		return 0, err
	}
	if code != 200 {
		return 0, fmt.Errorf("GET /metrics: %d", code)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(b)))
	if err != nil {
		return 0, err
	}
	var n float64
	if f, ok := fams["kvroute_decisions_total"]; ok {
		for _, m := range f.GetMetric() {
			n += m.GetCounter().GetValue()
		}
	}
	return n, nil
}
