package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/pkg/kvblock"
)

// Segment is a run of Len deterministic tokens named by ID: equal IDs give
// equal tokens, so two prompts built from the same leading segments share
// exactly that prefix.
type Segment struct {
	ID  uint64
	Len int
}

// Turn is one request of a session.
type Turn struct {
	// Gap is, for a session's first turn, its arrival offset from the
	// session's Start; for a later turn, the think time between the
	// previous turn's last token and this turn's arrival (closed loop).
	Gap time.Duration
	// Append are the segments this turn adds to the conversation: the whole
	// prompt of a first turn, the new user message or tool output of a
	// later one. A later turn's prompt is the previous prompt, the tokens
	// the engine generated for it, then Append.
	Append []Segment
	// TraceIDs and TraceLen, when TraceIDs is not nil, give the prompt as a
	// Mooncake trace line does (hash ids of TraceBlock tokens each, expanded
	// with kvblock.ExpandTrace) instead of Append. TraceBlock 0 means
	// Mooncake's 512.
	TraceIDs   []int64
	TraceLen   int
	TraceBlock int
	// Output is the number of tokens to generate (max_tokens).
	Output int
	// Hidden is how many of the first generated tokens the next turn does
	// not resend: a reasoning model's thinking, which chat templates such
	// as Qwen3's and DeepSeek-R1's drop from earlier assistant turns, so
	// the next prompt is this one, the generated tokens after the first
	// Hidden, then the next turn's Append. 0 resends all of them.
	Hidden int
}

// hidden is how many of n generated tokens the next turn does not resend.
func (t Turn) hidden(n int) int { return min(max(t.Hidden, 0), n) }

// resent is what of a turn's generated tokens the next turn's prompt
// carries: all but the first Hidden.
func (t Turn) resent(generated []uint32) []uint32 { return generated[t.hidden(len(generated)):] }

// resentLen is resent's length for a turn that generated all of Output.
func (t Turn) resentLen() int { return t.Output - t.hidden(t.Output) }

// Session is a sequence of turns sent by one client, each after the
// previous one finished. A single-turn session is an open-loop request.
//
// ID is the conversation the session belongs to (the ground truth; several
// single-turn sessions of a trace may share one), which no request carries
// as such. What a request does carry is its client's habit: Key (an
// x-session-id header), User (only the OpenAI `user` field), or neither.
type Session struct {
	// Key is the session affinity key (x-session-id); empty for none.
	Key string
	// User is the OpenAI `user` field; empty for none.
	User  string
	ID    string
	Start time.Duration
	Turns []Turn
}

// Identity habits of clients, as the generators and the trace reader
// assign them: a conversation's client sends an x-session-id header with
// probability 0.4, only the OpenAI `user` field with probability 0.3, and
// nothing with probability 0.3. The choice is a hash of the conversation
// id, so it does not depend on the order sessions are built in.
const (
	identityHeaderShare = 0.4
	identityUserShare   = 0.3
)

// identify sets s.ID and, after the client's habit, s.Key or s.User.
func (s *Session) identify(id string) {
	s.ID = id
	h := xxh3.HashString("kvbench/identity\x00" + id)
	switch u := float64(h>>11) / (1 << 53); {
	case u < identityHeaderShare:
		s.Key = id
	case u < identityHeaderShare+identityUserShare:
		s.User = "user-" + id
	}
}

// Workload is a named, fully materialised list of sessions.
type Workload struct {
	Name     string
	Sessions []Session
}

// Requests returns the number of requests (turns) of w.
func (w *Workload) Requests() int {
	n := 0
	for _, s := range w.Sessions {
		n += len(s.Turns)
	}
	return n
}

// Expand returns the tokens of segs.
func Expand(dst []uint32, segs []Segment) []uint32 {
	n := 0
	for _, s := range segs {
		n += s.Len
	}
	dst = slices.Grow(dst, n)
	for _, s := range segs {
		for i := range s.Len {
			dst = append(dst, segToken(s.ID, uint64(i)))
		}
	}
	return dst
}

