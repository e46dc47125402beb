package discovery_test

import (
	"context"
	"fmt"

	"github.com/kvroute/kvroute/pkg/discovery"
)

func ExampleParseReplicas() {
	rs, err := discovery.ParseReplicas([]byte(`
replicas:
  - address: 10.0.0.7:8000
    model: llama
    events_endpoint: tcp://10.0.0.7:5557
    replay_endpoint: tcp://10.0.0.7:5600
    dp_ranks: 2
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	r := rs[0]
	for rank := range r.DPRanks {
		ev, _ := discovery.OffsetEndpoint(r.EventsEndpoint, rank)
		rp, _ := discovery.OffsetEndpoint(r.ReplayEndpoint, rank)
		fmt.Println(r.ID, rank, ev, rp)
	}
	fmt.Println(r.MetricsURL, r.Ready)

	_, err = discovery.ParseReplicas([]byte("replicas:\n  - {address: 'vllm-0:8000', model: llama}\n"))
	fmt.Println(err)
	// Output:
	// 10.0.0.7:8000 0 tcp://10.0.0.7:5557 tcp://10.0.0.7:5600
	// 10.0.0.7:8000 1 tcp://10.0.0.7:5558 tcp://10.0.0.7:5601
	// http://10.0.0.7:8000/metrics true
	// replicas[0].address: "vllm-0:8000" is not ip:port (the host must be an IP address: Envoy's original-destination routing does not resolve names)
}

// A consumer diffs successive snapshots of a source.
func ExampleDiff() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	updates := make(chan discovery.Snapshot)
	src := discovery.Static([]discovery.Replica{
		{Address: "10.0.0.1:8000", Model: "llama", Ready: true},
		{Address: "10.0.0.2:8000", Model: "llama", Ready: true},
	})
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, updates) }()

	var prev []discovery.Replica
	snap := <-updates
	c := discovery.Diff(prev, snap.Replicas)
	for _, r := range c.Added {
		fmt.Println(snap.Source, "added", r.ID)
	}
	cancel()
	fmt.Println(<-done)
	// Output:
	// static added 10.0.0.1:8000
	// static added 10.0.0.2:8000
	// <nil>
}
