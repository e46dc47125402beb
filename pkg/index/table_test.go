package index

import (
	"math/rand/v2"
	"testing"
	"unsafe"
)

// checkSub verifies the Robin Hood invariant of every sub-table of t: each
// entry sits at or after its home with every slot between occupied, and
// along a cluster the entries' homes never go down (so a find may stop at
// the first entry nearer its home than the key would be).
func checkSub(t *testing.T, x *xtab) {
	t.Helper()
	// Every directory entry is its sub-table's copy (matchers and
	// prefetchDir read the entry alone).
	for di, sb := range x.subs {
		d := x.dir[di]
		if d.s != unsafe.Pointer(unsafe.SliceData(sb.s)) || int(d.c) != len(sb.s) || d.ld != sb.ld {
			t.Fatalf("directory entry %d is stale: %d slots, depth %d; sub-table has %d, %d", di, d.c, d.ld, len(sb.s), sb.ld)
		}
	}
	n := 0
	for di, sb := range x.subs {
		if di&(1<<(x.gd-sb.ld)-1) != 0 {
			continue
		}
		c := len(sb.s)
		cnt := 0
		for i := range sb.s {
			if !x.occupied(&sb.s[i], sb.s[i].v) {
				continue
			}
			cnt++
			d := x.disp(sb, i)
			for k := 1; k <= d; k++ {
				j := (i - k + c) % c
				if !x.occupied(&sb.s[j], sb.s[j].v) {
					t.Fatalf("slot %d (disp %d): slot %d before it is empty", i, d, j)
				}
			}
			p := (i - 1 + c) % c
			if x.occupied(&sb.s[p], sb.s[p].v) && x.disp(sb, p)+1 < d {
				t.Fatalf("slot %d has disp %d after disp %d: homes out of order", i, d, x.disp(sb, p))
			}
		}
		if cnt != sb.n {
			t.Fatalf("sub-table counts %d entries, holds %d", sb.n, cnt)
		}
		n += cnt
	}
	if n != x.n {
		t.Fatalf("table counts %d entries, holds %d", x.n, n)
	}
}

// TestTableInsertRemove drives one key table through growth, splits,
// removals and shrinking against a Go map, checking the Robin Hood
// invariant (insertion shifts runs, wrapping past the end of small
// sub-tables) and every lookup.
func TestTableInsertRemove(t *testing.T) {
	var e env
	x := newXtab(keyKind, &e)
	r := rand.New(rand.NewPCG(1, 2))
	want := map[uint64]uint64{}
	var keys []uint64
	for step := range 60_000 {
		if len(keys) > 0 && r.IntN(3) == 0 {
			j := r.IntN(len(keys))
			k := keys[j]
			keys[j] = keys[len(keys)-1]
			keys = keys[:len(keys)-1]
			s := x.find(k)
			if s == nil {
				t.Fatalf("step %d: key %x lost", step, k)
			}
			x.remove(s, false)
			delete(want, k)
		} else {
			k := r.Uint64() | 1
			if _, dup := want[k]; dup {
				continue
			}
			v := r.Uint64() | 1
			if s := x.insert(k, v); s.k != k || s.v != v {
				t.Fatalf("step %d: insert returned slot %x/%x, want %x/%x", step, s.k, s.v, k, v)
			}
			want[k] = v
			keys = append(keys, k)
		}
		if step%997 == 0 {
			checkSub(t, &x)
		}
	}
	checkSub(t, &x)
	for k, v := range want {
		if s := x.find(k); s == nil || s.v != v {
			t.Fatalf("key %x: want %x, found %v", k, v, s)
		}
	}
	for range 10_000 {
		if k := r.Uint64() | 1; want[k] == 0 && x.find(k) != nil {
			t.Fatalf("absent key %x found", k)
		}
	}
	if x.gd == 0 {
		t.Fatalf("the table never split (%d entries)", x.n)
	}
}
