// Package fleet owns the replica set and its controller: it turns discovery
// snapshots into what the rest of kvroute acts on, and it is the one place
// that decides when a replica's blocks are dropped from the prefix index.
//
// Two types, one writer:
//
//   - Set is the read side: route.State (the routable replicas, their load
//     and cache credit), route.EventFeeds, block sizes and tokenizer URLs.
//     It is an immutable snapshot behind an atomic pointer, swapped whole;
//     readers (every routing decision) never block.
//   - Controller is the write side. Run(ctx, updates) is its one goroutine:
//     it applies each discovery snapshot (scrape targets, the Set, index
//     entries and fidelity of removed replicas), then on every snapshot and
//     tick keeps the event subscriptions equal to the replicas that have an
//     events endpoint and pass their health probes, and decides readiness.
//     Run returns when ctx ends; it starts no other goroutine.
//
// When blocks are dropped (index.Cleared for every data-parallel rank):
// a replica leaves the discovered set; or its stream leaves the subscribed
// set because the replica failed its health probes (a dead or restarting
// engine's cache is gone or unknowable). A replica that passes its probes
// again is resubscribed and relearned from its replay buffer (credit 0
// until then, decided by the events manager). A replica that is merely not
// Ready leaves the routable set but keeps its stream and index entries; an
// unhealthy one stays listed with Load.Healthy false, so decisions and
// explain show it as ineligible.
//
// Readiness: the Controller turns ready once the first snapshot is applied,
// every replica has been probed once, and every subscribed stream is warm;
// or once WarmTimeout has passed since Run started, whichever comes first.
// It then stays ready until Shutdown. ReadyStatus gives the detail (replicas
// probed, streams caught up, each degraded stream and why) that /readyz
// shows; when the timeout releases readiness, the log names the cold
// streams.
//
// LoRA adapters and lookahead: Models (its own goroutine, Run) reads each
// replica's OpenAI /v1/models and keeps the adapters listed there (entries
// with a parent); the Set gives each routable entry the union of those and
// the spec's lora_adapters (route.Replica.Adapters), and the lookahead its
// event stream reports (route.Replica.Lookahead). The Controller republishes
// the Set on its tick when either changes.
//
// The package drives the events manager, the index, the scraper and a
// readiness sink through small interfaces declared here (Streams, Clearer,
// Prober, Readiness), so that it is tested with fakes and a fake clock. Data
// flows one way: discovery -> fleet -> events/scraper/index; routing reads
// the Set.
package fleet
