package route

import (
	"math"
	"testing"
	"time"
)

// The work meter reads blocks per second over its window: a steady 100
// blocks a second reads about 100 once the window has passed, and the
// first burst reads its blocks over the lead-in, not over an instant.
func TestWorkMeterRate(t *testing.T) {
	var m workMeter
	t0 := time.Unix(100, 0)
	if r := m.rate(t0); r != 0 {
		t.Fatalf("empty meter reads %v", r)
	}
	m.add(t0, 800)
	if r := m.rate(t0); r > 800/workMeterLeadIn.Seconds()*1.1 {
		t.Errorf("first burst reads %v blocks/s, want about %v", r, 800/workMeterLeadIn.Seconds())
	}
	for i := 1; i <= 600; i++ {
		m.add(t0.Add(time.Duration(i)*100*time.Millisecond), 10)
	}
	if r := m.rate(t0.Add(60 * time.Second)); math.Abs(r-100) > 5 {
		t.Errorf("steady 100 blocks/s reads %v", r)
	}
}

// A replica's fluid queue drains at its speed; the blocks sent there count
// as its charge until the estimate has computed them.
func TestFluidQueues(t *testing.T) {
	var f fluidQueues
	t0 := time.Unix(100, 0)
	f.add("r0", t0, 100, 50)                           // done at t0+0.5s
	f.add("r0", t0.Add(100*time.Millisecond), 100, 30) // 40 left + 30: done at t0+0.8s
	q, c := f.get("r0", t0.Add(300*time.Millisecond), 100)
	if math.Abs(q-50) > 1e-9 || c != 80 {
		t.Errorf("at 0.3 s: queued %v charge %v, want 50, 80", q, c)
	}
	q, c = f.get("r0", t0.Add(600*time.Millisecond), 100)
	if math.Abs(q-20) > 1e-9 || c != 30 {
		t.Errorf("at 0.6 s: queued %v charge %v, want 20, 30", q, c)
	}
	if q, c = f.get("r0", t0.Add(time.Second), 100); q != 0 || c != 0 {
		t.Errorf("at 1 s: queued %v charge %v, want 0, 0", q, c)
	}
	if q, c = f.get("r1", t0, 100); q != 0 || c != 0 {
		t.Errorf("unknown replica: queued %v charge %v", q, c)
	}
}

// Bursts without a session key: a request whose prompt is not in flight
// starts one, the requests that find it in flight are its siblings.
func TestBurstSizes(t *testing.T) {
	var b burstSizes
	t0 := time.Unix(100, 0)
	if s := b.size(t0); s != 1 {
		t.Fatalf("no bursts: size %v, want 1", s)
	}
	for i := range 3 {
		at := t0.Add(time.Duration(i) * time.Second)
		b.note(at, false)
		for range 7 {
			b.note(at, true)
		}
	}
	if s := b.size(t0.Add(3 * time.Second)); math.Abs(s-8) > 0.05 {
		t.Errorf("three bursts of 8: size %v", s)
	}
}
