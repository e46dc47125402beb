package policy

import (
	"encoding/binary"
	"math"
	"slices"
	"sync"

	"github.com/zeebo/xxh3"

	"github.com/kvroute/kvroute/pkg/index"
)

// Session is consistent hashing on Request.SessionKey: every candidate owns
// virtual_nodes points on a hash ring (xxh3 of the replica id and the
// virtual node's index); a key goes to the owner of the first point at or
// after the key's xxh3 hash, walking on past ineligible replicas and, when
// bounded_load_factor c > 0, past replicas whose requests exceed c times the
// eligible mean. Ineligible replicas keep their points, so a replica that
// fails keeps its sessions' successors stable and takes them back when it
// recovers. Without a session key the least-loaded candidate wins
// ("no_session_key"). Session keeps its key affinity with a cold index.
// Costs are the candidates' order along the ring walk (0 for the pick).
//
// State: the ring is rebuilt only when the candidate set changes. Rings are
// cached by the candidates' replica ids in order (a 64-bit fingerprint,
// checked against the full id list); the cache holds up to maxRings rings
// (one per model's replica set, typically) and is cleared when full. It is
// guarded by a mutex, so a Session is safe for concurrent use.
type Session struct {
	vnodes int
	bound  float64

	mu    sync.Mutex
	rings map[uint64]*ring
}

const maxRings = 64

type ring struct {
	ids    []index.ReplicaID
	points []ringPoint // sorted by hash
}

type ringPoint struct {
	hash uint64
	cand int32 // index into the candidate slice the ring was built from
}

func (c SessionConfig) resolve() (*Session, error) {
	s := &Session{vnodes: c.VirtualNodes, bound: c.BoundedLoadFactor}
	if s.vnodes == 0 {
		s.vnodes = DefaultVirtualNodes
	}
	if s.vnodes < 0 || s.vnodes > 1<<16 {
		return nil, fieldErr("session.virtual_nodes", float64(s.vnodes), "in [1, 65536]")
	}
	if math.IsNaN(s.bound) || math.IsInf(s.bound, 0) || (s.bound != 0 && s.bound < 1) {
		return nil, fieldErr("session.bounded_load_factor", s.bound, "0 (off) or a finite number >= 1")
	}
	return s, nil
}

// NewSession returns the session policy with cfg's knobs (defaults applied).
func NewSession(cfg SessionConfig) (*Session, error) { return cfg.resolve() }

// Name implements Policy.
func (s *Session) Name() string { return NameSession }

// Pick implements Policy.
func (s *Session) Pick(req Request, cands []Candidate, env Env) Result {
	if !anyEligible(cands) {
		return none()
	}
	if req.SessionKey == "" {
		return Result{Pick: leastLoaded(cands, env), Reason: ReasonNoSessionKey, Costs: loadCosts(cands)}
	}
	r := s.ring(cands)
	limit := math.Inf(1)
	if s.bound > 0 {
		sum, n := 0.0, 0
		for _, c := range cands {
			if eligible(c) {
				sum += float64(c.Load.Requests())
				n++
			}
		}
		limit = s.bound * sum / float64(n)
	}
	h := xxh3.HashString(req.SessionKey)
	start, _ := slices.BinarySearchFunc(r.points, h, func(p ringPoint, h uint64) int {
		switch {
		case p.hash < h:
			return -1
		case p.hash > h:
			return 1
		}
		return 0
	})
	costs := make([]float64, len(cands))
	for i := range costs {
		costs[i] = math.NaN()
	}
	pick, rank := -1, 0
	for k := range r.points {
		i := int(r.points[(start+k)%len(r.points)].cand)
		c := cands[i]
		if !eligible(c) || !math.IsNaN(costs[i]) {
			continue
		}
		if pick < 0 && float64(c.Load.Requests()) > limit {
			continue // over the load bound: its successors get a chance first
		}
		costs[i] = float64(rank)
		rank++
		if pick < 0 {
			pick = i
		}
	}
	// Replicas skipped for the bound rank after the others.
	for i, c := range cands {
		if eligible(c) && math.IsNaN(costs[i]) {
			costs[i] = float64(rank)
			rank++
		}
	}
	if pick < 0 { // every eligible replica is over the bound: cannot happen for c >= 1
		pick = leastLoaded(cands, env)
	}
	return Result{Pick: pick, Reason: ReasonSession, Costs: costs}
}

// ring returns the cached ring for the candidates' replica ids, building it
// when the set is new.
func (s *Session) ring(cands []Candidate) *ring {
	var fp [8]byte
	d := xxh3.New()
	for _, c := range cands {
		_, _ = d.WriteString(string(c.Replica))
		_, _ = d.Write([]byte{0})
	}
	key := d.Sum64()
	s.mu.Lock()
	r := s.rings[key]
	s.mu.Unlock()
	if r != nil && sameIDs(r.ids, cands) {
		return r
	}
	r = &ring{ids: make([]index.ReplicaID, len(cands)), points: make([]ringPoint, 0, len(cands)*s.vnodes)}
	var buf []byte
	for i, c := range cands {
		r.ids[i] = c.Replica
		for v := range s.vnodes {
			buf = append(buf[:0], c.Replica...)
			binary.LittleEndian.PutUint32(fp[:4], uint32(v))
			buf = append(buf, 0)
			buf = append(buf, fp[:4]...)
			r.points = append(r.points, ringPoint{hash: xxh3.Hash(buf), cand: int32(i)})
		}
	}
	slices.SortFunc(r.points, func(a, b ringPoint) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return int(a.cand - b.cand)
	})
	s.mu.Lock()
	if s.rings == nil || len(s.rings) >= maxRings {
		s.rings = make(map[uint64]*ring)
	}
	s.rings[key] = r
	s.mu.Unlock()
	return r
}

func sameIDs(ids []index.ReplicaID, cands []Candidate) bool {
	if len(ids) != len(cands) {
		return false
	}
	for i, c := range cands {
		if ids[i] != c.Replica {
			return false
		}
	}
	return true
}