// segToken derives a token id in [1024, 2^17) from a segment id and an
// offset (SplitMix64), away from the small ids special tokens use.
func segToken(id, off uint64) uint32 {
	z := id*0xd1342543de82ef95 + off*0x9e3779b97f4a7c15 + 0x2545f4914f6cdd1d
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return 1024 + uint32(z%(1<<17-1024))
}

// traceLine is one line of a Mooncake-format trace.
type traceLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      []int64  `json:"hash_ids"`
}

// ErrTrace classifies trace parse errors; the message names the line.
var ErrTrace = errors.New("trace")

// TraceOptions shape a trace into a workload.
type TraceOptions struct {
	// RateScale multiplies the arrival rate (timestamps are divided by it);
	// 0 means 1.
	RateScale float64
	// Offset skips the trace's first Offset requests: the workload is the
	// window that starts there, its times counted from its first request.
	Offset int
	// Limit keeps only the first Limit requests (of the window); 0 keeps
	// all.
	Limit int
	// Window, when not 0 and with a Limit, replays seed Window's window
	// of Limit requests instead of the first Limit (TraceWindow over the
	// requests after Offset): the whole trace is read to know its length.
	Window uint64
	// BlockTokens is the number of tokens a hash id stands for. 0 finds it:
	// Mooncake's 512 when every line fits it, otherwise the one block size
	// every line's hash_ids count fits (traces cut at 16-, 32- or 64-token
	// blocks, as other trace tools write them).
	BlockTokens int
	// Repeat replays the (limited) trace Repeat times back to back; 0 or 1
	// reads it once. Copy k starts one mean inter-arrival gap after copy
	// k-1's last request and has its hash ids shifted past every id of the
	// copies before it, so copies share no prefix: the same traffic shape,
	// k times as long.
	Repeat int
}

// TraceWindow is where seed's window of limit requests starts in a trace
// of total requests: frac((seed-1)·φ') of the total - limit + 1 possible
// starts, φ' = 0.618... (the golden ratio's fraction). Seed 1 starts at
// the trace's first request, and successive seeds spread their starts
// evenly over the trace: the gaps between any first k starts take at most
// three sizes (the three-gap theorem). With no room for a second window
// (limit 0 or at least total) every seed starts at 0.
func TraceWindow(seed uint64, total, limit int) int {
	starts := total - limit + 1
	if limit <= 0 || starts <= 1 || seed == 0 {
		return 0
	}
	const phi = 0.6180339887498949
	_, frac := math.Modf(float64(seed-1) * phi)
	return min(starts-1, int(frac*float64(starts)))
}

// ReadTraceFile reads a Mooncake-format trace from path (see ReadTrace).
func ReadTraceFile(path string, opt TraceOptions) (*Workload, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTrace, err)
	}
	defer f.Close()
	w, err := ReadTrace(f, opt)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return w, nil
}

type traceReq struct {
	at           float64 // ms
	input, outpt int
	ids          []int64
}

