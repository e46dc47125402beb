package bench

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestReadTrace(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [7, 8]}

{"timestamp": 1500, "input_length": 512, "output_length": 1, "hash_ids": [7], "extra": "ignored"}
`
	w, err := ReadTrace(strings.NewReader(in), TraceOptions{RateScale: 2})
	if err != nil {
		t.Fatal(err)
	}
	// The second request extends the first one's full block 7: the same
	// conversation.
	want := []Session{
		{ID: "conv-0", Start: 0, Turns: []Turn{{TraceIDs: []int64{7, 8}, TraceLen: 600, TraceBlock: 512, Output: 5}}},
		{ID: "conv-0", Start: 750 * time.Millisecond, Turns: []Turn{{TraceIDs: []int64{7}, TraceLen: 512, TraceBlock: 512, Output: 1}}},
	}
	for i := range want {
		want[i].identify(want[i].ID)
	}
	if !reflect.DeepEqual(w.Sessions, want) {
		t.Fatalf("sessions %+v, want %+v", w.Sessions, want)
	}
	lim, err := ReadTrace(strings.NewReader(in), TraceOptions{Limit: 1})
	if err != nil || len(lim.Sessions) != 1 {
		t.Fatalf("limit 1: %v sessions, err %v", lim, err)
	}
}

// Conversations are rebuilt from whole earlier prompts, not from a shared
// first block: two conversations over one 2-block system prompt stay
// apart, each turn joins the conversation whose last prompt it extends, and
// a request extending an already continued prompt starts its own.
func TestReadTraceConversations(t *testing.T) {
	lines := []string{
		// 0, A1: a 2-block system prompt [1 2] and a short question.
		`{"timestamp": 0, "input_length": 1200, "output_length": 100, "hash_ids": [1, 2, 10]}`,
		// 1, B1: a long question over the same system prompt: its full
		// blocks go past [1 2]; [1 2] is A1's only, so B1 joins A (the
		// documented ambiguity: the trace cannot tell it from A's next turn).
		`{"timestamp": 1, "input_length": 2000, "output_length": 100, "hash_ids": [1, 2, 20, 21]}`,
		// 2, C1: another long question: [1 2] is still held by A's
		// conversation alone, but A1 was already continued: its own start.
		`{"timestamp": 2, "input_length": 2000, "output_length": 5, "hash_ids": [1, 2, 30, 31]}`,
		// 3, D1: [1 2] is now held by two conversations: a shared prompt.
		`{"timestamp": 3, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 40]}`,
		// 4, C2: extends C1's full blocks [1 2 30]: held by C alone.
		`{"timestamp": 4, "input_length": 2600, "output_length": 5, "hash_ids": [1, 2, 30, 31, 32, 33]}`,
		// 5, C3: a retry with the same full blocks as C2: joins C.
		`{"timestamp": 5, "input_length": 2610, "output_length": 5, "hash_ids": [1, 2, 30, 31, 32, 34]}`,
		// 6, no full block, a conversation of its own.
		`{"timestamp": 6, "input_length": 300, "output_length": 5, "hash_ids": [50]}`,
		// 7, B2: extends B1's [1 2 20].
		`{"timestamp": 7, "input_length": 2100, "output_length": 5, "hash_ids": [1, 2, 20, 21, 22]}`,
		// 8, E1: ends at [1 2] (shared by several conversations): its own.
		`{"timestamp": 8, "input_length": 1300, "output_length": 5, "hash_ids": [1, 2, 60]}`,
	}
	w, err := ReadTrace(strings.NewReader(strings.Join(lines, "\n")), TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range w.Sessions {
		got = append(got, s.ID)
	}
	want := []string{"conv-0", "conv-0", "conv-2", "conv-3", "conv-2", "conv-2", "conv-6", "conv-0", "conv-8"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("conversations %v, want %v", got, want)
	}
}

func TestReadTraceRepeat(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [7, 8]}
{"timestamp": 100, "input_length": 1100, "output_length": 1, "hash_ids": [7, 9, 11]}
`
	w, err := ReadTrace(strings.NewReader(in), TraceOptions{Repeat: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Sessions) != 6 {
		t.Fatalf("%d sessions, want 6", len(w.Sessions))
	}
	starts := []time.Duration{0, 100, 200, 300, 400, 500}
	for i, s := range w.Sessions {
		if s.Start != starts[i]*time.Millisecond {
			t.Errorf("session %d starts at %v, want %v ms", i, s.Start, starts[i])
		}
		want := []int64{7, 9, 11}[:len(s.Turns[0].TraceIDs)]
		if i%2 == 0 {
			want = []int64{7, 8}
		}
		for k := range want {
			want[k] += int64(i/2) * 12
		}
		if !reflect.DeepEqual(s.Turns[0].TraceIDs, want) {
			t.Errorf("session %d ids %v, want %v", i, s.Turns[0].TraceIDs, want)
		}
	}
	// Each copy is its own pair of conversations' worth of prefixes.
	if w.Sessions[0].ID == w.Sessions[2].ID || w.Sessions[2].ID != w.Sessions[3].ID {
		t.Errorf("ids %q %q %q: copies must not share a conversation", w.Sessions[0].ID, w.Sessions[2].ID, w.Sessions[3].ID)
	}
	if _, err := ReadTrace(strings.NewReader(in), TraceOptions{Repeat: -1}); !errors.Is(err, ErrTrace) {
		t.Errorf("negative repeat: %v", err)
	}
	huge := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [7, 9223372036854775800]}`
	if _, err := ReadTrace(strings.NewReader(huge), TraceOptions{Repeat: 2}); !errors.Is(err, ErrTrace) {
		t.Errorf("copies past the largest id: %v", err)
	}
}

// A window of the trace starts at its Offset-th request with its times
// counted from there, and rebuilds conversations from its own requests
// only; an offset past the trace is an error that says its length.
func TestReadTraceWindow(t *testing.T) {
	in := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [7, 8]}
{"timestamp": 100, "input_length": 1100, "output_length": 1, "hash_ids": [7, 9, 11]}
{"timestamp": 250, "input_length": 1100, "output_length": 2, "hash_ids": [7, 9, 11]}
{"timestamp": 400, "input_length": 300, "output_length": 3, "hash_ids": [20]}
`
	w, err := ReadTrace(strings.NewReader(in), TraceOptions{Offset: 1, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := []Session{
		{ID: "conv-0", Start: 0, Turns: []Turn{{TraceIDs: []int64{7, 9, 11}, TraceLen: 1100, TraceBlock: 512, Output: 1}}},
		{ID: "conv-0", Start: 150 * time.Millisecond, Turns: []Turn{{TraceIDs: []int64{7, 9, 11}, TraceLen: 1100, TraceBlock: 512, Output: 2}}},
	}
	for i := range want {
		want[i].identify(want[i].ID)
	}
	if !reflect.DeepEqual(w.Sessions, want) {
		t.Fatalf("sessions %+v, want %+v", w.Sessions, want)
	}
	// Seed 2's window of two of the four requests starts at request 1
	// (TraceWindow(2, 4, 2)): the same window, read in one pass.
	win, err := ReadTrace(strings.NewReader(in), TraceOptions{Window: 2, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(win.Sessions, want) {
		t.Fatalf("window 2: sessions %+v, want %+v", win.Sessions, want)
	}
	if _, err := ReadTrace(strings.NewReader(in), TraceOptions{Offset: 4}); !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), "has 4") {
		t.Errorf("offset past the trace: %v", err)
	}
	if _, err := ReadTrace(strings.NewReader(in), TraceOptions{Offset: -1}); !errors.Is(err, ErrTrace) {
		t.Errorf("negative offset: %v", err)
	}
}

// Seeds' windows: seed 1 at the start, every start a possible one, and,
// on traces of any length, the first five spread over the trace with no
// two closer than a tenth of the possible starts (the golden-ratio
// sequence's first five points leave gaps of at least 0.146 of it).
func TestTraceWindow(t *testing.T) {
	sizes := []struct{ total, limit int }{{3993, 1000}, {100, 99}, {5000, 1}, {12031, 4000}, {10000, 100}, {640, 64}}
	for _, c := range sizes {
		if got := TraceWindow(1, c.total, c.limit); got != 0 {
			t.Errorf("seed 1 of %d/%d starts at %d, want 0", c.total, c.limit, got)
		}
		for seed := uint64(1); seed <= 200; seed++ {
			if o := TraceWindow(seed, c.total, c.limit); o < 0 || o+c.limit > c.total {
				t.Fatalf("seed %d of %d/%d starts at %d: past the trace", seed, c.total, c.limit, o)
			}
		}
		starts := c.total - c.limit + 1
		if starts < 100 {
			continue // too few starts for a spread to show
		}
		var first []int
		for seed := uint64(1); seed <= 5; seed++ {
			first = append(first, TraceWindow(seed, c.total, c.limit))
		}
		for i := range first {
			for j := range i {
				if d := first[i] - first[j]; d < starts/10 && d > -starts/10 {
					t.Errorf("%d/%d: seeds %d and %d start at %d and %d", c.total, c.limit, j+1, i+1, first[j], first[i])
				}
			}
		}
	}
	for _, c := range []struct{ total, limit int }{{3993, 0}, {3993, 3993}, {10, 20}} {
		if got := TraceWindow(3, c.total, c.limit); got != 0 {
			t.Errorf("no room for windows (%d/%d): start %d, want 0", c.total, c.limit, got)
		}
	}
}

// A trace cut at other than Mooncake's 512 tokens a hash id is read at the
// one block size its lines fit, or at the size given; a line that fits no
// size the others fit is an error naming it.
func TestReadTraceBlockSize(t *testing.T) {
	lines := []string{
		// 40 tokens in 3 ids fit 14 to 19 tokens a block; 50 in 4 fit 13 to
		// 16; 16 is the power of two in both.
		`{"timestamp": 0, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 3]}`,
		// Extends the first request's two full 16-token blocks: the same
		// conversation (at 512 tokens a block neither has a full block).
		`{"timestamp": 10, "input_length": 50, "output_length": 5, "hash_ids": [1, 2, 4, 5]}`,
		// Its own conversation: its full blocks [1 6] extend no earlier one.
		`{"timestamp": 20, "input_length": 33, "output_length": 5, "hash_ids": [1, 6, 7]}`,
	}
	in := strings.Join(lines, "\n")
	for _, opt := range []TraceOptions{{}, {BlockTokens: 16}} {
		w, err := ReadTrace(strings.NewReader(in), opt)
		if err != nil {
			t.Fatalf("block tokens %d: %v", opt.BlockTokens, err)
		}
		var ids []string
		for i, s := range w.Sessions {
			if b := s.Turns[0].TraceBlock; b != 16 {
				t.Errorf("block tokens %d: request %d read at %d tokens a hash id, want 16", opt.BlockTokens, i, b)
			}
			ids = append(ids, s.ID)
		}
		if want := []string{"conv-0", "conv-0", "conv-2"}; !reflect.DeepEqual(ids, want) {
			t.Errorf("block tokens %d: conversations %v, want %v", opt.BlockTokens, ids, want)
		}
	}
	// Given as Mooncake's 512, the first line has two ids too many.
	if _, err := ReadTrace(strings.NewReader(in), TraceOptions{BlockTokens: 512}); !errors.Is(err, ErrTrace) ||
		!strings.Contains(err.Error(), "line 1: 3 hash_ids for input_length 40 (want ceil(40/512) = 1)") {
		t.Errorf("at 512 tokens: %v", err)
	}
	// 20 tokens in 3 ids fit 7 to 9 tokens: none of the first line's.
	bad := lines[0] + "\n" + `{"timestamp": 5, "input_length": 20, "output_length": 5, "hash_ids": [1, 9, 10]}`
	if _, err := ReadTrace(strings.NewReader(bad), TraceOptions{}); !errors.Is(err, ErrTrace) ||
		!strings.Contains(err.Error(), "line 2: 3 hash_ids for input_length 20 fit no block size that the lines before fit (14 to 19 tokens)") {
		t.Errorf("no common size: %v", err)
	}
	// 5 tokens cannot be 4 blocks of any size.
	if _, err := ReadTrace(strings.NewReader(`{"timestamp": 0, "input_length": 5, "output_length": 5, "hash_ids": [1, 2, 3, 4]}`), TraceOptions{}); !errors.Is(err, ErrTrace) {
		t.Errorf("5 tokens in 4 blocks: %v", err)
	}
	if _, err := ReadTrace(strings.NewReader(in), TraceOptions{BlockTokens: -1}); !errors.Is(err, ErrTrace) {
		t.Errorf("negative block size: %v", err)
	}
}

func TestReadTraceBadLines(t *testing.T) {
	good := `{"timestamp": 10, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}` + "\n"
	tests := []struct {
		name, line string
		want       string // substring of the error
	}{
		{"not json", `{"timestamp": 0,`, "line 2:"},
		{"missing timestamp", `{"input_length": 100, "output_length": 5, "hash_ids": [1]}`, "line 2: missing timestamp"},
		{"missing input", `{"timestamp": 20, "output_length": 5, "hash_ids": [1]}`, "line 2: missing input_length"},
		{"missing output", `{"timestamp": 20, "input_length": 100, "hash_ids": [1]}`, "line 2: missing output_length"},
		{"negative timestamp", `{"timestamp": -1, "input_length": 100, "output_length": 5, "hash_ids": [1]}`, "line 2: timestamp -1"},
		{"time goes back", `{"timestamp": 5, "input_length": 100, "output_length": 5, "hash_ids": [1]}`, "line 2: timestamp 5 is before"},
		{"zero input", `{"timestamp": 20, "input_length": 0, "output_length": 5, "hash_ids": []}`, "line 2: input_length 0"},
		{"zero output", `{"timestamp": 20, "input_length": 100, "output_length": 0, "hash_ids": [1]}`, "line 2: output_length 0"},
		{"too few ids", `{"timestamp": 20, "input_length": 1000, "output_length": 5, "hash_ids": [1]}`, "line 2: 1 hash_ids for input_length 1000"},
		{"too many ids", `{"timestamp": 20, "input_length": 10, "output_length": 5, "hash_ids": [1, 2]}`, "line 2: 2 hash_ids"},
		{"wrong type", `{"timestamp": "x", "input_length": 10, "output_length": 5, "hash_ids": [1]}`, "line 2:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadTrace(strings.NewReader(good+tt.line+"\n"+good), TraceOptions{})
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q, want ErrTrace containing %q", err, tt.want)
			}
		})
	}
	if _, err := ReadTrace(strings.NewReader("\n\n"), TraceOptions{}); !errors.Is(err, ErrTrace) {
		t.Errorf("empty trace: %v, want ErrTrace", err)
	}
	if _, err := ReadTrace(strings.NewReader(good), TraceOptions{RateScale: -1}); !errors.Is(err, ErrTrace) {
		t.Errorf("negative rate scale: %v, want ErrTrace", err)
	}
	if _, err := ReadTraceFile("/nonexistent/trace.jsonl", TraceOptions{}); !errors.Is(err, ErrTrace) {
		t.Errorf("missing file: %v, want ErrTrace", err)
	}
}

