package extproc

import (
	"errors"
	"sync"
	"time"

	"github.com/kvroute/kvroute/pkg/route"
)

// Recorded is one routing decision of the history: when it was made and
// the decision as an explanation (route.Decision.Detached).
type Recorded struct {
	At       time.Time
	Decision route.Decision
}

// history keeps the newest routing decisions in a ring
// (Config.DecisionHistory). Safe for concurrent use; one short critical
// section per decision.
type history struct {
	mu    sync.Mutex
	ring  []Recorded
	total uint64 // decisions recorded since start; the next slot is total % len(ring)
}

func newHistory(n int) *history {
	if n <= 0 {
		return nil
	}
	return &history{ring: make([]Recorded, n)}
}

func (h *history) add(at time.Time, d route.Decision) {
	if h == nil {
		return
	}
	d = d.Detached()
	h.mu.Lock()
	h.ring[h.total%uint64(len(h.ring))] = Recorded{At: at, Decision: d}
	h.total++
	h.mu.Unlock()
}

// recent returns up to limit of the newest decisions, oldest first (limit
// <= 0: every one kept), and how many were recorded since start.
func (h *history) recent(limit int) ([]Recorded, uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := min(h.total, uint64(len(h.ring)))
	if limit > 0 && uint64(limit) < n {
		n = uint64(limit)
	}
	out := make([]Recorded, 0, n)
	for i := h.total - n; i < h.total; i++ {
		out = append(out, h.ring[i%uint64(len(h.ring))])
	}
	return out, h.total
}

// ErrNoHistory is Decisions' error when the server keeps no history
// (Config.DecisionHistory is 0).
var ErrNoHistory = errors.New("extproc: no decision history is kept (Config.DecisionHistory is 0)")

// Decisions returns up to limit of the newest routing decisions this server
// made, oldest first (limit <= 0: every one kept), and how many it made
// since it started; ErrNoHistory without Config.DecisionHistory. Explain
// decisions are not recorded.
func (s *Server) Decisions(limit int) ([]Recorded, uint64, error) {
	if s.history == nil {
		return nil, 0, ErrNoHistory
	}
	recs, total := s.history.recent(limit)
	return recs, total, nil
}
