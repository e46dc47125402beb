//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// An engine that runs out of KV memory preempts, and kvroute sees it: the
// engine's vllm:num_preemptions_total rises, and kvroute's scraper marks
// the replica preempting (kvroute_replica_preempting), the signal that
// keeps its late first tokens from being read as a slower replica. The
// engine holds 96 blocks of 16 tokens; 12 concurrent chats of about 90
// prompt tokens and 200 output tokens each need 18 blocks apiece.
func TestPreemptingReplicaSeen(t *testing.T) {
	c := newCluster(t, clusterOpts{engines: 1, seed: 300, engineArgs: func(int) []string {
		return []string{"--num-gpu-blocks", "96", "--max-model-len", "1024", "--speed", "1"}
	}})
	ctx := t.Context()
	engineMetrics := fmt.Sprintf("http://127.0.0.1:%d/metrics", c.engines[0].Port)
	if p, err := metricSum(ctx, engineMetrics, "vllm:num_preemptions_total", ""); err != nil || p != 0 {
		t.Fatalf("before the load: %v preemptions, %v", p, err)
	}
	if got := kvMetric(t, c, "kvroute_replica_preempting", nil); got != 0 {
		t.Fatalf("kvroute_replica_preempting %v before any preemption", got)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 12)
	for i := range 12 {
		wg.Go(func() {
			prompt := fmt.Sprintf("session %d: %s", i, strings.Repeat("tell me more about block tables ", 12))
			r := c.chat(ctx, []message{{Role: "user", Content: prompt}}, 200, nil)
			if r.err != nil || r.status != 200 {
				errs <- fmt.Errorf("chat %d: %d %v %s", i, r.status, r.err, r.body)
			}
		})
	}
	seen := false
	deadline := time.Now().Add(30 * time.Second)
	for !seen && time.Now().Before(deadline) {
		seen = kvMetric(t, c, "kvroute_replica_preempting", nil) == 1
		time.Sleep(20 * time.Millisecond)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	p, err := metricSum(ctx, engineMetrics, "vllm:num_preemptions_total", "")
	if err != nil || p == 0 {
		t.Fatalf("the engine never preempted (%v, %v): the test tests nothing", p, err)
	}
	if !seen {
		t.Fatalf("the engine preempted %v times; kvroute_replica_preempting never read 1", p)
	}
	t.Logf("engine preemptions: %v", p)
}
