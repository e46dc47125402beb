package bench

import (
	"math"
	"slices"
	"testing"
	"time"
)

// The agents workload has the shape: one of a few 3–6K harnesses,
// 10–60 turns (fewer only at the prompt cap), 200–8,000-token tool
// outputs, heavy-tailed 1–30 s think times, sessions starting in bursts.
func TestGenerateAgentsShape(t *testing.T) {
	w, err := Generate(GenAgents, GenOptions{Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	harnesses := map[uint64]bool{}
	var gaps []float64
	capped, bursty := 0, 0
	for i, s := range w.Sessions {
		h := s.Turns[0].Append[0]
		harnesses[h.ID] = true
		if h.Len < 3072 || h.Len > 6144 {
			t.Fatalf("session %d harness of %d tokens", i, h.Len)
		}
		lens := s.PromptLens()
		if len(s.Turns) > 60 || lens[len(lens)-1] > agentPromptCap {
			t.Fatalf("session %d: %d turns, last prompt %d", i, len(s.Turns), lens[len(lens)-1])
		}
		if len(s.Turns) < 10 {
			capped++
		}
		for _, tu := range s.Turns[1:] {
			if n := tu.Append[0].Len; n < 200 || n > 8000 {
				t.Fatalf("tool output of %d tokens", n)
			}
			if tu.Gap < time.Second || tu.Gap > 30*time.Second {
				t.Fatalf("think time %v", tu.Gap)
			}
			gaps = append(gaps, tu.Gap.Seconds())
		}
		if i > 0 && s.Start-w.Sessions[i-1].Start <= 2*time.Second {
			bursty++
		}
	}
	if len(w.Sessions) != 80 || len(harnesses) != 3 {
		t.Fatalf("%d sessions over %d harnesses", len(w.Sessions), len(harnesses))
	}
	if capped > len(w.Sessions)/4 {
		t.Errorf("%d of %d sessions cut by the prompt cap", capped, len(w.Sessions))
	}
	// Bursts: most sessions start within 2 s of the previous one.
	if bursty < len(w.Sessions)/2 {
		t.Errorf("only %d of %d sessions start in a burst", bursty, len(w.Sessions))
	}
	// Heavy tail: the median is short, the mean well above it.
	med := SpreadOf(gaps).Median
	if med > 2.5 || mean(gaps) < 1.5*med {
		t.Errorf("think times median %.2f s mean %.2f s: not heavy-tailed", med, mean(gaps))
	}
}

// GRPO groups of 8–16 samples share their task prompt and start together;
// every trajectory resends its history over 3–12 steps.
func TestGenerateGRPOShape(t *testing.T) {
	w, err := Generate(GenGRPO, GenOptions{Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	groups := map[uint64][]Session{}
	env := w.Sessions[0].Turns[0].Append[0]
	straggler := false
	for _, s := range w.Sessions {
		first := s.Turns[0].Append
		if len(first) != 2 || first[0] != env {
			t.Fatalf("trajectory %s does not start with the shared environment prompt", s.ID)
		}
		groups[first[1].ID] = append(groups[first[1].ID], s)
		if len(s.Turns) < 3 || len(s.Turns) > 12 {
			t.Fatalf("trajectory %s has %d steps", s.ID, len(s.Turns))
		}
		for _, tu := range s.Turns[1:] {
			if tu.Gap < 200*time.Millisecond || tu.Gap > 60*time.Second {
				t.Fatalf("tool delay %v", tu.Gap)
			}
			straggler = straggler || tu.Gap > 10*time.Second
		}
	}
	if len(groups) != 32 || !straggler {
		t.Fatalf("%d groups (want 8 batches of 4 tasks), stragglers %v", len(groups), straggler)
	}
	for _, g := range groups {
		if len(g) < 8 || len(g) > 16 {
			t.Fatalf("group of %d samples", len(g))
		}
		for _, s := range g {
			if s.Start != g[0].Start {
				t.Fatalf("group members start at %v and %v", g[0].Start, s.Start)
			}
		}
	}
}

// Mixed has agents, short chats and one-shot long documents over one span.
func TestGenerateMixedShape(t *testing.T) {
	w, err := Generate(GenMixed, GenOptions{Seed: 4})
	if err != nil {
		t.Fatal(err)
	}
	var docs, chats, agents int
	var last [3]time.Duration
	for i, s := range w.Sessions {
		if i > 0 && s.Start < w.Sessions[i-1].Start {
			t.Fatal("sessions not in start order")
		}
		lens := s.PromptLens()
		switch {
		case len(s.Turns) == 1 && lens[0] >= 20000:
			docs++
			if lens[0] > 100000 {
				t.Fatalf("document of %d tokens", lens[0])
			}
			last[0] = s.Start
		case lens[0] <= 1500+500:
			chats++
			if len(s.Turns) > 4 {
				t.Fatalf("chat of %d turns", len(s.Turns))
			}
			last[1] = s.Start
		default:
			agents++
			last[2] = s.Start
		}
	}
	if docs != 60 || chats != 300 || agents != 20 {
		t.Fatalf("docs %d chats %d agents %d", docs, chats, agents)
	}
	// The three streams end over one span (within half of it).
	lo := min(last[0], last[1], last[2])
	hi := max(last[0], last[1], last[2])
	if float64(hi-lo) > 0.5*float64(hi) {
		t.Errorf("streams end at %v: not over one span", last)
	}
}

// Client habits: about 40 % header, 30 % user only, 30 % nothing.
func TestSessionIdentityMix(t *testing.T) {
	w, err := Generate(GenChat, GenOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var key, user, none int
	for _, s := range w.Sessions {
		switch {
		case s.ID == "" || (s.Key != "" && s.User != ""):
			t.Fatalf("session identity %+v", s)
		case s.Key != "":
			key++
			if s.Key != s.ID {
				t.Fatalf("header key %q for conversation %q", s.Key, s.ID)
			}
		case s.User != "":
			user++
		default:
			none++
		}
	}
	n := float64(len(w.Sessions))
	if math.Abs(float64(key)/n-0.4) > 0.08 || math.Abs(float64(user)/n-0.3) > 0.08 || math.Abs(float64(none)/n-0.3) > 0.08 {
		t.Fatalf("header %d, user %d, none %d of %v", key, user, none, n)
	}
}

// Groups: single requests over a fixed set of long prefixes, picked with a
// skew, each with its own question; on several seeds, not one.
func TestGenerateGroupsShape(t *testing.T) {
	for _, seed := range []uint64{1, 5, 9, 1234} {
		w, err := Generate(GenGroups, GenOptions{Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		checkGroupsShape(t, seed, w)
	}
}

func checkGroupsShape(t *testing.T, seed uint64, w *Workload) {
	t.Helper()
	if len(w.Sessions) != 4000 {
		t.Fatalf("seed %d: %d requests, want 4000", seed, len(w.Sessions))
	}
	count := map[Segment]int{}
	questions := map[uint64]bool{}
	for i, s := range w.Sessions {
		if i > 0 && s.Start < w.Sessions[i-1].Start {
			t.Fatalf("request %d starts before the one before it", i)
		}
		if len(s.Turns) != 1 || len(s.Turns[0].Append) != 2 {
			t.Fatalf("request %s is not one turn of prefix and question", s.ID)
		}
		p, q := s.Turns[0].Append[0], s.Turns[0].Append[1]
		if p.Len < 1024 || p.Len > 6144 || q.Len < 64 || q.Len > 1024 {
			t.Fatalf("prefix %d and question %d tokens", p.Len, q.Len)
		}
		if questions[q.ID] {
			t.Fatalf("question %x sent twice", q.ID)
		}
		questions[q.ID] = true
		count[p]++
	}
	counts := make([]int, 0, len(count))
	for _, c := range count {
		counts = append(counts, c)
	}
	slices.Sort(counts)
	hot, median := counts[len(counts)-1], counts[len(counts)/2]
	// Zipf 1.1 over 128 ranks: the hottest about 23 % (900 of 4000), the
	// median rank about 0.25 % (9).
	if len(count) < 100 || len(count) > 128 || hot < 700 || hot > 1100 || median > 30 {
		t.Fatalf("seed %d: %d groups, hottest %d requests, median %d: not a Zipf(1.1) skew over 128", seed, len(count), hot, median)
	}
}

func TestGenerateReasoningShape(t *testing.T) {
	for _, seed := range []uint64{1, 7, 42, 1234} {
		w, err := Generate(GenReason, GenOptions{Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		checkReasoningShape(t, w)
	}
}

func checkReasoningShape(t *testing.T, w *Workload) {
	t.Helper()
	if len(w.Sessions) != 300 {
		t.Fatalf("%d sessions, want 300", len(w.Sessions))
	}
	systems := map[Segment]bool{}
	var think, answer []int
	for i, s := range w.Sessions {
		if i > 0 && s.Start < w.Sessions[i-1].Start {
			t.Fatal("sessions not in start order")
		}
		if len(s.Turns) < 1 || len(s.Turns) > 8 {
			t.Fatalf("session %s has %d turns", s.ID, len(s.Turns))
		}
		first := s.Turns[0].Append
		if len(first) != 2 || first[0].Len < 500 || first[0].Len > 2000 {
			t.Fatalf("session %s opens with %v: not a system prompt and a message", s.ID, first)
		}
		systems[first[0]] = true
		lens := s.PromptLens()
		for k, tu := range s.Turns {
			msg := tu.Append[len(tu.Append)-1].Len
			if msg < 30 || msg > 2000 {
				t.Fatalf("a user message of %d tokens", msg)
			}
			a := tu.Output - tu.Hidden
			if tu.Hidden < 200 || tu.Hidden > 12000 || a < 100 || a > 1000 {
				t.Fatalf("turn of %d thinking and %d answer tokens", tu.Hidden, a)
			}
			think, answer = append(think, tu.Hidden), append(answer, a)
			if k > 0 {
				// The next prompt resends the answer, not the thinking.
				if want := lens[k-1] + s.Turns[k-1].Output - s.Turns[k-1].Hidden + msg; lens[k] != want {
					t.Fatalf("session %s turn %d: prompt %d tokens, want %d", s.ID, k, lens[k], want)
				}
				if tu.Gap <= 0 || tu.Gap > 120*time.Second {
					t.Fatalf("think time %v", tu.Gap)
				}
			}
		}
	}
	if len(systems) != 4 {
		t.Fatalf("%d system prompts, want 4", len(systems))
	}
	// Log-uniform: the medians sit near the ranges' geometric means
	// (1,549 and 316 tokens).
	slices.Sort(think)
	slices.Sort(answer)
	if m := think[len(think)/2]; m < 1100 || m > 2200 {
		t.Errorf("median thinking %d tokens, want about 1,549", m)
	}
	if m := answer[len(answer)/2]; m < 230 || m > 430 {
		t.Errorf("median answer %d tokens, want about 316", m)
	}
}
