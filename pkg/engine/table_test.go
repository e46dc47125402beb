package engine

import (
	"math/rand/v2"
	"testing"
)

// TestLocTableMatchesMap drives the location table and a map with the same
// random sets and deletes (few distinct hashes, small table: long probe runs
// that wrap around, hash 0 included) and compares them after every step.
func TestLocTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, distinct := range []int{5, 40, 200} {
		tab := newLocTable(distinct)
		model := map[uint64]where{}
		keys := make([]uint64, distinct)
		for i := range keys {
			keys[i] = rng.Uint64()
		}
		keys[0] = 0
		for step := range 20000 {
			h := keys[rng.IntN(len(keys))]
			id := int32(rng.IntN(3)) - 1 // -1, 0 or 1
			w, ok := model[h]
			if !ok {
				w = where{-1, -1}
			}
			if rng.IntN(2) == 0 {
				tab.setGPU(h, id)
				w.gpu = id
			} else {
				tab.setCPU(h, id)
				w.cpu = id
			}
			if w.gpu < 0 && w.cpu < 0 {
				delete(model, h)
			} else {
				model[h] = w
			}
			if tab.n != len(model) {
				t.Fatalf("distinct %d step %d: %d entries, model %d", distinct, step, tab.n, len(model))
			}
			ngpu, ncpu := 0, 0
			for _, k := range keys {
				got, gok := tab.get(k)
				want, wok := model[k]
				if !wok {
					want = where{-1, -1}
				}
				if got != want || gok != wok {
					t.Fatalf("distinct %d step %d: get(%x) = %v %v, want %v %v", distinct, step, k, got, gok, want, wok)
				}
				if want.gpu >= 0 {
					ngpu++
				}
				if want.cpu >= 0 {
					ncpu++
				}
			}
			if tab.ngpu != ngpu || tab.ncpu != ncpu {
				t.Fatalf("distinct %d step %d: counts gpu %d cpu %d, want %d %d", distinct, step, tab.ngpu, tab.ncpu, ngpu, ncpu)
			}
		}
		seen := 0
		tab.each(func(h uint64, w where) {
			seen++
			if model[h] != w {
				t.Errorf("each: %x = %v, model %v", h, w, model[h])
			}
		})
		if seen != len(model) {
			t.Errorf("each visited %d, model has %d", seen, len(model))
		}
		tab.reset()
		if _, ok := tab.get(keys[1]); ok || tab.n != 0 {
			t.Errorf("reset left entries")
		}
	}
}
