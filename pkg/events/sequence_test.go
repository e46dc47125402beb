package events

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// seqStep is one input to the sequencer and what it must answer.
type seqStep struct {
	in   string        // start, connect, disconnect, live, rbatch, rend, rfail, overflow, decode, tick
	seq  uint64        // live, rbatch
	body string        // payload (default "b<seq>")
	at   time.Duration // time since t0
	want []string      // the actions, rendered by actString
	// state after the step: "" skips the check.
	state string
}

func actString(a action) string {
	switch a.kind {
	case actEnqueue:
		if a.live {
			return fmt.Sprintf("enqueue %d live", a.msg.seq)
		}
		return fmt.Sprintf("enqueue %d", a.msg.seq)
	case actClear:
		return strings.TrimSpace("clear " + a.reason)
	case actReplay:
		return fmt.Sprintf("replay %d", a.from)
	case actCaughtUp:
		return "caughtup " + a.reason
	case actGap:
		return "gap"
	case actReplayDone:
		return "done " + a.result.String()
	case actRestart:
		return fmt.Sprintf("restart %d<%d", a.msg.seq, a.from)
	case actReplayOverflow:
		return "replay_overflow"
	case actUnreachable:
		return "unreachable"
	}
	return "?"
}

// stateString renders the sequencer's externally visible state.
func stateString(q *sequencer) string {
	s := q.state.String()
	if q.caughtUp {
		s += " caught"
	}
	if q.settled {
		s += " settled"
	}
	if !q.quietSince.IsZero() {
		s += " quiet"
	}
	return s
}

var t0 = time.Unix(1_700_000_000, 0)

func runSeq(t *testing.T, q *sequencer, steps []seqStep) {
	t.Helper()
	for i, st := range steps {
		now := t0.Add(st.at)
		body := st.body
		if body == "" {
			body = fmt.Sprintf("b%d", st.seq)
		}
		msg := liveMsg{st.seq, []byte(body)}
		var acts []action
		switch st.in {
		case "start":
			acts = q.Start(now)
		case "connect":
			acts = q.Connected(now)
		case "disconnect":
			q.Disconnected()
		case "live":
			acts = q.Live(now, msg)
		case "rbatch":
			acts = q.ReplayBatch(now, msg)
		case "rend":
			acts = q.ReplayEnd(now)
		case "rfail":
			acts = q.ReplayFailed(now)
		case "overflow":
			acts = q.Overflow(now)
		case "decode":
			acts = q.DecodeError(now)
		case "tick":
			acts = q.Tick(now)
		default:
			t.Fatalf("step %d: unknown input %q", i, st.in)
		}
		got := make([]string, 0, len(acts))
		for _, a := range acts {
			got = append(got, actString(a))
		}
		if !slices.Equal(got, st.want) && !(len(got) == 0 && len(st.want) == 0) {
			t.Fatalf("step %d (%s %d): actions\n got  %q\n want %q", i, st.in, st.seq, got, st.want)
		}
		if st.state != "" && stateString(q) != st.state {
			t.Fatalf("step %d (%s %d): state %q, want %q", i, st.in, st.seq, stateString(q), st.state)
		}
	}
}

func withReplay() seqConfig {
	return seqConfig{replay: true, connectWait: 2 * time.Second, replayBuffer: 8, resyncQuiet: 30 * time.Second}
}

func noReplay() seqConfig {
	c := withReplay()
	c.replay = false
	return c
}

// connected is the common prefix: a session with a replay endpoint whose
// warm replay found nothing published yet.
var connected = []seqStep{
	{in: "start", want: []string{"clear"}, state: "connecting"},
	{in: "connect", want: []string{"clear connect", "replay 0"}, state: "replaying"},
	{in: "rend", want: []string{"done ok", "caughtup replay"}, state: "live caught settled"},
}