func TestGenerateDeterministic(t *testing.T) {
	for _, name := range Generators() {
		t.Run(name, func(t *testing.T) {
			opt := GenOptions{Seed: 3, SizeScale: 0.1}
			a, err := Generate(name, opt)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := Generate(name, opt)
			if !reflect.DeepEqual(a, b) {
				t.Fatal("same seed, different workloads")
			}
			opt.Seed = 4
			c, _ := Generate(name, opt)
			if reflect.DeepEqual(a, c) {
				t.Fatal("different seeds, same workload")
			}
			if a.Requests() == 0 {
				t.Fatal("no requests")
			}
		})
	}
	if _, err := Generate("nope", GenOptions{}); !errors.Is(err, ErrGenerator) {
		t.Errorf("unknown generator: %v", err)
	}
	if _, err := Generate(GenChat, GenOptions{RateScale: -2}); !errors.Is(err, ErrGenerator) {
		t.Errorf("negative rate: %v", err)
	}
}

// The RL workload has Anyscale's shape: steps of 8 rollouts sharing a 2K
// task prompt, 10 turns of 1K output, two 8K stragglers a step.
func TestGenerateRLShape(t *testing.T) {
	w, err := Generate(GenRL, GenOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Sessions)%8 != 0 {
		t.Fatalf("%d rollouts, not whole steps of 8", len(w.Sessions))
	}
	for st := 0; st < len(w.Sessions); st += 8 {
		stragglers := 0
		task := w.Sessions[st].Turns[0].Append[0]
		for _, s := range w.Sessions[st : st+8] {
			if len(s.Turns) != 10 || s.Turns[0].Append[0] != task || task.Len != 2048 {
				t.Fatalf("rollout %s: %d turns, first segment %+v (step task %+v)", s.Key, len(s.Turns), s.Turns[0].Append[0], task)
			}
			for k, tu := range s.Turns {
				switch {
				case k == 9 && tu.Output == 8192:
					stragglers++
				case tu.Output != 1024:
					t.Fatalf("rollout %s turn %d output %d", s.Key, k, tu.Output)
				}
			}
		}
		if stragglers != 2 {
			t.Fatalf("step %d has %d stragglers, want 2", st/8, stragglers)
		}
	}
}

func TestExpand(t *testing.T) {
	a := Expand(nil, []Segment{{ID: 1, Len: 40}, {ID: 2, Len: 8}})
	b := Expand(nil, []Segment{{ID: 1, Len: 40}, {ID: 3, Len: 8}})
	if len(a) != 48 || !reflect.DeepEqual(a[:40], b[:40]) || reflect.DeepEqual(a[40:], b[40:]) {
		t.Fatalf("expansion does not share exactly the common segment: %v / %v", a, b)
	}
}
