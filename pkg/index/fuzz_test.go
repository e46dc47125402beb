package index

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// byteSource feeds a workload's random choices from fuzz input; it reports
// exhaustion so the operation sequence ends with the input.
type byteSource struct {
	b    []byte
	done bool
	n    uint64
}

func (s *byteSource) Uint64() uint64 {
	if len(s.b) == 0 {
		// Exhausted: keep drawing varied values (rejection sampling must
		// terminate) until the current operation ends.
		s.done = true
		s.n++
		return mix(s.n)
	}
	var buf [8]byte
	n := copy(buf[:], s.b)
	s.b = s.b[min(n, 3):] // consume a few bytes per draw: short inputs still make many ops
	return binary.LittleEndian.Uint64(buf[:])
}

// FuzzOps decodes an operation sequence (stores extending chains, removals,
// clears, matches) from the input and checks the index against the
// brute-force model after every operation. With the first byte odd the index
// runs under a small budget and matches may only be shorter than the truth.
func FuzzOps(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte("\x01stored removed cleared matched; stored removed cleared matched"))
	seed := make([]byte, 600)
	r := rand.New(rand.NewPCG(1, 1))
	for i := range seed {
		seed[i] = byte(r.Uint32())
	}
	f.Add(seed)
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		budget := data[0]&1 == 1
		w := newWorkload(5, 6, 8, 12, 2)
		src := &byteSource{b: data[1:]}
		w.r = rand.New(src)
		w.maxRun = 8
		cfg := Config{}
		if budget {
			cfg.MaxBytes = 8 << 10
			w.evicting = true
		}
		ix, m := New(cfg), newModel()
		for op := 0; !src.done && op < 2000; op++ {
			w.step(t, ix, m)
			q := w.query()
			got, want := ix.Match(q, nil), m.match(q)
			if !budget {
				checkMatch(t, ix, m, q, op)
				continue
			}
			for _, g := range got {
				if d := depthOf(want, g.Replica); g.Blocks > d {
					t.Fatalf("op %d: %s matched %d, truth %d", op, g.Replica, g.Blocks, d)
				}
			}
		}
		checkInvariants(t, ix)
		if !budget {
			checkStats(t, ix, m, -1)
		}
	})
}