// liveTo continues a connected stream with live batches from..to.
func liveTo(from, to uint64) []seqStep {
	var s []seqStep
	for i := from; i <= to; i++ {
		s = append(s, seqStep{in: "live", seq: i, want: []string{fmt.Sprintf("enqueue %d live", i)}, state: "live caught settled"})
	}
	return s
}

func TestSequencerTransitions(t *testing.T) {
	cases := []struct {
		name  string
		cfg   seqConfig
		steps []seqStep
	}{
		{"session start waits for the engine", withReplay(), []seqStep{
			{in: "start", want: []string{"clear"}, state: "connecting"},
			{in: "live", seq: 4, want: []string{"enqueue 4 live"}, state: "connecting"},
		}},
		{"warm start replays the engine's buffer", withReplay(), []seqStep{
			{in: "start", want: []string{"clear"}},
			{in: "connect", want: []string{"clear connect", "replay 0"}, state: "replaying"},
			{in: "live", seq: 3, want: nil, state: "replaying"}, // buffered
			{in: "rbatch", seq: 0, want: []string{"enqueue 0"}},
			{in: "rbatch", seq: 1, want: []string{"enqueue 1"}},
			{in: "rbatch", seq: 1, want: nil}, // already applied
			{in: "rbatch", seq: 2, want: []string{"enqueue 2"}, state: "replaying"},
			{in: "rend", want: []string{"done ok", "enqueue 3", "caughtup replay"}, state: "live caught settled"},
			{in: "live", seq: 3, body: "b3", want: nil}, // live twin of a replayed batch
			{in: "live", seq: 4, want: []string{"enqueue 4 live"}},
		}},
		{"warm start on an engine that published nothing", withReplay(), append(slices.Clone(connected),
			seqStep{in: "live", seq: 0, want: []string{"enqueue 0 live"}, state: "live caught settled"})},
		// A batch lost to decoding mid-replay empties the view: the replay
		// goes on, but what it brings is no longer the whole buffer, so the
		// replica catches up by the quiet window, not by the replay; and a
		// buffered live batch older than what the replay applied is not
		// queued after it.
		{"a decode error during the warm replay: caught up by the quiet window, not the replay", withReplay(), []seqStep{
			{in: "start", want: []string{"clear"}},
			{in: "connect", want: []string{"clear connect", "replay 0"}},
			{in: "rbatch", seq: 0, want: []string{"enqueue 0"}},
			{in: "rbatch", seq: 1, want: []string{"enqueue 1"}},
			{in: "decode", want: []string{"clear decode_error"}, state: "resyncing quiet"},
			{in: "rbatch", seq: 2, want: []string{"enqueue 2"}},
			{in: "live", seq: 1, want: nil}, // the live twin of replayed 1
			{in: "rend", at: time.Second, want: []string{"done ok"}, state: "resyncing settled quiet"},
			{in: "live", seq: 3, at: 2 * time.Second, want: []string{"enqueue 3 live"}, state: "resyncing settled quiet"},
			{in: "tick", at: 31 * time.Second, want: []string{"caughtup quiet_window"}, state: "live caught settled"},
		}},
		// The quiet window does not end while a replay is outstanding: the
		// live batches of its span wait unapplied in the replay's buffer.
		{"the quiet window waits for a replay outstanding", withReplay(), append(append(slices.Clone(connected), liveTo(0, 1)...),
			seqStep{in: "live", seq: 3, want: []string{"gap", "replay 2"}, state: "replaying caught settled"},
			seqStep{in: "decode", at: time.Second, want: []string{"clear decode_error"}, state: "resyncing settled quiet"},
			seqStep{in: "tick", at: 40 * time.Second, want: nil, state: "resyncing settled quiet"},
			seqStep{in: "rbatch", seq: 2, at: 41 * time.Second, want: []string{"enqueue 2"}},
			seqStep{in: "rend", at: 41 * time.Second, want: []string{"done ok", "enqueue 3"}, state: "resyncing settled quiet"},
			seqStep{in: "tick", at: 41 * time.Second, want: []string{"caughtup quiet_window"}, state: "live caught settled"},
		)},
		{"warm replay that starts later than asked is truncated, then the quiet window", withReplay(), []seqStep{
			{in: "start", want: []string{"clear"}},
			{in: "connect", want: []string{"clear connect", "replay 0"}},
			{in: "rbatch", seq: 5, want: []string{"clear replay_truncated", "enqueue 5"}},
			{in: "rbatch", seq: 6, want: []string{"enqueue 6"}},
			{in: "rend", at: time.Second, want: []string{"done truncated"}, state: "resyncing settled quiet"},
			{in: "live", seq: 7, at: 2 * time.Second, want: []string{"enqueue 7 live"}},
			{in: "tick", at: 30 * time.Second, want: nil, state: "resyncing settled quiet"},
			{in: "tick", at: 31 * time.Second, want: []string{"caughtup quiet_window"}, state: "live caught settled"},
		}},
		{"replay of a gap with nothing buffered any more", withReplay(), append(append(slices.Clone(connected), liveTo(0, 2)...),
			seqStep{in: "live", seq: 5, want: []string{"gap", "replay 3"}, state: "replaying caught settled"},
			seqStep{in: "rend", want: []string{"clear replay_truncated", "done truncated", "enqueue 5"}, state: "resyncing settled quiet"},
		)},
		{"a gap is replayed and the buffered live batches merged", withReplay(), append(append(slices.Clone(connected), liveTo(0, 1)...),
			seqStep{in: "live", seq: 3, want: []string{"gap", "replay 2"}, state: "replaying caught settled"},
			seqStep{in: "live", seq: 4, want: nil},
			seqStep{in: "rbatch", seq: 2, want: []string{"enqueue 2"}},
			seqStep{in: "rbatch", seq: 3, want: []string{"enqueue 3"}},
			seqStep{in: "rend", want: []string{"done ok", "enqueue 4"}, state: "live caught settled"},
			seqStep{in: "live", seq: 5, want: []string{"enqueue 5 live"}},
		)},
		{"a hole in the merged batches asks again while rounds make progress, three idle rounds give up", withReplay(), append(append(slices.Clone(connected), liveTo(0, 1)...),
			seqStep{in: "live", seq: 4, want: []string{"gap", "replay 2"}},
			seqStep{in: "live", seq: 6, want: nil},
			seqStep{in: "live", seq: 8, want: nil},
			seqStep{in: "rbatch", seq: 2, want: []string{"enqueue 2"}},
			seqStep{in: "rend", want: []string{"done ok", "gap", "replay 3"}, state: "replaying caught settled"},
			seqStep{in: "rbatch", seq: 3, want: []string{"enqueue 3"}},
			seqStep{in: "rend", want: []string{"done ok", "enqueue 4", "gap", "replay 5"}},
			seqStep{in: "rbatch", seq: 4, want: nil}, // nothing new: an idle round
			seqStep{in: "rend", want: []string{"done ok", "gap", "replay 5"}},
			seqStep{in: "rbatch", seq: 4, want: nil},
			seqStep{in: "rend", want: []string{"done ok", "gap", "replay 5"}},
			seqStep{in: "rbatch", seq: 4, want: nil},
			seqStep{in: "rend", want: []string{"done ok", "gap", "clear replay_rounds", "enqueue 6 live", "gap", "clear gap", "enqueue 8 live"}, state: "resyncing settled quiet"},
		)},
		{"a reply lost in the middle of a round asks again from the hole", withReplay(), []seqStep{
			{in: "start", want: []string{"clear"}},
			{in: "connect", want: []string{"clear connect", "replay 0"}},
			{in: "rbatch", seq: 0, want: []string{"enqueue 0"}},
			{in: "rbatch", seq: 1, want: []string{"enqueue 1"}},
			{in: "rbatch", seq: 3, want: []string{"done partial", "replay 2"}, state: "replaying"},
			{in: "rbatch", seq: 2, want: []string{"enqueue 2"}},
			{in: "rbatch", seq: 3, want: []string{"enqueue 3"}},
			{in: "rend", want: []string{"done ok", "caughtup replay"}, state: "live caught settled"},
		}},
		{"a hole found by one round keeps the catch-up truncated after later rounds", withReplay(), []seqStep{
			{in: "start", want: []string{"clear"}},
			{in: "connect", want: []string{"clear connect", "replay 0"}},
			{in: "rbatch", seq: 1, want: []string{"clear replay_truncated", "enqueue 1"}}, // seq 0 is gone
			{in: "rbatch", seq: 2, want: []string{"enqueue 2"}},
			{in: "rbatch", seq: 4, want: []string{"done partial", "replay 3"}},
			{in: "rbatch", seq: 3, want: []string{"enqueue 3"}},
			{in: "rbatch", seq: 4, want: []string{"enqueue 4"}},
			{in: "rend", at: time.Second, want: []string{"done truncated"}, state: "resyncing settled quiet"},
		}},
		{"a round whose end marker is lost goes on; a repeat with nothing new is complete", withReplay(), []seqStep{
			{in: "start", want: []string{"clear"}},
			{in: "connect", want: []string{"clear connect", "replay 0"}},
			{in: "rbatch", seq: 0, want: []string{"enqueue 0"}},
			{in: "rfail", want: []string{"done partial", "replay 1"}, state: "replaying"},
			{in: "rend", want: []string{"done ok", "caughtup replay"}, state: "live caught settled"},
		}},
		{"a merged round whose replay has nothing buffered restarts from the live batches", withReplay(), append(append(slices.Clone(connected), liveTo(0, 1)...),
			seqStep{in: "live", seq: 4, want: []string{"gap", "replay 2"}},
			seqStep{in: "rbatch", seq: 2, want: []string{"enqueue 2"}},
			seqStep{in: "rend", want: []string{"done ok", "gap", "replay 3"}},
			seqStep{in: "rend", want: []string{"clear replay_truncated", "done truncated", "enqueue 4"}, state: "resyncing settled quiet"},
		)},
		{"a replay that fails falls back to the quiet window", withReplay(), append(append(slices.Clone(connected), liveTo(0, 0)...),
			seqStep{in: "live", seq: 2, want: []string{"gap", "replay 1"}},
			seqStep{in: "live", seq: 3, want: nil},
			seqStep{in: "rfail", at: time.Second, want: []string{"done failed", "clear replay_failed", "enqueue 2 live", "enqueue 3 live"}, state: "resyncing settled quiet"},
			seqStep{in: "live", seq: 5, at: 2 * time.Second, want: []string{"gap", "replay 4"}, state: "replaying settled quiet"},
		)},
		{"the first warm-up settles even when its replay fails", withReplay(), []seqStep{
			{in: "start", want: []string{"clear"}},
			{in: "connect", want: []string{"clear connect", "replay 0"}, state: "replaying"},
			{in: "rfail", want: []string{"done failed", "clear replay_failed"}, state: "resyncing settled quiet"},
		}},
		{"live batches overflowing the replay buffer are dropped and replayed", seqConfig{replay: true, replayBuffer: 1, resyncQuiet: time.Second}, []seqStep{
			{in: "start", want: []string{"clear"}},
			{in: "connect", want: []string{"clear connect", "replay 0"}},
			{in: "live", seq: 7, want: nil},
			{in: "live", seq: 8, want: []string{"replay_overflow"}, state: "replaying"},
			{in: "rbatch", seq: 0, want: []string{"enqueue 0"}},
			{in: "rend", want: []string{"done ok", "gap", "replay 1"}},
			{in: "rbatch", seq: 1, want: []string{"enqueue 1"}},
			{in: "rbatch", seq: 2, want: []string{"enqueue 2"}},
			{in: "rend", want: []string{"done ok", "gap", "replay 3"}}, // pending holds 8, 3..7 missing
			{in: "rbatch", seq: 3, want: []string{"enqueue 3"}},
			{in: "rbatch", seq: 4, want: []string{"enqueue 4"}},
			{in: "rbatch", seq: 5, want: []string{"enqueue 5"}},
			{in: "rbatch", seq: 6, want: []string{"enqueue 6"}},
			{in: "rbatch", seq: 7, want: []string{"enqueue 7"}},
			{in: "rbatch", seq: 8, want: []string{"enqueue 8"}},
			{in: "rend", want: []string{"done ok", "caughtup replay"}, state: "live caught settled"},
		}},
		{"a replay that fails without progress falls back", seqConfig{replay: true, replayBuffer: 4, resyncQuiet: time.Second}, []seqStep{
			{in: "start", want: []string{"clear"}},
			{in: "connect", want: []string{"clear connect", "replay 0"}},
			{in: "live", seq: 7, want: nil},
			{in: "rfail", want: []string{"done failed", "clear replay_failed", "enqueue 7 live"}, state: "resyncing settled quiet"},
		}},
		{"a gap without replay clears and waits for the quiet window", noReplay(), []seqStep{
			{in: "start", want: []string{"clear"}},
			{in: "connect", want: []string{"clear connect"}, state: "resyncing settled quiet"},
			{in: "live", seq: 0, want: []string{"caughtup stream_from_zero", "enqueue 0 live"}, state: "live caught settled"},
			{in: "live", seq: 2, at: 5 * time.Second, want: []string{"gap", "clear gap", "enqueue 2 live"}, state: "resyncing settled quiet"},
			{in: "live", seq: 4, at: 20 * time.Second, want: []string{"gap", "clear gap", "enqueue 4 live"}}, // restarts the window
			{in: "tick", at: 40 * time.Second, want: nil},
			{in: "tick", at: 50 * time.Second, want: []string{"caughtup quiet_window"}, state: "live caught settled"},
		}},
		{"a stream joined mid-way without replay is not caught up", noReplay(), []seqStep{
			{in: "start", want: []string{"clear"}},
			{in: "connect", want: []string{"clear connect"}},
			{in: "live", seq: 9, want: []string{"enqueue 9 live"}, state: "resyncing settled quiet"},
		}},
		{"sequence going backwards is a restart: clear and replay from 0", withReplay(), append(append(slices.Clone(connected), liveTo(0, 3)...),
			seqStep{in: "live", seq: 1, body: "new", want: []string{"restart 1<4", "clear restart", "replay 0"}, state: "replaying settled"},
			seqStep{in: "rbatch", seq: 0, want: []string{"enqueue 0"}},
			seqStep{in: "rend", want: []string{"done ok", "enqueue 1", "caughtup replay"}, state: "live caught settled"},
		)},
		{"a restart without replay clears and relearns from the live stream", noReplay(), []seqStep{
			{in: "start", want: []string{"clear"}},
			{in: "connect", want: []string{"clear connect"}},
			{in: "live", seq: 0, want: []string{"caughtup stream_from_zero", "enqueue 0 live"}},
			{in: "live", seq: 1, want: []string{"enqueue 1 live"}},
			{in: "live", seq: 0, body: "other", want: []string{"restart 0<2", "clear restart", "caughtup stream_from_zero", "enqueue 0 live"}, state: "live caught settled"},
		}},
		{"a live copy of an applied batch is a duplicate", withReplay(), append(append(slices.Clone(connected), liveTo(0, 3)...),
			seqStep{in: "live", seq: 2, want: nil, state: "live caught settled"},
		)},
		{"a reconnect after a loss warms up again; a connection without a loss does not", withReplay(), append(append(slices.Clone(connected), liveTo(0, 1)...),
			seqStep{in: "connect", want: nil, state: "live caught settled"},
			seqStep{in: "disconnect"},
			seqStep{in: "connect", want: []string{"clear reconnect", "replay 0"}, state: "replaying settled"},
		)},
		{"a worker overflow warms up", withReplay(), append(append(slices.Clone(connected), liveTo(0, 1)...),
			seqStep{in: "overflow", want: []string{"clear overflow", "replay 0"}, state: "replaying settled"},
		)},
		{"a decode error clears and waits for the quiet window", withReplay(), append(append(slices.Clone(connected), liveTo(0, 1)...),
			seqStep{in: "decode", want: []string{"clear decode_error"}, state: "resyncing settled quiet"},
			seqStep{in: "live", seq: 2, want: []string{"enqueue 2 live"}},
		)},
		{"an engine that never connects settles readiness at the deadline", withReplay(), []seqStep{
			{in: "start", want: []string{"clear"}},
			{in: "tick", at: time.Second, want: nil, state: "connecting"},
			{in: "tick", at: 2 * time.Second, want: []string{"unreachable"}, state: "connecting settled"},
			{in: "tick", at: 3 * time.Second, want: nil},
			{in: "connect", at: 4 * time.Second, want: []string{"clear connect", "replay 0"}, state: "replaying settled"},
		}},
		{"a new session forgets an unfinished replay", withReplay(), []seqStep{
			{in: "start", want: []string{"clear"}},
			{in: "connect", want: []string{"clear connect", "replay 0"}},
			{in: "start", want: []string{"clear"}, state: "connecting"},
			{in: "rend", want: nil, state: "connecting"},
			{in: "rbatch", seq: 0, want: nil},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			runSeq(t, newSequencer(c.cfg), c.steps)
		})
	}
}

