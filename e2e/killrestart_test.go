//go:build e2e

package e2e

import (
	"testing"
	"time"
)

// TestKillRestartUnderLoadLosesNothing: an open-loop client sends chats
// through Envoy (a third of them long SSE streams) while kvroute is
// SIGKILLed mid-load and started again. Every request must end as a
// complete 200: those in flight at the kill (in the request or the
// response phase of their ext_proc stream), those sent while kvroute is
// down (fail-open round robin), and those around the restart (kvroute
// answers nothing before its first engine probe; Envoy fails open
// meanwhile). Routing must resume afterwards (decisions counted by the
// new process).
func TestKillRestartUnderLoadLosesNothing(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 3})
	load := startOpenLoad(c, 50*time.Millisecond, 1500)
	stopped := false
	defer func() {
		if !stopped {
			load.Stop(t)
		}
	}()

	// Phase 1: kvroute routes the load.
	waitFor(t, 60*time.Second, "kvroute to route 30 requests", func() bool {
		n, err := decisions(c)
		return err == nil && n >= 30
	})
	// Kill while streamed answers are mid-response.
	waitFor(t, 60*time.Second, "2 streamed answers in flight", func() bool { return load.streaming.Load() >= 2 })
	atKill, streamsAtKill, inflightAtKill := load.started.Load(), load.streaming.Load(), load.inflight.Load()
	killedAt := time.Now()
	c.kv.Proc.Kill()

	// Phase 2: kvroute is down; Envoy's health checker notices and the
	// load keeps flowing on the fallback route.
	c.waitExtProcHealthy(false)
	downFrom := load.finished.Load()
	load.waitFinished(t, downFrom, 40, 90*time.Second, "40 requests served while kvroute is down")
	restartedAt := time.Now()

	// Phase 3: kvroute starts again, Envoy sees it healthy and it routes.
	c.startKVRoute()
	c.waitExtProcHealthy(true)
	waitFor(t, 60*time.Second, "the restarted kvroute to route 30 requests", func() bool {
		n, err := decisions(c)
		return err == nil && n >= 30
	})
	outs := load.Stop(t)
	stopped = true

	var down, streams int
	for _, o := range outs {
		if o.start.After(killedAt) && o.start.Before(restartedAt) {
			down++
		}
		if o.stream {
			streams++
		}
	}
	bad := failures(outs)
	allowed := counter(t, c, "http.inference.ext_proc.failure_mode_allowed")
	if allowed == 0 {
		t.Errorf("Envoy failed open on no ext_proc stream: the kill did not hit the request path")
	}
	t.Logf("kill -9 under load: %d requests (%d streamed); in flight at the kill %d (%d streaming, request #%d); %d sent while kvroute was down; %d not a complete 200; Envoy ext_proc failure_mode_allowed %d, streams_failed %d, upstream retries %d",
		len(outs), streams, inflightAtKill, streamsAtKill, atKill, down, len(bad),
		allowed, counter(t, c, "http.inference.ext_proc.streams_failed"),
		counter(t, c, "cluster.fallback_round_robin.upstream_rq_retry"))
	for i, o := range bad {
		if i == 20 {
			t.Errorf("... and %d more", len(bad)-20)
			break
		}
		t.Errorf("lost: %v", o)
	}
	if int64(len(outs)) != load.started.Load() {
		t.Errorf("%d outcomes for %d started requests", len(outs), load.started.Load())
	}
}
