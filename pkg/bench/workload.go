package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

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
	// Mooncake trace line does (512-token hash ids, expanded with
	// kvblock.ExpandTrace) instead of Append.
	TraceIDs []int64
	TraceLen int
	// Output is the number of tokens to generate (max_tokens).
	Output int
}

// Session is a sequence of turns sent by one client, each after the
// previous one finished. A single-turn session is an open-loop request.
type Session struct {
	// Key is the session affinity key (x-session-id); empty for none.
	Key   string
	Start time.Duration
	Turns []Turn
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
	// Limit keeps only the first Limit requests; 0 keeps all.
	Limit int
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

// ReadTrace parses a Mooncake-format trace: one JSON object a line with
// timestamp (ms, non-decreasing), input_length, output_length and hash_ids
// (512-token prefix block ids, ceil(input_length/512) of them). Blank lines
// are skipped; unknown fields are ignored. Every request becomes a
// single-turn session whose key is its first hash id (the trace has no
// session ids; a conversation's turns share their first block). A bad line
// is an error wrapping ErrTrace that names the line number and the field.
func ReadTrace(r io.Reader, opt TraceOptions) (*Workload, error) {
	scale := opt.RateScale
	if scale == 0 {
		scale = 1
	}
	if !(scale > 0) || math.IsInf(scale, 0) {
		return nil, fmt.Errorf("%w: rate scale %v must be a positive number", ErrTrace, scale)
	}
	w := &Workload{Name: "trace"}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	line := 0
	last := math.Inf(-1)
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
		case len(tl.HashIDs) != (*tl.InputLength+kvblock.TraceBlockTokens-1)/kvblock.TraceBlockTokens:
			return nil, bad("%d hash_ids for input_length %d (want ceil(%d/%d) = %d)",
				len(tl.HashIDs), *tl.InputLength, *tl.InputLength, kvblock.TraceBlockTokens,
				(*tl.InputLength+kvblock.TraceBlockTokens-1)/kvblock.TraceBlockTokens)
		}
		last = *tl.Timestamp
		at := time.Duration(*tl.Timestamp / scale * float64(time.Millisecond))
		w.Sessions = append(w.Sessions, Session{
			Key:   "t" + strconv.FormatInt(tl.HashIDs[0], 10),
			Start: at,
			Turns: []Turn{{TraceIDs: tl.HashIDs, TraceLen: *tl.InputLength, Output: *tl.OutputLength}},
		})
		if opt.Limit > 0 && len(w.Sessions) >= opt.Limit {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: line %d: %w", ErrTrace, line+1, err)
	}
	if len(w.Sessions) == 0 {
		return nil, fmt.Errorf("%w: no requests", ErrTrace)
	}
	return w, nil
}