// ReadTrace parses a Mooncake-format trace: one JSON object a line with
// timestamp (ms, non-decreasing), input_length, output_length and hash_ids
// (prefix block ids, ceil(input_length/B) of them for a block size of B
// tokens: 512 in Mooncake's traces; see TraceOptions.BlockTokens). Blank lines
// are skipped; unknown fields are ignored. A bad line is an error wrapping
// ErrTrace that names the line number and the field.
//
// Every request becomes a single-turn session (the trace's timing is open
// loop). The trace has no session ids; conversations are rebuilt from the
// prefixes, as a multi-turn conversation resends its history: a request
// continues the conversation of the earlier request whose full blocks (all
// its hash ids but a partial last one) are the longest prefix of its own,
// provided only that request's conversation holds that prefix among its
// requests' full blocks (a prefix several conversations hold is a shared
// system prompt or document, not one conversation's history) and no other
// request continued that one already; otherwise it starts a conversation.
// The ambiguity left: requests whose full blocks are exactly a shared
// prefix (a system prompt followed by less than one block) are
// indistinguishable from one conversation's turns, and are joined into the
// conversation of the first of them.
// The conversation's id (its first request's index) is the session's ID,
// and its Key or User are set after the client habits of Session.
func ReadTrace(r io.Reader, opt TraceOptions) (*Workload, error) {
	scale := opt.RateScale
	if scale == 0 {
		scale = 1
	}
	if !(scale > 0) || math.IsInf(scale, 0) {
		return nil, fmt.Errorf("%w: rate scale %v must be a positive number", ErrTrace, scale)
	}
	if opt.Repeat < 0 || opt.Limit < 0 || opt.Offset < 0 {
		return nil, fmt.Errorf("%w: offset %d, limit %d and repeat %d must not be negative", ErrTrace, opt.Offset, opt.Limit, opt.Repeat)
	}
	if opt.BlockTokens < 0 {
		return nil, fmt.Errorf("%w: block size %d must not be negative", ErrTrace, opt.BlockTokens)
	}
	var reqs []traceReq
	fit := blockFit{lo: 1, hi: math.MaxInt}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	line := 0
	last := math.Inf(-1)
	var maxID int64 = -1
	skipped := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("%w: line %d: %s", ErrTrace, line, fmt.Sprintf(format, args...))
		}
		var tl traceLine
		if err := json.Unmarshal([]byte(text), &tl); err != nil {
			return nil, bad("%v", err)
		}
		switch {
		case tl.Timestamp == nil:
			return nil, bad("missing timestamp")
		case tl.InputLength == nil:
			return nil, bad("missing input_length")
		case tl.OutputLength == nil:
			return nil, bad("missing output_length")
		case math.IsNaN(*tl.Timestamp) || *tl.Timestamp < 0:
			return nil, bad("timestamp %v must be >= 0", *tl.Timestamp)
		case *tl.Timestamp < last:
			return nil, bad("timestamp %v is before the previous line's %v", *tl.Timestamp, last)
		case *tl.InputLength <= 0:
			return nil, bad("input_length %d must be positive", *tl.InputLength)
		case *tl.OutputLength <= 0:
			return nil, bad("output_length %d must be positive", *tl.OutputLength)
		case opt.BlockTokens > 0 && len(tl.HashIDs) != (*tl.InputLength+opt.BlockTokens-1)/opt.BlockTokens:
			return nil, bad("%d hash_ids for input_length %d (want ceil(%d/%d) = %d)",
				len(tl.HashIDs), *tl.InputLength, *tl.InputLength, opt.BlockTokens,
				(*tl.InputLength+opt.BlockTokens-1)/opt.BlockTokens)
		case opt.BlockTokens <= 0 && !fit.narrow(len(tl.HashIDs), *tl.InputLength):
			return nil, bad("%d hash_ids for input_length %d fit no block size that the lines before fit (%s)",
				len(tl.HashIDs), *tl.InputLength, fit)
		}
		for _, id := range tl.HashIDs {
			if id < 0 {
				return nil, bad("hash id %d must not be negative", id)
			}
			maxID = max(maxID, id)
		}
		last = *tl.Timestamp
		if skipped < opt.Offset {
			skipped++
			continue
		}
		reqs = append(reqs, traceReq{at: *tl.Timestamp, input: *tl.InputLength, outpt: *tl.OutputLength, ids: tl.HashIDs})
		if opt.Limit > 0 && opt.Window == 0 && len(reqs) >= opt.Limit {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: line %d: %w", ErrTrace, line+1, err)
	}
	if len(reqs) == 0 {
		if opt.Offset > 0 {
			return nil, fmt.Errorf("%w: no requests after the first %d (the trace has %d)", ErrTrace, opt.Offset, skipped)
		}
		return nil, fmt.Errorf("%w: no requests", ErrTrace)
	}
	shifted := opt.Offset > 0
	if opt.Window != 0 && opt.Limit > 0 {
		off := TraceWindow(opt.Window, len(reqs), opt.Limit)
		reqs = reqs[off:min(len(reqs), off+opt.Limit)]
		shifted = shifted || off > 0
	}
	if t0 := reqs[0].at; shifted {
		for i := range reqs {
			reqs[i].at -= t0
		}
	}
	if n := len(reqs); opt.Repeat > 1 {
		gap := 0.0
		if n > 1 {
			gap = (reqs[n-1].at - reqs[0].at) / float64(n-1)
		}
		period := reqs[n-1].at - reqs[0].at + gap
		if maxID >= math.MaxInt64/int64(opt.Repeat) {
			return nil, fmt.Errorf("%w: hash ids up to %d leave no room for %d copies", ErrTrace, maxID, opt.Repeat)
		}
		for k := 1; k < opt.Repeat; k++ {
			shift := int64(k) * (maxID + 1)
			for _, q := range reqs[:n] {
				ids := make([]int64, len(q.ids))
				for i, id := range q.ids {
					ids[i] = id + shift
				}
				reqs = append(reqs, traceReq{at: q.at + float64(k)*period, input: q.input, outpt: q.outpt, ids: ids})
			}
		}
	}
	block := opt.BlockTokens
	if block <= 0 {
		block = fit.pick()
	}
	w := &Workload{Name: "trace"}
	conv := traceConversations(reqs, block)
	for i, q := range reqs {
		s := Session{
			Start: time.Duration(q.at / scale * float64(time.Millisecond)),
			Turns: []Turn{{TraceIDs: q.ids, TraceLen: q.input, TraceBlock: block, Output: q.outpt}},
		}
		s.identify("conv-" + strconv.Itoa(conv[i]))
		w.Sessions = append(w.Sessions, s)
	}
	return w, nil
}