// Sequence state the replica reports: last sequence queued and the reason
// of the last resync.
func TestSequencerReportsLastSeqAndReason(t *testing.T) {
	q := newSequencer(noReplay())
	q.Start(t0)
	q.Connected(t0)
	if q.hasSeq {
		t.Fatal("hasSeq before any batch")
	}
	q.Live(t0, liveMsg{0, []byte("a")})
	q.Live(t0, liveMsg{1, []byte("b")})
	if !q.hasSeq || q.lastSeq != 1 || q.reason != "connect" {
		t.Fatalf("hasSeq %v lastSeq %d reason %q", q.hasSeq, q.lastSeq, q.reason)
	}
	q.Live(t0, liveMsg{5, []byte("c")})
	if q.lastSeq != 5 || q.reason != "gap" {
		t.Fatalf("lastSeq %d reason %q", q.lastSeq, q.reason)
	}
}

// A late live copy of a replayed batch is a duplicate; a different batch
// under an old sequence number is a restart.
func TestSequencerDuplicateVersusRestart(t *testing.T) {
	q := newSequencer(withReplay())
	for i := range uint64(5) {
		q.enqueue(liveMsg{i, []byte(fmt.Sprintf("batch-%d", i))}, false)
	}
	if !q.isDup(liveMsg{3, []byte("batch-3")}) {
		t.Error("replayed twin not recognised")
	}
	if q.isDup(liveMsg{3, []byte("other")}) || q.isDup(liveMsg{7, []byte("batch-7")}) {
		t.Error("different batch taken for a duplicate")
	}
}