// blockFit is the range of block sizes, in tokens, that every trace line
// read so far fits: n hash ids for an input of L tokens fit a block size B
// when ceil(L/B) = n, that is ceil(L/n) <= B <= floor((L-1)/(n-1)).
type blockFit struct{ lo, hi int }

// narrow keeps the block sizes that a line of n hash ids for input tokens
// also fits and reports true, or reports false and keeps f when none is
// left.
func (f *blockFit) narrow(n, input int) bool {
	if n <= 0 {
		return false
	}
	g := blockFit{lo: max(f.lo, (input+n-1)/n), hi: f.hi}
	if n > 1 {
		g.hi = min(g.hi, (input-1)/(n-1))
	}
	if g.lo > g.hi {
		return false
	}
	*f = g
	return true
}

// pick is the block size taken for the trace: Mooncake's 512 when it fits,
// otherwise the smallest power of two that fits (block sizes are powers of
// two in every engine), otherwise the smallest that fits.
func (f blockFit) pick() int {
	if f.lo <= kvblock.TraceBlockTokens && kvblock.TraceBlockTokens <= f.hi {
		return kvblock.TraceBlockTokens
	}
	for b := 1; b > 0 && b <= f.hi; b *= 2 {
		if b >= f.lo {
			return b
		}
	}
	return f.lo
}

func (f blockFit) String() string {
	if f.hi == math.MaxInt {
		return fmt.Sprintf("at least %d tokens", f.lo)
	}
	return fmt.Sprintf("%d to %d tokens", f.lo, f.hi)
}

// traceConversations assigns each request the index of its conversation's
// first request (see ReadTrace); block is the trace's block size in tokens.
func traceConversations(reqs []traceReq, block int) []int {
	conv := make([]int, len(reqs))
	// ends maps the hash id of a request's last full block (which names its
	// whole full-block prefix) to the latest such request not yet continued.
	ends := make(map[int64]int)
	// holder is the conversation whose requests alone hold a block id
	// among their full blocks, -1 when several conversations hold it.
	holder := make(map[int64]int)
	for j, q := range reqs {
		conv[j] = j
		for d := len(q.ids); d >= 1; d-- {
			n := q.ids[d-1]
			if i, ok := ends[n]; ok && holder[n] == conv[i] {
				conv[j] = conv[i]
				delete(ends, n)
				break
			}
		}
		full := q.input / block
		for _, n := range q.ids[:full] {
			if c, ok := holder[n]; !ok {
				holder[n] = conv[j]
			} else if c != conv[j] {
				holder[n] = -1
			}
		}
		if full >= 1 {
			ends[q.ids[full-1]] = j
		}
	}
	return conv
}