// A catch-up reports where it stands: first and next sequence, rounds,
// batches replayed, live batches waiting.
func TestSequencerProgress(t *testing.T) {
	q := newSequencer(withReplay())
	if _, ok := q.Progress(); ok {
		t.Fatal("progress without a replay")
	}
	q.Start(t0)
	q.Connected(t0)
	q.ReplayBatch(t0, liveMsg{0, []byte("a")})
	q.ReplayBatch(t0, liveMsg{1, []byte("b")})
	q.Live(t0, liveMsg{9, []byte("x")})
	q.ReplayBatch(t0, liveMsg{3, []byte("d")}) // a lost reply: round 2 from 2
	p, ok := q.Progress()
	want := ReplayProgress{From: 0, Next: 2, Rounds: 2, Batches: 2, Pending: 1}
	if !ok || p != want {
		t.Fatalf("progress %+v, want %+v", p, want)
	}
	if q.RoundApplied() != 0 {
		t.Fatalf("round applied %d", q.RoundApplied())
	}
}

// The sequencer under any sequence of inputs: it never panics, and within
// an epoch (between two clears) the batches it queues are consecutive
// sequence numbers, each at most once; a caught-up replica has no catch-up
// outstanding unless a gap replay runs; settled never goes back.
func FuzzSequencer(f *testing.F) {
	f.Add([]byte{0, 1, 3, 3, 3, 4, 5, 2, 6, 7, 3, 9, 9})
	f.Add([]byte{0, 1, 4, 10, 4, 11, 4, 13, 5, 2, 1, 8, 3, 3, 3, 3, 3})
	f.Add([]byte{0, 1, 3, 0, 3, 1, 3, 2, 2, 9, 5, 3, 5, 2, 6, 7, 8, 9})
	f.Fuzz(func(t *testing.T, in []byte) {
		cfg := withReplay()
		if len(in) > 0 && in[0]&1 == 1 {
			cfg.replay = false
		}
		cfg.replayBuffer = 3
		q := newSequencer(cfg)
		now := t0
		var last uint64
		haveLast, settled := false, false
		for i := 0; i+1 < len(in); i += 2 {
			op, arg := in[i]%10, uint64(in[i+1]%16)
			now = now.Add(time.Duration(arg) * time.Second)
			msg := liveMsg{arg, []byte{byte(arg), in[i] / 10}}
			var acts []action
			switch op {
			case 0:
				acts = q.Start(now)
			case 1:
				acts = q.Connected(now)
			case 2:
				q.Disconnected()
			case 3:
				acts = q.Live(now, msg)
			case 4:
				acts = q.ReplayBatch(now, msg)
			case 5:
				acts = q.ReplayEnd(now)
			case 6:
				acts = q.ReplayFailed(now)
			case 7:
				acts = q.Overflow(now)
			case 8:
				acts = q.DecodeError(now)
			case 9:
				acts = q.Tick(now)
			}
			for _, a := range acts {
				switch a.kind {
				case actClear:
					haveLast = false
				case actEnqueue:
					if haveLast && a.msg.seq != last+1 {
						t.Fatalf("input %v: queued seq %d after %d in one epoch", in[:i+2], a.msg.seq, last)
					}
					last, haveLast = a.msg.seq, true
				}
			}
			if settled && !q.settled {
				t.Fatal("settled went back")
			}
			settled = q.settled
			if q.caughtUp && q.state != stLive && q.state != stReplaying {
				t.Fatalf("input %v: caught up in state %v", in[:i+2], q.state)
			}
		}
	})
}

// While a replay is outstanding the quiet window's timer does not run (the
// subscriber would otherwise wake every millisecond on a window that
// cannot end); once the replay ends it runs again from where it started.
func TestSequencerQuietTimerWaitsForReplay(t *testing.T) {
	q := newSequencer(withReplay())
	runSeq(t, q, append(append(slices.Clone(connected), liveTo(0, 1)...),
		seqStep{in: "live", seq: 3, want: []string{"gap", "replay 2"}},
		seqStep{in: "decode", at: time.Second, want: []string{"clear decode_error"}},
	))
	if at, ok := q.NextTimer(); ok {
		t.Fatalf("timer at %v while the replay is outstanding", at.Sub(t0))
	}
	runSeq(t, q, []seqStep{
		{in: "rbatch", seq: 2, at: 2 * time.Second, want: []string{"enqueue 2"}},
		{in: "rend", at: 2 * time.Second, want: []string{"done ok", "enqueue 3"}},
	})
	if at, ok := q.NextTimer(); !ok || at.Sub(t0) != 31*time.Second {
		t.Fatalf("timer at %v (%v), want the quiet window's end at 31s", at.Sub(t0), ok)
	}
}
